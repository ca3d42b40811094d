package prefix

import (
	"math"
	"sync"
)

// DefaultMaxBlocksPerTarget is the per-target bound [NewIndex] uses when
// given a bound <= 0: 65536 blocks, about a million tokens with 16-token
// blocks.
const DefaultMaxBlocksPerTarget = 65536

// maxBound keeps entry indices within int32.
const maxBound = math.MaxInt32 - 1

// maxSpareNodes bounds how many emptied nodes an Index keeps for reuse, and
// maxSpareHolders how large a holder slice may be to be kept with one.
const (
	maxSpareNodes   = 4096
	maxSpareHolders = 64
)

// Index maps block hashes to the targets that (probably) cache them.
// K is the target key type. Safe for concurrent use: [Index.Match] takes a
// read lock, [Index.Insert] and [Index.Remove] the write lock.
//
// Every target keeps at most a fixed number of blocks, evicting its least
// recently used ones beyond that, so memory is O(targets × bound). Create
// one with [NewIndex]; the zero value is not usable.
type Index[K comparable] struct {
	mu    sync.RWMutex
	bound int

	byKey   map[K]*target[K]
	targets []*target[K] // by slot; nil for a free slot
	keys    []K          // by slot, dense copy of targets[slot].key for Match
	free    []int32      // free slots

	nodes map[uint64]*node
	spare []*node // emptied nodes kept for reuse

	scratch sync.Pool // *matchScratch[K]
}

// node lists the targets that hold one block hash. It exists only while
// that list is non-empty.
type node struct {
	holders []holder
}

// holder names one target's entry for a block: the target's slot and the
// entry's index in that target's slab.
type holder struct {
	slot, entry int32
}

// NewIndex returns an empty index in which each target holds at most
// maxBlocksPerTarget blocks (DefaultMaxBlocksPerTarget when <= 0).
func NewIndex[K comparable](maxBlocksPerTarget int) *Index[K] {
	if maxBlocksPerTarget <= 0 {
		maxBlocksPerTarget = DefaultMaxBlocksPerTarget
	}
	return &Index[K]{
		bound: min(maxBlocksPerTarget, maxBound),
		byKey: make(map[K]*target[K]),
		nodes: make(map[uint64]*node),
	}
}

// Insert records that key now caches blocks, all of them, and marks them as
// its most recently used. Beyond the bound, the target's least recently
// used blocks are evicted; when blocks alone exceed the bound only its
// leading bound blocks are recorded.
//
// blocks must be a chain from block 0 as returned by [Hasher], or a leading
// part of one. Insert touches them from last to first, so a block is always
// more recently used than its descendants and eviction trims chains from
// their tails: what a target holds stays closed under prefixes, which
// [Index.Match] relies on.
func (x *Index[K]) Insert(key K, blocks []uint64) {
	if len(blocks) == 0 {
		return
	}
	if len(blocks) > x.bound {
		blocks = blocks[:x.bound]
	}

	x.mu.Lock()
	defer x.mu.Unlock()

	t := x.targetFor(key)
	for i := len(blocks) - 1; i >= 0; i-- {
		h := blocks[i]
		if e, ok := t.byHash[h]; ok {
			t.touch(e)
			continue
		}
		if t.len() >= x.bound {
			x.evict(t, t.oldest())
		}
		e := t.add(h)
		nd := x.nodes[h]
		if nd == nil {
			nd = x.newNode()
			x.nodes[h] = nd
		}
		t.entries[e].pos = int32(len(nd.holders))
		nd.holders = append(nd.holders, holder{slot: t.slot, entry: e})
	}
}

// Remove forgets key and every block it holds, as when its endpoint goes
// away. Removing an unknown key does nothing.
func (x *Index[K]) Remove(key K) {
	x.mu.Lock()
	defer x.mu.Unlock()

	t := x.byKey[key]
	if t == nil {
		return
	}
	for e := t.entries[0].next; e != 0; e = t.entries[e].next {
		x.unhold(t.entries[e].hash, t.entries[e].pos)
	}
	delete(x.byKey, key)
	x.targets[t.slot] = nil
	var zero K
	x.keys[t.slot] = zero
	x.free = append(x.free, t.slot)
}

// Blocks returns the number of blocks held for key (0 when unknown).
func (x *Index[K]) Blocks(key K) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if t := x.byKey[key]; t != nil {
		return t.len()
	}
	return 0
}

// Targets returns the number of targets the index holds blocks for.
func (x *Index[K]) Targets() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byKey)
}

// targetFor returns key's target, creating it in a free slot if needed.
// The caller holds the write lock.
func (x *Index[K]) targetFor(key K) *target[K] {
	if t := x.byKey[key]; t != nil {
		return t
	}
	var slot int32
	if n := len(x.free); n > 0 {
		slot = x.free[n-1]
		x.free = x.free[:n-1]
	} else {
		slot = int32(len(x.targets))
		x.targets = append(x.targets, nil)
		var zero K
		x.keys = append(x.keys, zero)
	}
	t := newTarget(key, slot)
	x.byKey[key] = t
	x.targets[slot] = t
	x.keys[slot] = key
	return t
}

// evict drops entry e of t from both t and the block's node.
func (x *Index[K]) evict(t *target[K], e int32) {
	x.unhold(t.entries[e].hash, t.entries[e].pos)
	t.drop(e)
}

// unhold deletes holder record pos from the node of hash, moving the last
// record into its place, and deletes the node once it is empty.
func (x *Index[K]) unhold(hash uint64, pos int32) {
	nd := x.nodes[hash]
	last := int32(len(nd.holders) - 1)
	if pos != last {
		moved := nd.holders[last]
		nd.holders[pos] = moved
		x.targets[moved.slot].entries[moved.entry].pos = pos
	}
	nd.holders = nd.holders[:last]
	if last == 0 {
		delete(x.nodes, hash)
		x.recycle(nd)
	}
}

func (x *Index[K]) newNode() *node {
	if n := len(x.spare); n > 0 {
		nd := x.spare[n-1]
		x.spare = x.spare[:n-1]
		return nd
	}
	return new(node)
}

func (x *Index[K]) recycle(nd *node) {
	if len(x.spare) >= maxSpareNodes {
		return
	}
	if cap(nd.holders) > maxSpareHolders {
		nd.holders = nil
	}
	x.spare = append(x.spare, nd)
}
