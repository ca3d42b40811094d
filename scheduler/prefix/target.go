package prefix

// entry is one block held by one target: a slot in the target's slab,
// linked into the target's LRU ring. Entries hold no pointers, so a slab of
// them costs the garbage collector nothing to scan.
type entry struct {
	prev, next int32 // LRU ring links; index 0 is the ring's sentinel
	node       int32 // index of the block's node in Index.slab
	pos        int32 // index of this entry's holder record in its node
}

// target is the per-target state: the blocks it holds, in LRU order. It
// has no map of its own: the block's node lists its holders, so a block is
// found through the index's one map (a lookup in a large map is a cache
// miss, and a second map per target doubled them).
//
// entries[0] is the sentinel of a circular doubly linked list: its next is
// the most recently used entry and its prev the least recently used one.
// Freed entries are chained through next starting at free (0 = none).
type target[K comparable] struct {
	key     K
	slot    int32 // index in Index.targets, named by holder records
	entries []entry
	free    int32
	held    int // entries in use
	bound   int // the target's own bound (SetBound); 0: the index's
}

// limit returns the target's bound within the index's bound.
func (t *target[K]) limit(index int) int {
	if t.bound > 0 && t.bound < index {
		return t.bound
	}
	return index
}

func newTarget[K comparable](key K, slot int32) *target[K] {
	return &target[K]{
		key:     key,
		slot:    slot,
		entries: []entry{{}}, // sentinel linked to itself
	}
}

// len returns the number of blocks the target holds.
func (t *target[K]) len() int { return t.held }

// add takes a free entry for the block whose node is node, links it as
// most recently used and returns its index. The caller fills in pos.
func (t *target[K]) add(node int32) int32 {
	var i int32
	if t.free != 0 {
		i = t.free
		t.free = t.entries[i].next
		t.entries[i] = entry{node: node}
	} else {
		i = int32(len(t.entries))
		t.entries = append(t.entries, entry{node: node})
	}
	t.held++
	t.pushFront(i)
	return i
}

// drop unlinks entry i and puts it on the free list.
func (t *target[K]) drop(i int32) {
	t.unlink(i)
	t.entries[i] = entry{next: t.free}
	t.free = i
	t.held--
}

// oldest returns the least recently used entry, or 0 when there is none.
func (t *target[K]) oldest() int32 { return t.entries[0].prev }

// touch marks entry i as most recently used.
func (t *target[K]) touch(i int32) {
	if t.entries[0].next == i {
		return
	}
	t.unlink(i)
	t.pushFront(i)
}

func (t *target[K]) pushFront(i int32) {
	e := t.entries
	first := e[0].next
	e[i].prev, e[i].next = 0, first
	e[first].prev = i
	e[0].next = i
}

func (t *target[K]) unlink(i int32) {
	e := t.entries
	p, n := e[i].prev, e[i].next
	e[p].next = n
	e[n].prev = p
}
