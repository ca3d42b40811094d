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

// maxSpareHolders is how large a freed node's holder slice may be to be
// kept for the node's next use.
const maxSpareHolders = 64

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

	nodes     blockTable // block hash -> index in slab
	slab      []node
	freeNodes []int32 // free indices in slab

	scratch sync.Pool // *matchScratch[K]
}

// node lists the targets that hold one block hash. It is in the nodes table
// only while that list is non-empty.
type node struct {
	hash uint64
	// The holder records: first, then rest. Most blocks have one holder,
	// which then costs no reference to another allocation (one cache miss
	// less for each block a fresh prompt inserts and for each it evicts).
	first holder
	rest  []holder
	n     int32 // number of holder records
}

// len returns the number of holder records.
func (nd *node) len() int { return int(nd.n) }

// at returns holder record i.
func (nd *node) at(i int32) holder {
	if i == 0 {
		return nd.first
	}
	return nd.rest[i-1]
}

// set replaces holder record i.
func (nd *node) set(i int32, h holder) {
	if i == 0 {
		nd.first = h
	} else {
		nd.rest[i-1] = h
	}
}

// push appends a holder record and returns its index.
func (nd *node) push(h holder) int32 {
	i := nd.n
	if i == 0 {
		nd.first = h
	} else {
		nd.rest = append(nd.rest, h)
	}
	nd.n++
	return i
}

// pop removes the last holder record.
func (nd *node) pop() {
	nd.n--
	if nd.n > 0 {
		nd.rest = nd.rest[:nd.n-1]
	}
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
//
// Insert returns how many blocks key holds afterwards.
func (x *Index[K]) Insert(key K, blocks []uint64) int {
	if len(blocks) == 0 {
		return x.Blocks(key)
	}
	if len(blocks) > x.bound {
		blocks = blocks[:x.bound]
	}

	x.mu.Lock()
	defer x.mu.Unlock()

	t := x.targetFor(key)
	bound := t.limit(x.bound)
	if len(blocks) > bound {
		blocks = blocks[:bound]
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		h := blocks[i]
		n, ok := x.nodes.get(h)
		if ok {
			if e, held := x.heldBy(n, t.slot); held {
				t.touch(e)
				continue
			}
		}
		// Evicting first cannot free n: t does not hold it.
		if t.len() >= bound {
			x.evict(t, t.oldest())
		}
		if !ok {
			n = x.newNode(h)
			x.nodes.put(h, n)
		}
		e := t.add(n)
		nd := &x.slab[n]
		t.entries[e].pos = nd.push(holder{slot: t.slot, entry: e})
	}
	return t.len()
}

// SetBound bounds the blocks key holds to blocks (at most the index's own
// bound; blocks <= 0 restores it), evicting its least recently used blocks
// beyond it. The scheduler bounds each target by the engine's KV capacity,
// so that the index forgets about as fast as the engine's cache evicts.
// SetBound returns how many blocks key holds afterwards.
func (x *Index[K]) SetBound(key K, blocks int) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	t := x.targetFor(key)
	t.bound = max(blocks, 0)
	for limit := t.limit(x.bound); t.len() > limit; {
		x.evict(t, t.oldest())
	}
	return t.len()
}

// heldBy returns slot's entry for node n, if slot holds it.
func (x *Index[K]) heldBy(n, slot int32) (int32, bool) {
	nd := &x.slab[n]
	for i := range nd.n {
		if h := nd.at(i); h.slot == slot {
			return h.entry, true
		}
	}
	return 0, false
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
		x.unhold(t.entries[e].node, t.entries[e].pos)
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
	x.unhold(t.entries[e].node, t.entries[e].pos)
	t.drop(e)
}

// unhold deletes holder record pos from node n, moving the last record into
// its place, and frees the node once it is empty.
func (x *Index[K]) unhold(n, pos int32) {
	nd := &x.slab[n]
	last := nd.n - 1
	if pos != last {
		moved := nd.at(last)
		nd.set(pos, moved)
		x.targets[moved.slot].entries[moved.entry].pos = pos
	}
	nd.pop()
	if last == 0 {
		x.nodes.del(nd.hash)
		if cap(nd.rest) > maxSpareHolders {
			nd.rest = nil
		}
		x.freeNodes = append(x.freeNodes, n)
	}
}

// newNode returns the index of an empty node for hash, reusing a freed one
// when it can. It may grow the slab: pointers into it are then stale.
func (x *Index[K]) newNode(hash uint64) int32 {
	if k := len(x.freeNodes); k > 0 {
		n := x.freeNodes[k-1]
		x.freeNodes = x.freeNodes[:k-1]
		x.slab[n].hash = hash
		return n
	}
	x.slab = append(x.slab, node{hash: hash})
	return int32(len(x.slab) - 1)
}
