package prefix

import (
	"fmt"
	"testing"
)

// oneByte hashes text one byte per block, so that a test prompt "abcd" is
// four blocks and prompts share exactly their common leading characters.
var oneByte = Hasher{BlockBytes: 1}

func chain(s string) []uint64 { return oneByte.Text([]byte(s), nil) }

// matches runs Match and returns its reports as a map, failing the test if
// a target is reported twice or the reports are not longest first.
func matches(t *testing.T, x *Index[string], blocks []uint64) map[string]int {
	t.Helper()
	got := map[string]int{}
	last := len(blocks)
	x.Match(blocks, func(key string, matched int) {
		if _, dup := got[key]; dup {
			t.Errorf("target %q reported twice", key)
		}
		if matched < 1 || matched > len(blocks) {
			t.Errorf("target %q: matched %d out of range 1..%d", key, matched, len(blocks))
		}
		if matched > last {
			t.Errorf("target %q: matched %d reported after a shorter match %d", key, matched, last)
		}
		last = matched
		got[key] = matched
	})
	return got
}

// checkInvariants verifies the index's internal cross-references.
func checkInvariants[K comparable](t *testing.T, x *Index[K]) {
	t.Helper()
	if err := invariants(x); err != nil {
		t.Fatal(err)
	}
}

func invariants[K comparable](x *Index[K]) error {
	x.mu.RLock()
	defer x.mu.RUnlock()

	live := 0
	holds := 0
	for slot, tg := range x.targets {
		if tg == nil {
			continue
		}
		live++
		if tg.slot != int32(slot) || x.keys[slot] != tg.key || x.byKey[tg.key] != tg {
			return fmt.Errorf("slot %d: inconsistent target bookkeeping", slot)
		}
		if tg.len() > x.bound {
			return fmt.Errorf("slot %d: holds %d blocks, bound %d", slot, tg.len(), x.bound)
		}
		n := 0
		for e := tg.entries[0].next; e != 0; e = tg.entries[e].next {
			n++
			if n > tg.len() {
				return fmt.Errorf("slot %d: LRU ring longer than %d", slot, tg.len())
			}
			en := tg.entries[e]
			if tg.entries[en.next].prev != e {
				return fmt.Errorf("slot %d: broken ring at entry %d", slot, e)
			}
			if en.node < 0 || int(en.node) >= len(x.slab) {
				return fmt.Errorf("slot %d: entry %d names node %d, beyond the slab", slot, e, en.node)
			}
			nd := &x.slab[en.node]
			if n, ok := x.nodes.get(nd.hash); !ok || n != en.node {
				return fmt.Errorf("slot %d: entry %d's node %d is not indexed by its hash", slot, e, en.node)
			}
			if int(en.pos) >= nd.len() || nd.at(en.pos) != (holder{int32(slot), e}) {
				return fmt.Errorf("slot %d: entry %d has no matching holder record", slot, e)
			}
		}
		if n != tg.len() {
			return fmt.Errorf("slot %d: ring has %d entries, map %d", slot, n, tg.len())
		}
		holds += n
	}
	if live != len(x.byKey) {
		return fmt.Errorf("%d live slots, %d keys", live, len(x.byKey))
	}
	if live+len(x.free) != len(x.targets) {
		return fmt.Errorf("%d live + %d free slots != %d", live, len(x.free), len(x.targets))
	}
	records := 0
	for h, n := range x.nodes.all {
		nd := &x.slab[n]
		if nd.len() == 0 || nd.hash != h {
			return fmt.Errorf("node %d for %#x is empty or names %#x", n, h, nd.hash)
		}
		seen := map[int32]bool{}
		for k := range nd.n {
			hr := nd.at(k)
			if seen[hr.slot] {
				return fmt.Errorf("node %#x lists slot %d twice", h, hr.slot)
			}
			seen[hr.slot] = true
		}
		records += nd.len()
	}
	if x.nodes.len()+len(x.freeNodes) != len(x.slab) {
		return fmt.Errorf("%d nodes + %d free != slab of %d", x.nodes.len(), len(x.freeNodes), len(x.slab))
	}
	if records != holds {
		return fmt.Errorf("%d holder records, %d entries", records, holds)
	}
	return nil
}
