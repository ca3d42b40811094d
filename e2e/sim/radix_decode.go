package sim

import (
	"slices"
	"time"
)

// This file is the decode side's radix cache (SGLang's
// --disaggregation-decode-enable-radix-cache) and its host tier
// (--enable-hierarchical-cache on such a decode). Every path here runs
// only when engineParams.decodeRadix is set; MODEL.md describes the model.

// decodeMatch is what a decode rank's cache holds of a prompt: the GPU
// tier's cached blocks (free counts those not pinned) and, after them, the
// host tier's block hashes.
type decodeMatch struct {
	gpu  []*cacheBlock
	free int
	host []uint64
}

// tokens is the matched length in tokens (GPU plus host).
func (m decodeMatch) tokens(bt int) int { return (len(m.gpu) + len(m.host)) * bt }

// matchDecode matches q's prompt blocks against r's cache without pinning
// anything: at most (prompt-1)/block blocks, as admit does (at least the
// last token is always transferred), the GPU tier first, then the host
// tier where the GPU match stops.
func (c *engineCore) matchDecode(r *engineRank, blocks []uint64, prompt int) decodeMatch {
	bt := c.p.prof.BlockSize
	if bt <= 0 {
		return decodeMatch{}
	}
	limit := min((prompt-1)/bt, len(blocks))
	var m decodeMatch
	m.gpu, m.free = r.cache.match(blocks, limit)
	if r.host != nil && len(m.gpu) < limit {
		m.host = r.host.match(blocks[len(m.gpu):limit])
	}
	return m
}

// admitPreallocRadix is admitPrealloc with the decode radix cache: FCFS,
// each request matching the rank's cache first. The rank's cache hit rate
// becomes that of the requests preallocated by this call.
func (c *engineCore) admitPreallocRadix(r *engineRank, t time.Duration) {
	hit, input := 0, 0
	for len(r.waiting) > 0 && r.active() < c.p.maxRunning {
		q := r.waiting[0]
		if !c.preallocRadix(r, q, t) {
			break
		}
		hit += q.decodePrefix
		input += q.prompt
	}
	if input > 0 {
		r.lastHitRate = float64(hit) / float64(input)
	}
}

// preallocRadix preallocates q, the head of r's prealloc queue, if its KV
// fits: the cached prefix is pinned for q's life, host-tier blocks get
// device pages and are loaded back, and only the rest of the prompt (the
// KV the prefill will send) plus the output is allocated or reserved.
// Free cached blocks count as available, as in admit.
func (c *engineCore) preallocRadix(r *engineRank, q *engineRequest, t time.Duration) bool {
	bt := c.p.prof.BlockSize
	m := c.matchDecode(r, q.blocks, q.prompt)
	gpuTok, hostTok := len(m.gpu)*bt, len(m.host)*bt
	need := q.prompt - gpuTok + q.maxNew
	if r.referenced()+r.growth+need+m.free*bt > c.p.capacity {
		return false
	}
	r.waiting = r.waiting[1:]
	for _, b := range m.gpu {
		r.cache.pin(b)
	}
	q.chain = m.gpu
	q.growth = need
	r.growth += need
	c.loadHost(r, q, m.host)
	c.allocate(r, q, q.prompt-gpuTok-hostTok)
	q.decodePrefix = gpuTok + hostTok
	q.cached = q.decodePrefix
	q.hostHit = hostTok
	q.loadDoneAt = t + c.loadTime(hostTok)
	q.state = stTransfer
	q.admittedAt = t
	c.observeStage(q, latDecodeBootstrap, t-q.arrived)
	r.transfer++
	r.prefixQueries += int64(q.prompt)
	r.prefixHits += int64(q.decodePrefix)
	q.signal()
	return true
}

// loadHost moves the host-tier blocks hashes into r's GPU tier, pinned by
// q (they continue its chain), their device pages taken from q's
// reservation. The load-back time is accounted by the caller.
// The blocks enter the GPU tier and leave the host tier (the model keeps a
// block in one tier; SGLang keeps the host copy too).
func (c *engineCore) loadHost(r *engineRank, q *engineRequest, hashes []uint64) {
	bt := c.p.prof.BlockSize
	for _, h := range hashes {
		hb := r.host.remove(h)
		b, created := r.cache.insert(blockKey{hash: h, parent: hb.parent, hasParent: hb.hasParent, ids: hb.ids})
		if created {
			c.recordStore(r, b, mediumGPU)
		}
		q.chain = append(q.chain, b)
	}
	for _, h := range hashes {
		c.recordRemove(r, h, mediumHost)
	}
	take := min(len(hashes)*bt, q.growth)
	q.growth -= take
	r.growth -= take
}

// loadTime is the model time to load tokens of KV from the host tier back
// to the GPU.
func (c *engineCore) loadTime(tokens int) time.Duration {
	if tokens <= 0 || c.p.loadGBps <= 0 {
		return 0
	}
	secs := float64(tokens) * float64(c.p.prof.KVBytesPerToken) / (c.p.loadGBps * 1e9)
	return time.Duration(secs * float64(time.Second))
}

// insertFinished caches a finished decode request's committed KV (its
// prompt and its answer but the last token, whose KV no forward pass
// computed), in whole blocks: the blocks it holds privately move into the
// rank's cache (a block cached meanwhile is shared and the duplicate
// freed, a block in the host tier is dropped from there). The answer's
// blocks continue the prompt's hashes, so a next turn whose prompt carries
// the answer back matches them.
func (c *engineCore) insertFinished(r *engineRank, q *engineRequest) {
	bt := c.p.prof.BlockSize
	if bt <= 0 {
		return
	}
	c.insertBlocks(r, q, c.finishedBlocks(q, (q.prompt+max(q.generated-1, 0))/bt))
	q.cachedBlocks = make([]uint64, len(q.chain))
	for i, b := range q.chain {
		q.cachedBlocks[i] = b.hash
	}
}

// finishedBlocks returns at most n block hashes of q's prompt followed by
// its answer.
func (c *engineCore) finishedBlocks(q *engineRequest, n int) []uint64 {
	all := q.blocks
	if len(all) < n {
		extra, ids := q.tail.answerTokens(answerText(q.seed, q.generated))
		all = append(slices.Clip(all), extra...)
		if q.tail.collect && len(q.ids) == len(q.blocks)*c.p.prof.BlockSize+(q.tail.units/unitTokenUnits) {
			// The answer's stand-in ids continue the prompt's, so that
			// its blocks carry them into the KV events.
			q.ids = append(slices.Clip(q.ids), ids...)
		}
	}
	return all[:min(n, len(all))]
}

// setDecodePrefix tells a prefill request how many prompt tokens its
// decode holds already (decode_prefix_len): its transfer sends only the
// rest. It is ignored on other requests and once the transfer started.
func (c *engineCore) setDecodePrefix(q *engineRequest, tokens int) {
	if q.kind != kindPrefill || q.state == stTransfer || q.state == stDone {
		return
	}
	q.decodePrefix = max(0, min(tokens, q.prompt-1))
	q.prefixSet = true
}
