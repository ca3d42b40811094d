package kvevents

import (
	"sync"

	"github.com/duet-router/duet/scheduler/prefix"
)

// Tier is a bit set of the cache tiers that hold a block.
type Tier uint8

// The tiers SGLang names in an event's medium.
const (
	// TierGPU is device memory ("GPU", or no medium).
	TierGPU Tier = 1 << iota
	// TierHost is pinned host memory ("CPU_PINNED": HiCache's second tier).
	TierHost
	// TierDisk is local storage ("DISK").
	TierDisk
	// TierExternal is a shared or remote pool ("EXTERNAL").
	TierExternal
)

// tierOf maps an event's medium to its tier.
func tierOf(medium string) Tier {
	switch medium {
	case "CPU_PINNED", "CPU":
		return TierHost
	case "DISK":
		return TierDisk
	case "EXTERNAL":
		return TierExternal
	}
	return TierGPU
}

// RankView is one (engine, rank)'s prefix cache as its events tell it,
// keyed by duet's own token block hashes (prefix.Hasher.Tokens with the
// pool's block size), so that a request's blocks look it up as they are.
//
// Engines report pages (their page size, a divisor of duet's block size
// where the pool is configured as docs/tokenizer.md says); a duet block
// is held when the page that completes it is. Radix caches evict leaves
// first, so a block's last page goes before its earlier ones, and the rule
// never claims a block whose start was evicted. Events for LoRA adapters
// or cache salts are in namespaces duet's keys do not have yet: they are
// counted and left out. It implements Handler, and is safe for concurrent
// use.
type RankView struct {
	blockTokens int
	// maxPages bounds the pages held; a view that outgrows it starts over.
	maxPages int

	mu sync.RWMutex
	// pages maps an engine page hash to where duet's chain stands after it.
	pages map[uint64]*pageState
	// blocks maps a duet block hash to the tiers that hold it.
	blocks map[uint64]Tier
	// expected maps blocks routed to the rank and not yet reported to
	// the time (Unix nanoseconds) until which they count as held; sweptAt
	// is its size after the last sweep of expired entries.
	expected map[uint64]int64
	sweptAt  int
	// pageTokens is the engine's page size, from its stores; capacity
	// its KV capacity in tokens (0: unknown), so that a view holding far
	// more than the engine can (lost removals) starts over.
	pageTokens, capacity int

	counts ViewCounts
}

// pageState is where duet's block chain stands at the end of one page.
type pageState struct {
	// sum is the duet hash of the last whole block at or before the page's
	// end (prefix.TokenChainSeed before the first).
	sum uint64
	// pending are the page's and earlier pages' tokens after that block.
	pending []int64
	// completes are the duet blocks this page ends.
	completes []uint64
	tiers     Tier
}

// ViewCounts counts what a view did with its events.
type ViewCounts struct {
	// Stored and Removed count pages; Cleared counts AllBlocksCleared and
	// resets.
	Stored, Removed, Cleared uint64
	// Namespaced are stored events left out (LoRA or cache salt); Orphans
	// stores whose parent page the view does not know (it joined late, or
	// missed events); Malformed stores whose tokens do not fill their pages;
	// Overflows times the view outgrew maxPages.
	Namespaced, Orphans, Malformed, Overflows uint64
}

// NewRankView returns an empty view for blocks of blockTokens tokens,
// holding at most maxPages pages.
func NewRankView(blockTokens, maxPages int) *RankView {
	return &RankView{blockTokens: max(blockTokens, 1), maxPages: max(maxPages, 1),
		pages: map[uint64]*pageState{}, blocks: map[uint64]Tier{}, expected: map[uint64]int64{}}
}

// Apply implements Handler.
func (v *RankView) Apply(_ uint64, b Batch) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case BlockStored:
			v.store(e)
		case BlockRemoved:
			v.remove(e)
		case AllBlocksCleared:
			v.clear()
		}
	}
	if len(v.pages) > v.maxPages || v.capacity > 0 && v.pageTokens > 0 && len(v.pages)*v.pageTokens > capacitySlack*v.capacity {
		v.counts.Overflows++
		v.clear()
	}
}

// capacitySlack is how many times the engine's KV capacity a view may hold
// before it starts over: tiers beyond those the capacity counts, and pages
// shared by several chains, stay well within it.
const capacitySlack = 4

// SetCapacity bounds the view by the engine's KV capacity in tokens (its
// GPU pool, and its host tier where known): past capacitySlack times it,
// the view has missed removals and starts over. 0 lifts the bound.
func (v *RankView) SetCapacity(tokens int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.capacity = max(tokens, 0)
}

// Reset implements Handler: the view starts over.
func (v *RankView) Reset(string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.clear()
}

// clear empties the view.
func (v *RankView) clear() {
	clear(v.pages)
	clear(v.blocks)
	clear(v.expected)
	v.sweptAt = 0
	v.counts.Cleared++
}

// store indexes a BlockStored event's pages.
func (v *RankView) store(e *Event) {
	if e.HasLoRA || e.CacheSalt != "" || e.LoRAName != "" {
		v.counts.Namespaced++
		return
	}
	if e.BlockSize <= 0 || len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
		v.counts.Malformed++
		return
	}
	sum, pending := prefix.TokenChainSeed, []int64(nil)
	if e.HasParent {
		parent, ok := v.pages[e.ParentHash]
		if !ok {
			v.counts.Orphans++
			return
		}
		sum, pending = parent.sum, parent.pending
	}
	tier := tierOf(e.Medium)
	v.pageTokens = e.BlockSize
	for j, h := range e.BlockHashes {
		pending = append(pending[:len(pending):len(pending)], e.TokenIDs[j*e.BlockSize:(j+1)*e.BlockSize]...)
		var completes []uint64
		for len(pending) >= v.blockTokens {
			sum = prefix.NextTokenBlock(sum, pending[:v.blockTokens])
			completes = append(completes, sum)
			pending = pending[v.blockTokens:]
		}
		p, ok := v.pages[h]
		if !ok {
			p = &pageState{sum: sum, pending: pending, completes: completes}
			v.pages[h] = p
		}
		p.tiers |= tier
		for _, c := range p.completes {
			v.blocks[c] |= tier
			if tier == TierGPU {
				delete(v.expected, c)
			}
		}
		v.counts.Stored++
	}
}

// remove drops a BlockRemoved event's pages from its tier.
func (v *RankView) remove(e *Event) {
	tier := tierOf(e.Medium)
	for _, h := range e.BlockHashes {
		p, ok := v.pages[h]
		if !ok {
			continue
		}
		v.counts.Removed++
		p.tiers &^= tier
		for _, c := range p.completes {
			if t := v.blocks[c] &^ tier; t == 0 {
				delete(v.blocks, c)
			} else {
				v.blocks[c] = t
			}
		}
		if p.tiers == 0 {
			delete(v.pages, h)
		}
	}
}

// Match returns how many of a request's leading blocks (duet's token
// block hashes, a chain from block 0) the rank holds on its GPU, and in any
// tier. Blocks expected (Expect) and not yet reported count as held on
// the GPU until their deadline; now is the caller's clock in Unix
// nanoseconds.
//
// A radix cache evicts leaves first and HiCache backs up what leaves the
// GPU, so along one chain the held blocks are a leading run, and the GPU's
// a leading run of those: Match finds both ends by binary search, in
// O(log n) lookups for a prompt of n blocks.
func (v *RankView) Match(blocks []uint64, now int64) (gpu, anyTier int) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	anyTier = leadingRun(len(blocks), func(i int) bool { return v.tiersAt(blocks[i], now) != 0 })
	gpu = leadingRun(anyTier, func(i int) bool { return v.tiersAt(blocks[i], now)&TierGPU != 0 })
	return gpu, anyTier
}

// tiersAt returns the tiers holding block b, with TierGPU for a block
// expected until after now. The caller holds mu.
func (v *RankView) tiersAt(b uint64, now int64) Tier {
	t := v.blocks[b]
	if t&TierGPU == 0 {
		if deadline, ok := v.expected[b]; ok && deadline > now {
			t |= TierGPU
		}
	}
	return t
}

// leadingRun returns the length of the run of i in [0, n) from 0 for
// which held is true, assuming held is true on a leading run only.
func leadingRun(n int, held func(i int) bool) int {
	if n == 0 || !held(0) {
		return 0
	}
	lo, hi := 0, n // held(lo); !held(hi) where hi < n
	if held(n - 1) {
		return n
	}
	hi = n - 1
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if held(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo + 1
}

// Expect records that blocks (a chain from block 0) were routed to the
// rank and will be cached once it computes them: until deadline (Unix
// nanoseconds), or until the engine reports them, Match counts them as
// held on the GPU. Engines report a prompt's pages only as its prefill
// runs, so without this a conversation's next turn, sent before the
// previous one's events, would look uncached. Expired entries are swept
// once they outnumber the live ones.
func (v *RankView) Expect(blocks []uint64, deadline, now int64) {
	if len(blocks) == 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	// The blocks the GPU holds are a leading run: only those after it
	// need an entry (a conversation's next turn adds only its new part).
	held := leadingRun(len(blocks), func(i int) bool { return v.blocks[blocks[i]]&TierGPU != 0 })
	for _, b := range blocks[held:] {
		v.expected[b] = deadline
	}
	if len(v.expected) > 2*v.sweptAt+1024 {
		for b, d := range v.expected {
			if d <= now {
				delete(v.expected, b)
			}
		}
		v.sweptAt = len(v.expected)
	}
}

// Blocks returns how many duet blocks the view holds, and Pages how many
// engine pages.
func (v *RankView) Blocks() (blocks, pages int) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.blocks), len(v.pages)
}

// Counts returns the view's counters.
func (v *RankView) Counts() ViewCounts {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.counts
}
