package prefix

import "math/bits"

// blockTable maps block hashes to node indices: an open-addressing hash
// table with linear probing and backward-shift deletion, at most half
// full.
//
// It replaces a Go map, whose deletions leave tombstones: under the
// index's steady churn (every new prompt inserts its blocks and evicts as
// many old ones) the map's probe sequences grew over the tombstones until
// a fresh 32 KiB prompt (512 blocks) cost 210 µs to insert, 62 % of it
// matching control bytes (BenchmarkInsert/fresh). Backward-shift deletion
// leaves no tombstones, so a lookup stays about one cache line however
// long the index has churned. The keys are already hashes; they are mixed
// once more so that keys with regular bits spread too.
//
// The zero value is an empty table, ready for use.
type blockTable struct {
	slots []tableSlot // len a power of two, or 0
	count int
	shift uint // 64 - log2(len(slots))
}

// tableSlot is one entry. ref is the node index plus one; 0 marks an
// empty slot, so that every uint64 is a valid key.
type tableSlot struct {
	hash uint64
	ref  int32
}

// minTableSlots is the size of a table's first allocation.
const minTableSlots = 64

// home returns the slot where a probe for hash starts.
func (t *blockTable) home(hash uint64) int {
	// SplitMix64's finaliser: a multiply alone keeps arithmetic
	// progressions of keys in arithmetic progressions of slots, which
	// linear probing turns into long runs.
	hash = (hash ^ hash>>30) * 0xbf58476d1ce4e5b9
	hash = (hash ^ hash>>27) * 0x94d049bb133111eb
	return int((hash ^ hash>>31) >> t.shift)
}

// get returns hash's node index, if the table has it.
func (t *blockTable) get(hash uint64) (int32, bool) {
	if t.count == 0 {
		return 0, false
	}
	mask := len(t.slots) - 1
	for i := t.home(hash); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.ref == 0 {
			return 0, false
		}
		if s.hash == hash {
			return s.ref - 1, true
		}
	}
}

// put maps hash to node n, replacing any earlier mapping.
func (t *blockTable) put(hash uint64, n int32) {
	if 2*(t.count+1) > len(t.slots) {
		t.grow()
	}
	mask := len(t.slots) - 1
	for i := t.home(hash); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.ref == 0 {
			*s = tableSlot{hash: hash, ref: n + 1}
			t.count++
			return
		}
		if s.hash == hash {
			s.ref = n + 1
			return
		}
	}
}

// del removes hash, if present, and shifts back the entries that probed
// past its slot so that no lookup needs a tombstone to go on.
func (t *blockTable) del(hash uint64) {
	if t.count == 0 {
		return
	}
	mask := len(t.slots) - 1
	i := t.home(hash)
	for ; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.ref == 0 {
			return
		}
		if s.hash == hash {
			break
		}
	}
	// Slot i is free. Move into it every later entry of the run whose
	// home does not lie cyclically in (i, j]: its probe passed i.
	for j := (i + 1) & mask; t.slots[j].ref != 0; j = (j + 1) & mask {
		h := t.home(t.slots[j].hash)
		if i <= j {
			if i < h && h <= j {
				continue
			}
		} else if i < h || h <= j {
			continue
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = tableSlot{}
	t.count--
}

// len returns the number of entries.
func (t *blockTable) len() int { return t.count }

// grow doubles the table (or makes its first one) and rehashes every entry.
func (t *blockTable) grow() {
	old := t.slots
	size := max(2*len(old), minTableSlots)
	t.slots = make([]tableSlot, size)
	t.shift = uint(64 - bits.TrailingZeros(uint(size)))
	t.count = 0
	for _, s := range old {
		if s.ref != 0 {
			t.put(s.hash, s.ref-1)
		}
	}
}

// all yields every (hash, node index) pair, in no particular order.
func (t *blockTable) all(yield func(uint64, int32) bool) {
	for _, s := range t.slots {
		if s.ref != 0 && !yield(s.hash, s.ref-1) {
			return
		}
	}
}
