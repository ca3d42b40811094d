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
		pages: map[uint64]*pageState{}, blocks: map[uint64]Tier{}}
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
	if len(v.pages) > v.maxPages {
		v.counts.Overflows++
		v.clear()
	}
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
// block hashes) the rank holds on its GPU, and in any tier.
func (v *RankView) Match(blocks []uint64) (gpu, anyTier int) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	gpuDone := false
	for _, b := range blocks {
		t := v.blocks[b]
		if t == 0 {
			break
		}
		if !gpuDone && t&TierGPU != 0 {
			gpu++
		} else {
			gpuDone = true
		}
		anyTier++
	}
	return gpu, anyTier
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
