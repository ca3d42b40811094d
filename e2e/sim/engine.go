package sim

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/duet-router/duet/scheduler/kvevents"
)

// This file is the calibrated engine model (--profile): a deterministic,
// discrete-event model of SGLang's per-rank continuous-batching scheduler.
// It has no goroutines and no clock: engineLoop (engine_loop.go) drives it
// in (scaled) real time, and tests drive it directly. MODEL.md documents
// the formulas and what is simplified.

// reqKind is what an engine request does on its server.
type reqKind int

const (
	// kindUnified: aggregated serving, prefill then decode on one rank.
	kindUnified reqKind = iota
	// kindPrefill: PD prefill leg: prefill, one token, then KV transfer.
	kindPrefill
	// kindDecode: PD decode leg: preallocate KV, wait for it, decode.
	kindDecode
)

// reqState is where an engine request is.
type reqState int

const (
	// stBootstrap: PD prefill: in the rank's bootstrap queue, waiting for
	// its decode to preallocate the KV and send the transfer metadata;
	// not schedulable yet.
	stBootstrap reqState = iota
	// stWaiting: in the rank's waiting queue (decode: the prealloc queue).
	stWaiting
	// stPrefill: admitted, prompt being computed (chunked prefill).
	stPrefill
	// stRunning: in the decode batch, one token per decode step.
	stRunning
	// stTransfer: prefill: KV being sent; decode: KV preallocated,
	// waiting for the transfer.
	stTransfer
	// stReady: decode: KV arrived; joins the batch at the next step.
	stReady
	// stDone: finished or aborted; holds nothing.
	stDone
)

// engineRequest is one item inside the engine. Fields are guarded by the
// owner of the engineCore (engineLoop's mutex).
type engineRequest struct {
	id     uint64
	kind   reqKind
	rank   int
	prompt int
	blocks []uint64
	// ids are the prompt's token ids when known (token-id prompts), else
	// nil: the cache blocks carry them into the KV events.
	ids     []int64
	maxNew  int
	arrived time.Duration
	// priority is the request's effective priority (priority scheduling
	// only; see priorityOrder).
	priority int64

	state     reqState
	aborted   bool
	cached    int // prompt tokens found in the prefix cache
	computed  int // prompt tokens in KV (cached + computed)
	generated int
	private   int // KV tokens held outside the prefix cache
	growth    int // KV tokens reserved but not yet allocated
	chain     []*cacheBlock
	readyAt   time.Duration

	// tail and seed give the answer's cache blocks (decode radix cache).
	tail HashTail
	seed *int64
	// decodePrefix is, on a decode with the radix cache, the tokens
	// matched in its cache at preallocation (GPU and host tiers); on a
	// prefill, the decode's match as the decode told it (prefixSet).
	decodePrefix int
	prefixSet    bool
	// hostHit is the host-tier part of a decode's decodePrefix, loaded
	// back to the GPU until loadDoneAt.
	hostHit    int
	loadDoneAt time.Duration
	// sent is, on a prefill, the tokens whose KV was transferred.
	sent int
	// cachedBlocks are the block hashes a decode with the radix cache
	// left in its cache when it finished (prompt and answer).
	cachedBlocks []uint64

	admittedAt   time.Duration
	firstTokenAt time.Duration
	doneAt       time.Duration
	// kvAt is when a decode's KV arrived (kvArrived).
	kvAt time.Duration

	// notify receives a signal (never blocking) on every change a waiter
	// may care about.
	notify chan struct{}
	// onSignal, if set, is called with every signal (Model's change list).
	onSignal func()
}

// signal wakes the request's waiter.
func (q *engineRequest) signal() {
	if q.onSignal != nil {
		q.onSignal()
	}
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// prefillChunk is a request's share of a prefill step.
type prefillChunk struct {
	req    *engineRequest
	tokens int // new tokens computed in this step
	before int // tokens already in KV (cached prefix and earlier chunks)
}

// rankStep is what a rank does during its group's current step.
type rankStep struct {
	prefill []prefillChunk
	decode  []*engineRequest
	dur     time.Duration
}

// engineRank is one DP rank: queues, KV pool and prefix cache.
type engineRank struct {
	idx   int
	group *stepGroup

	// bootstrap is a PD prefill's bootstrap queue (SGLang's
	// PrefillBootstrapQueue): requests whose decode has not preallocated
	// yet. They are not in waiting, so admission never sees them.
	bootstrap  []*engineRequest
	waiting    []*engineRequest
	prefilling []*engineRequest
	running    []*engineRequest
	ready      []*engineRequest
	transfer   int

	cache *prefixCache
	// host is the decode radix cache's host tier (nil without it).
	host *hostCache
	// live holds the rank's requests that are not done.
	live map[*engineRequest]struct{}
	// events are the cache events recorded and not yet handed to the
	// sink (only while one is set).
	events  []kvevents.Event
	private int
	growth  int
	plan    rankStep

	// Statistics.
	lastHitRate   float64
	prefixQueries int64
	prefixHits    int64
	promptTotal   int64
	genTotal      int64
	tput          [throughputWindow + 1]tokenBucket
	lastXferMS    float64
	lastXferGBps  float64
}

// stepGroup is a set of ranks that step together: all ranks under DP
// attention (lockstep), one rank otherwise. A step lasts as long as its
// slowest rank's batch.
type stepGroup struct {
	ranks []*engineRank
	busy  bool
	// lastEnd is when the group's last step ended.
	lastEnd time.Duration
	// wakeAt is, for an idle group, when to try to start a step: the
	// earliest arrival, KV arrival or freed KV not yet looked at; never
	// (never) when the group waits for such a change.
	wakeAt time.Duration
	// steps and balance accumulate the TRT-LLM balance ratio of the
	// group's steps (mean rank time / slowest rank time).
	steps   int64
	balance float64
}

// never is the time of what does not happen.
const never = time.Duration(math.MaxInt64)

// engineEvent is a timed completion.
type engineEvent struct {
	at    time.Duration
	seq   uint64
	group *stepGroup     // step end
	req   *engineRequest // prefill KV transfer end
}

// eventHeap orders events by time, then by creation.
type eventHeap []engineEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(engineEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// engineParams are the resolved model parameters of a server.
type engineParams struct {
	prof       Profile
	mode       Mode
	dpSize     int
	lockstep   bool
	capacity   int // KV tokens per rank
	maxRunning int
	chunk      int
	gbps       float64
	// decodeRadix: a decode server with the decode radix cache
	// (--disaggregation-decode-enable-radix-cache).
	decodeRadix bool
	// hostBlocks > 0 gives each rank a host tier of that many blocks
	// (--enable-hierarchical-cache), loaded back at loadGBps.
	hostBlocks int
	loadGBps   float64
	// order is the waiting queues' order (priority scheduling).
	order priorityOrder
}

// engineCore is the model of one server's DP ranks.
type engineCore struct {
	p      engineParams
	ranks  []*engineRank
	groups []*stepGroup
	now    time.Duration
	events eventHeap
	seq    uint64
	// sink receives the cache events (nil: none are recorded).
	sink cacheSink
	// stages receives the requests' stage latencies (nil: none).
	stages stageSink
}

// newEngineCore builds the model with empty ranks at time 0.
func newEngineCore(p engineParams) *engineCore {
	c := &engineCore{p: p}
	for i := 0; i < p.dpSize; i++ {
		r := &engineRank{idx: i, cache: newPrefixCache(p.prof.BlockSize), live: make(map[*engineRequest]struct{})}
		if p.decodeRadix && p.hostBlocks > 0 {
			r.host = newHostCache(p.hostBlocks)
		}
		c.ranks = append(c.ranks, r)
	}
	if p.lockstep {
		g := &stepGroup{ranks: c.ranks, wakeAt: never}
		c.groups = []*stepGroup{g}
		for _, r := range c.ranks {
			r.group = g
		}
	} else {
		for _, r := range c.ranks {
			g := &stepGroup{ranks: []*engineRank{r}, wakeAt: never}
			r.group = g
			c.groups = append(c.groups, g)
		}
	}
	return c
}

// requestSpec describes a request to submit.
type requestSpec struct {
	kind   reqKind
	rank   int
	prompt int
	blocks []uint64
	// ids are the prompt's token ids, nil when unknown.
	ids    []int64
	maxNew int
	// tail and seed give the answer's blocks (decode radix cache).
	tail HashTail
	seed *int64
	// priority is the effective priority (priorityOrder.effective).
	priority int64
	// bootstrap puts a prefill request in its rank's bootstrap queue
	// until bootstrapped is called (its decode preallocated); otherwise
	// it enters the waiting queue at once.
	bootstrap bool
}

// submit queues a request on its rank at time t. A prompt that can never
// fit the rank's KV pool is rejected; max_new_tokens is clipped so that
// prompt plus output fit, as SGLang clips it to the pool.
func (c *engineCore) submit(spec requestSpec, t time.Duration) (*engineRequest, error) {
	if spec.rank < 0 || spec.rank >= len(c.ranks) {
		return nil, fmt.Errorf("rank %d out of range", spec.rank)
	}
	if spec.prompt >= c.p.capacity {
		return nil, badRequestf("The input (%d tokens) is longer than the KV cache capacity of a rank (max_total_num_tokens=%d).",
			spec.prompt, c.p.capacity)
	}
	c.seq++
	q := &engineRequest{
		id: c.seq, kind: spec.kind, rank: spec.rank, prompt: spec.prompt, blocks: spec.blocks, ids: spec.ids,
		maxNew: min(spec.maxNew, c.p.capacity-spec.prompt), arrived: t, notify: make(chan struct{}, 1),
		tail: spec.tail, seed: spec.seed, priority: spec.priority,
	}
	if q.kind == kindPrefill {
		q.maxNew = 1
	}
	r := c.ranks[spec.rank]
	r.live[q] = struct{}{}
	r.promptTotal += int64(q.prompt)
	if q.kind == kindPrefill && spec.bootstrap {
		q.state = stBootstrap
		r.bootstrap = append(r.bootstrap, q)
		return q, nil
	}
	q.state = stWaiting
	c.enqueue(r, q)
	c.unstall(r.group, t)
	if c.p.mode == ModeDecode {
		c.admitPrealloc(r, t)
	}
	c.flushEvents(t)
	return q, nil
}

// kvArrived moves a decode request whose KV arrived to the ready list; it
// joins the decode batch at its group's first step once it is ready: at
// t, or when its host-tier blocks are loaded back if that is later. The
// ready list stays sorted by readiness.
func (c *engineCore) kvArrived(q *engineRequest, t time.Duration) {
	if q.state != stTransfer {
		return
	}
	r := c.ranks[q.rank]
	r.transfer--
	q.state = stReady
	q.kvAt = t
	c.observeStage(q, latDecodeTransferred, t-q.admittedAt)
	q.readyAt = max(t, q.loadDoneAt)
	i := len(r.ready)
	for i > 0 && r.ready[i-1].readyAt > q.readyAt {
		i--
	}
	r.ready = slices.Insert(r.ready, i, q)
	c.unstall(r.group, t)
}

// abort removes a request wherever it is and frees what it holds (client
// disconnect, KV wait failure).
func (c *engineCore) abort(q *engineRequest, t time.Duration) {
	r := c.ranks[q.rank]
	switch q.state {
	case stDone:
		return
	case stBootstrap:
		r.bootstrap = remove(r.bootstrap, q)
	case stWaiting:
		r.waiting = remove(r.waiting, q)
	case stPrefill:
		r.prefilling = remove(r.prefilling, q)
	case stRunning:
		r.running = remove(r.running, q)
	case stReady:
		r.ready = remove(r.ready, q)
	case stTransfer:
		r.transfer--
	}
	q.aborted = true
	c.finish(r, q, t)
	c.flushEvents(t)
}

// remove deletes q from list, keeping the order.
func remove(list []*engineRequest, q *engineRequest) []*engineRequest {
	if i := slices.Index(list, q); i >= 0 {
		return slices.Delete(list, i, i+1)
	}
	return list
}

// unstall tells an idle group that something changed at t (a request or
// its KV arrived, KV was freed), so it tries to start a step then.
func (c *engineCore) unstall(g *stepGroup, t time.Duration) {
	if !g.busy {
		g.wakeAt = min(g.wakeAt, max(t, g.lastEnd))
	}
}

// referenced is the KV a rank cannot evict: pinned cache blocks plus the
// requests' private tokens (SGLang's num_used_tokens).
func (r *engineRank) referenced() int {
	return r.cache.tokens() - r.cache.evictable() + r.private
}

// active counts the requests holding a request slot on a rank.
func (r *engineRank) active() int {
	return len(r.prefilling) + len(r.running) + len(r.ready) + r.transfer
}

// admit tries to admit the head request of a rank's waiting queue for
// prefill: the prefix cache is matched (at most prompt-1 tokens, SGLang
// always computes the last token), and the request is admitted only if
// its new prompt tokens plus its whole output fit the KV pool next to
// what the admitted requests hold or have reserved.
func (c *engineCore) admit(r *engineRank, q *engineRequest, t time.Duration) bool {
	bt := c.p.prof.BlockSize
	limit := 0
	if bt > 0 {
		limit = (q.prompt - 1) / bt
	}
	matched, free := r.cache.match(q.blocks, limit)
	cached := len(matched) * bt
	out := 0
	if q.kind == kindUnified {
		out = q.maxNew
	}
	need := q.prompt - cached + out
	if r.referenced()+r.growth+need+free*bt > c.p.capacity {
		return false
	}
	for _, b := range matched {
		r.cache.pin(b)
	}
	q.chain = matched
	q.cached, q.computed = cached, cached
	q.growth = need
	r.growth += need
	q.admittedAt = t
	r.prefixQueries += int64(q.prompt)
	r.prefixHits += int64(cached)
	return true
}

// admitPrealloc preallocates KV for queued decode requests, first come
// first served: the whole prompt (the KV the prefill will send) and a
// reservation for the output. With the decode radix cache the cached
// prefix is matched and pinned instead (preallocRadix).
func (c *engineCore) admitPrealloc(r *engineRank, t time.Duration) {
	if c.p.decodeRadix {
		c.admitPreallocRadix(r, t)
		return
	}
	for len(r.waiting) > 0 {
		q := r.waiting[0]
		need := q.prompt + q.maxNew
		if r.active() >= c.p.maxRunning || r.referenced()+r.growth+need > c.p.capacity {
			return
		}
		r.waiting = r.waiting[1:]
		q.growth = need
		r.growth += need
		c.allocate(r, q, q.prompt)
		q.state = stTransfer
		q.admittedAt = t
		c.observeStage(q, latDecodeBootstrap, t-q.arrived)
		r.transfer++
		q.signal()
	}
}

// allocate turns n reserved tokens of q into KV, evicting free cache
// blocks (least recently used first) when the pool is full.
func (c *engineCore) allocate(r *engineRank, q *engineRequest, n int) {
	take := min(n, q.growth)
	q.growth -= take
	r.growth -= take
	q.private += n
	r.private += n
	for r.cache.tokens()+r.private > c.p.capacity {
		if !c.evictGPU(r) {
			break
		}
	}
}

// release frees everything q holds on r.
func (c *engineCore) release(r *engineRank, q *engineRequest) {
	r.private -= q.private
	q.private = 0
	r.growth -= q.growth
	q.growth = 0
	r.cache.release(q.chain)
	q.chain = nil
}

// finish ends q at t: frees its KV, wakes its waiter and lets its group
// (and, on decode, the prealloc queue) use the freed KV.
func (c *engineCore) finish(r *engineRank, q *engineRequest, t time.Duration) {
	q.state = stDone
	q.doneAt = t
	delete(r.live, q)
	if c.p.decodeRadix && q.kind == kindDecode && !q.aborted {
		c.insertFinished(r, q)
	}
	c.release(r, q)
	q.signal()
	c.unstall(r.group, t)
	if c.p.mode == ModeDecode {
		c.admitPrealloc(r, t)
	}
}

// insertPrompt caches q's full prompt blocks after its prefill: the
// blocks it computed move from its private KV into the prefix cache
// (an identical block cached meanwhile by another request is shared and
// the duplicate freed).
func (c *engineCore) insertPrompt(r *engineRank, q *engineRequest) {
	c.insertBlocks(r, q, q.blocks)
}

// insertBlocks moves q's private KV into r's cache as the blocks of hashes
// beyond those q's chain already holds, one block while q holds a block's
// worth: a block cached meanwhile is shared and the duplicate freed, and a
// block in the host tier (a decode's hierarchical cache) is dropped from
// there. The prompt's blocks carry q's token ids, when it has them.
func (c *engineCore) insertBlocks(r *engineRank, q *engineRequest, hashes []uint64) {
	bt := c.p.prof.BlockSize
	var fromHost []uint64
	for i := len(q.chain); i < len(hashes) && q.private >= bt; i++ {
		b, created := r.cache.insert(chainKey(hashes, q.ids, i, bt))
		if created {
			c.recordStore(r, b, mediumGPU)
			if r.host != nil && r.host.remove(b.hash) != nil && c.sink != nil {
				fromHost = append(fromHost, b.hash)
			}
		}
		q.chain = append(q.chain, b)
		q.private -= bt
		r.private -= bt
	}
	for _, h := range fromHost {
		c.recordRemove(r, h, mediumHost)
	}
}

// addGen accounts n generated tokens on r at t.
func (r *engineRank) addGen(t time.Duration, n int) {
	r.genTotal += int64(n)
	sec := int64(t / time.Second)
	b := &r.tput[sec%int64(len(r.tput))]
	if b.sec != sec {
		*b = tokenBucket{sec: sec}
	}
	b.n += n
}

// throughput is the generated tokens per model second over the last
// complete seconds of the window.
func (r *engineRank) throughput(now time.Duration) float64 {
	sec := int64(now / time.Second)
	n := 0
	for _, b := range r.tput {
		if b.sec < sec && b.sec >= sec-throughputWindow {
			n += b.n
		}
	}
	return float64(n) / throughputWindow
}

// planRank builds a rank's batch for a step starting at t and reports
// whether it has work. Prefill has priority (SGLang runs a prefill batch
// whenever one can be formed): chunks of the requests being prefilled,
// then newly admitted requests, within the per-step token budget. Else a
// decode step: requests whose KV arrived join (their first token, made by
// the prefill, is emitted now) and every running request gets one token.
// KV for the step is allocated now, as SGLang does when it builds a batch.
func (c *engineCore) planRank(r *engineRank, t time.Duration) bool {
	r.plan = rankStep{}
	if c.p.mode != ModeDecode {
		budget := c.p.chunk
		var chunks []prefillChunk
		for _, q := range r.prefilling {
			if budget <= 0 {
				break
			}
			take := min(budget, q.prompt-q.computed)
			if take <= 0 {
				continue
			}
			c.allocate(r, q, take)
			chunks = append(chunks, prefillChunk{req: q, tokens: take, before: q.computed})
			budget -= take
		}
		hit, input := 0, 0
		for budget > 0 {
			i := c.nextWaiting(r, t)
			if i < 0 {
				break
			}
			q := r.waiting[i]
			if r.active() >= c.p.maxRunning || !c.admit(r, q, t) {
				break
			}
			r.waiting = dequeue(r.waiting, i)
			q.state = stPrefill
			c.observeStage(q, latPrefillWaiting, t-q.arrived)
			r.prefilling = append(r.prefilling, q)
			hit += q.cached
			input += q.prompt
			take := min(budget, q.prompt-q.computed)
			c.allocate(r, q, take)
			chunks = append(chunks, prefillChunk{req: q, tokens: take, before: q.computed})
			budget -= take
		}
		if input > 0 {
			// SGLang's cache_hit_rate gauge: hit / (new + hit) tokens of
			// the requests admitted by the last prefill batch.
			r.lastHitRate = float64(hit) / float64(input)
		}
		if len(chunks) > 0 {
			r.plan.prefill = chunks
			r.plan.dur = c.p.prof.prefillStepTime(chunks)
			return true
		}
	}
	for len(r.ready) > 0 && r.ready[0].readyAt <= t {
		q := r.ready[0]
		r.ready = r.ready[1:]
		c.startDecoding(r, q, t)
	}
	if len(r.running) == 0 {
		return false
	}
	ctx := 0
	for _, q := range r.running {
		ctx += q.prompt + q.generated
		c.allocate(r, q, 1)
	}
	r.plan.decode = slices.Clone(r.running)
	r.plan.dur = c.p.prof.decodeStepTime(len(r.running), ctx)
	return true
}

// startDecoding puts q, whose prompt is in KV, into the decode batch with
// its first token (computed by the prefill forward pass) emitted at t.
func (c *engineCore) startDecoding(r *engineRank, q *engineRequest, t time.Duration) {
	if q.kind == kindDecode {
		c.observeStage(q, latDecodeWaiting, t-q.kvAt)
	}
	if q.maxNew <= 0 {
		c.finish(r, q, t)
		return
	}
	if q.kind == kindUnified {
		c.allocate(r, q, 1)
	}
	q.generated = 1
	q.firstTokenAt = t
	r.addGen(t, 1)
	q.state = stRunning
	q.signal()
	if q.generated >= q.maxNew {
		c.finish(r, q, t)
		return
	}
	r.running = append(r.running, q)
}

// startGroup starts g's next step at t if any of its ranks has work; the
// step lasts as long as the slowest rank's batch (lockstep), idle ranks
// running an empty batch. Without work the group waits for the next
// queued arrival after t, or for a change (unstall).
func (c *engineCore) startGroup(g *stepGroup, t time.Duration) bool {
	var dur, sum time.Duration
	work := false
	for _, r := range g.ranks {
		if c.planRank(r, t) {
			work = true
		}
		dur = max(dur, r.plan.dur)
		sum += r.plan.dur
	}
	g.wakeAt = never
	if !work {
		for _, r := range g.ranks {
			if at, ok := c.nextArrival(r, t); ok {
				g.wakeAt = min(g.wakeAt, at)
			}
			if len(r.ready) > 0 {
				g.wakeAt = min(g.wakeAt, r.ready[0].readyAt)
			}
		}
		return false
	}
	g.busy = true
	if dur > 0 {
		g.steps++
		g.balance += float64(sum) / float64(len(g.ranks)) / float64(dur)
	}
	c.seq++
	heap.Push(&c.events, engineEvent{at: t + dur, seq: c.seq, group: g})
	return true
}

// completeGroup applies the effects of g's step, which ended at t, and
// starts its next step.
func (c *engineCore) completeGroup(g *stepGroup, t time.Duration) {
	g.busy = false
	g.lastEnd = t
	g.wakeAt = never
	for _, r := range g.ranks {
		plan := r.plan
		r.plan = rankStep{}
		for _, ch := range plan.prefill {
			q := ch.req
			if q.state != stPrefill {
				continue // aborted during the step
			}
			q.computed += ch.tokens
			if q.computed >= q.prompt {
				c.endPrefill(r, q, t)
			}
		}
		for _, q := range plan.decode {
			if q.state != stRunning {
				continue
			}
			q.generated++
			r.addGen(t, 1)
			q.signal()
			if q.generated >= q.maxNew {
				r.running = remove(r.running, q)
				c.finish(r, q, t)
			}
		}
	}
	c.startGroup(g, t)
}

// endPrefill handles a request whose prompt is fully in KV at t.
func (c *engineCore) endPrefill(r *engineRank, q *engineRequest, t time.Duration) {
	r.prefilling = remove(r.prefilling, q)
	c.observeStage(q, latPrefillForward, t-q.admittedAt)
	c.insertPrompt(r, q)
	if q.kind == kindPrefill {
		// The prefill leg's one token is made now; the KV then goes to
		// the decode server while the prefill keeps it (SGLang's inflight
		// queue).
		q.generated = 1
		q.firstTokenAt = t
		r.addGen(t, 1)
		q.state = stTransfer
		r.transfer++
		// Only the KV beyond the decode's cached prefix is sent (the
		// whole prompt when the decode has none or did not tell it).
		q.sent = q.prompt - q.decodePrefix
		d := c.p.prof.transferTime(q.sent, c.p.gbps)
		r.lastXferMS = float64(d) / float64(time.Millisecond)
		if d > 0 {
			r.lastXferGBps = float64(q.sent) * float64(c.p.prof.KVBytesPerToken) / 1e9 / d.Seconds()
		}
		c.seq++
		heap.Push(&c.events, engineEvent{at: t + d, seq: c.seq, req: q})
		q.signal()
		return
	}
	c.startDecoding(r, q, t)
}

// handle processes one event.
func (c *engineCore) handle(e engineEvent) {
	if e.group != nil {
		c.completeGroup(e.group, e.at)
		return
	}
	q := e.req
	if q.state != stTransfer {
		return // aborted
	}
	r := c.ranks[q.rank]
	r.transfer--
	c.observeStage(q, latPrefillTransfer, e.at-q.firstTokenAt)
	c.finish(r, q, e.at)
}

// nextStart returns the earliest time an idle group wants to try to
// start a step, and the group.
func (c *engineCore) nextStart() (time.Duration, *stepGroup) {
	best := never
	var bg *stepGroup
	for _, g := range c.groups {
		if !g.busy && g.wakeAt < best {
			best, bg = g.wakeAt, g
		}
	}
	return best, bg
}

// advance processes, in time order, every step end, transfer end and step
// start due at or before now, and moves the model's time to now.
func (c *engineCore) advance(now time.Duration) {
	for {
		te := never
		if len(c.events) > 0 {
			te = c.events[0].at
		}
		ts, g := c.nextStart()
		switch {
		case len(c.events) > 0 && te <= ts && te <= now:
			e := heap.Pop(&c.events).(engineEvent)
			c.now = max(c.now, e.at)
			c.handle(e)
			c.flushEvents(c.now)
		case g != nil && ts <= now:
			c.now = max(c.now, ts)
			c.startGroup(g, ts)
			c.flushEvents(c.now)
		default:
			if now != never {
				c.now = max(c.now, now)
			}
			return
		}
	}
}

// nextEvent is the time of the next thing the model will do on its own.
func (c *engineCore) nextEvent() (time.Duration, bool) {
	t := never
	if len(c.events) > 0 {
		t = c.events[0].at
	}
	if ts, g := c.nextStart(); g != nil {
		t = min(t, ts)
	}
	return t, t != never
}

// runUntilIdle advances until nothing is left to do (tests).
func (c *engineCore) runUntilIdle() { c.advance(never) }

// rankSnapshot of rank i at model time now.
func (c *engineCore) snapshot(now time.Duration) []rankSnapshot {
	out := make([]rankSnapshot, len(c.ranks))
	for i, r := range c.ranks {
		used := r.referenced()
		// SGLang's num_total_tokens counts the prompts of every queue,
		// the bootstrap queue included.
		pending := 0
		for _, q := range r.waiting {
			pending += q.prompt
		}
		for _, q := range r.bootstrap {
			pending += q.prompt
		}
		out[i] = rankSnapshot{
			dpRank:        i,
			running:       len(r.prefilling) + len(r.running) + len(r.ready),
			waiting:       len(r.waiting),
			bootstrap:     len(r.bootstrap),
			transfer:      r.transfer,
			usedTokens:    used,
			totalTokens:   used + pending,
			genThroughput: r.throughput(now),
			cacheHitRate:  r.lastHitRate,
			prefixQueries: r.prefixQueries,
			prefixHits:    r.prefixHits,
			promptTotal:   r.promptTotal,
			genTotal:      r.genTotal,
			xferMS:        r.lastXferMS,
			xferGBps:      r.lastXferGBps,
		}
	}
	return out
}

// balanceRatio is the mean balance ratio (mean rank step time / slowest
// rank step time) over the steps of every group so far; 1 is perfect.
func (c *engineCore) balanceRatio() float64 {
	var steps int64
	var sum float64
	for _, g := range c.groups {
		steps += g.steps
		sum += g.balance
	}
	if steps == 0 {
		return 1
	}
	return sum / float64(steps)
}
