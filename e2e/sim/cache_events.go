package sim

import (
	"time"

	"github.com/duet-router/duet/scheduler/kvevents"
)

// This file reports every change of a rank's prefix cache as the KV
// events SGLang publishes (disaggregation/kv_events.py, recorded by
// mem_cache/events.py): BlockStored when blocks enter a tier, BlockRemoved
// when they leave it, AllBlocksCleared when the cache is emptied. Nothing
// is recorded while no sink is set. MODEL.md ("KV events") says what
// matches SGLang and what does not.

// The media SGLang names in its events (StorageMedium).
const (
	// mediumGPU is device memory, the radix cache proper.
	mediumGPU = "GPU"
	// mediumHost is HiCache's host tier.
	mediumHost = "CPU_PINNED"
)

// cacheSink receives, in order, the events of one rank made at model time
// t (Model.OnCacheEvents).
type cacheSink func(t time.Duration, rank int, events []kvevents.Event)

// OnCacheEvents makes the model report every change of a rank's prefix
// cache to fn, as SGLang's KV events: BlockStored when blocks enter the
// GPU cache (or, with HierarchicalCache, the host tier: Medium
// "CPU_PINNED"), BlockRemoved when they leave it, AllBlocksCleared when
// the cache is emptied. fn is called synchronously from the model's calls
// (Advance, Submit, Abort, ...) with the model time, once per rank and
// engine step that changed the cache, the events in the order the engine
// made them; it owns the slice, and must not call back into the model.
// Block hashes are the model's own block keys; TokenIDs are nil for
// blocks whose token ids the model does not know (text prompts). A nil fn
// stops the reports.
func (m *Model) OnCacheEvents(fn func(t time.Duration, rank int, events []kvevents.Event)) {
	m.core.sink = fn
}

// recordStore records that b entered r's medium tier, merged into the
// previous event when it continues that event's chain in the same tier,
// as SGLang's recorder coalesces its events.
func (c *engineCore) recordStore(r *engineRank, b *cacheBlock, medium string) {
	if c.sink == nil {
		return
	}
	if n := len(r.events); n > 0 {
		tail := &r.events[n-1]
		if tail.Kind == kvevents.BlockStored && tail.Medium == medium && b.hasParent &&
			tail.BlockHashes[len(tail.BlockHashes)-1] == b.parent && (tail.TokenIDs == nil) == (b.ids == nil) {
			tail.BlockHashes = append(tail.BlockHashes, b.hash)
			tail.TokenIDs = append(tail.TokenIDs, b.ids...)
			return
		}
	}
	e := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{b.hash}, ParentHash: b.parent,
		HasParent: b.hasParent, BlockSize: c.p.prof.BlockSize, Medium: medium}
	if b.ids != nil {
		e.TokenIDs = append(make([]int64, 0, len(b.ids)), b.ids...)
	}
	r.events = append(r.events, e)
}

// recordRemove records that the block hash left r's medium tier, merged
// into a previous removal from the same tier.
func (c *engineCore) recordRemove(r *engineRank, hash uint64, medium string) {
	if c.sink == nil {
		return
	}
	if n := len(r.events); n > 0 {
		if tail := &r.events[n-1]; tail.Kind == kvevents.BlockRemoved && tail.Medium == medium {
			tail.BlockHashes = append(tail.BlockHashes, hash)
			return
		}
	}
	r.events = append(r.events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{hash}, Medium: medium})
}

// flushEvents hands every rank's recorded events to the sink, at model
// time t: one call per rank that has any.
func (c *engineCore) flushEvents(t time.Duration) {
	if c.sink == nil {
		return
	}
	for _, r := range c.ranks {
		if len(r.events) == 0 {
			continue
		}
		ev := r.events
		r.events = nil
		c.sink(t, r.idx, ev)
	}
}

// evictGPU evicts r's least recently used free block; with a host tier it
// is kept there (SGLang's write-back order: host blocks evicted to make
// room, the block stored in host memory, then removed from the GPU).
// False when no block is free.
func (c *engineCore) evictGPU(r *engineRank) bool {
	b := r.cache.evictLRU()
	if b == nil {
		return false
	}
	if r.host != nil {
		for _, old := range r.host.add(b) {
			c.recordRemove(r, old.hash, mediumHost)
		}
		c.recordStore(r, b, mediumHost)
	}
	c.recordRemove(r, b.hash, mediumGPU)
	return true
}

// resetCache empties every rank's prefix cache (and host tier) at t and
// records AllBlocksCleared: what flush_cache does on an idle rank, and
// what a restarted engine starts with. Blocks held by requests leave the
// cache too: their KV stays with the requests as private KV, so the KV
// accounting is unchanged (blocks shared by several requests are counted
// once per request from then on), and it is cached again, as new blocks,
// when a request inserts it.
func (c *engineCore) resetCache(t time.Duration) {
	bt := c.p.prof.BlockSize
	for _, r := range c.ranks {
		c.forEachRequest(r, func(q *engineRequest) {
			q.private += len(q.chain) * bt
			r.private += len(q.chain) * bt
			q.chain = nil
		})
		r.cache.clear()
		if r.host != nil {
			r.host.clear()
		}
		if c.sink != nil {
			r.events = append(r.events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
		}
		c.unstall(r.group, t)
	}
	c.flushEvents(t)
}

// flushIdle empties the prefix cache of every rank that holds no request
// at t, as SGLang's flush_cache does on each idle scheduler, and reports
// whether rank 0 was flushed (the answer SGLang's HTTP server gives).
func (c *engineCore) flushIdle(t time.Duration) bool {
	ok := false
	for _, r := range c.ranks {
		if len(r.waiting) > 0 || r.active() > 0 {
			continue
		}
		r.cache.clear()
		if r.host != nil {
			r.host.clear()
		}
		if c.sink != nil {
			r.events = append(r.events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
		}
		if r.idx == 0 {
			ok = true
		}
	}
	c.flushEvents(t)
	return ok
}

// forEachRequest calls fn for every request on r that is not done.
func (c *engineCore) forEachRequest(r *engineRank, fn func(q *engineRequest)) {
	for q := range r.live {
		fn(q)
	}
}

// CacheBlocks returns how many blocks rank's prefix cache holds now (its
// GPU tier), pinned or not; 0 for an unknown rank.
func (m *Model) CacheBlocks(rank int) int {
	if rank < 0 || rank >= len(m.core.ranks) {
		return 0
	}
	return len(m.core.ranks[rank].cache.blocks)
}
