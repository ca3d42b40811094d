package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestBlockTableAgainstMap drives the table and a Go map with the same
// random puts and deletes and checks that they agree after every step, and
// that every entry is still found from its home slot (backward-shift
// deletion kept each probe run unbroken). The key spaces are small so that
// keys collide, runs wrap around the table's end and deletes hit the
// middle of runs.
func TestBlockTableAgainstMap(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys uint64 // distinct keys drawn from
		ops  int
		key  func(uint64) uint64
	}{
		{name: "random keys", keys: 4096, ops: 200000, key: func(k uint64) uint64 { return k * 0x9e3779b97f4a7c15 }},
		{name: "small integers", keys: 300, ops: 100000, key: func(k uint64) uint64 { return k }},
		{name: "key zero and neighbours", keys: 8, ops: 10000, key: func(k uint64) uint64 { return k }},
		{name: "same home", keys: 40, ops: 20000, key: func(k uint64) uint64 { return k << 58 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var tab blockTable
			want := map[uint64]int32{}
			for op := range tc.ops {
				k := tc.key(rng.Uint64N(tc.keys))
				switch rng.IntN(3) {
				case 0, 1:
					if rng.IntN(2) == 0 || len(want) < int(tc.keys)/2 {
						n := int32(rng.IntN(1 << 20))
						tab.put(k, n)
						want[k] = n
						break
					}
					fallthrough
				default:
					tab.del(k)
					delete(want, k)
				}
				if got, ok := tab.get(k); ok != (want[k] != 0 || hasKey(want, k)) || ok && got != want[k] {
					t.Fatalf("op %d: get(%#x) = %d, %v; want %d, %v", op, k, got, ok, want[k], hasKey(want, k))
				}
				if op%997 == 0 || op == tc.ops-1 {
					checkTable(t, &tab, want)
				}
			}
		})
	}
}

func hasKey(m map[uint64]int32, k uint64) bool {
	_, ok := m[k]
	return ok
}

// checkTable checks that tab holds exactly want and stays at most half
// full.
func checkTable(t *testing.T, tab *blockTable, want map[uint64]int32) {
	t.Helper()
	if tab.len() != len(want) {
		t.Fatalf("len %d, want %d", tab.len(), len(want))
	}
	if 2*tab.len() > len(tab.slots) {
		t.Fatalf("%d entries in %d slots: more than half full", tab.len(), len(tab.slots))
	}
	seen := 0
	for h, n := range tab.all {
		seen++
		if w, ok := want[h]; !ok || w != n {
			t.Fatalf("table has %#x -> %d; want %d, %v", h, n, w, ok)
		}
		if got, ok := tab.get(h); !ok || got != n {
			t.Fatalf("entry %#x -> %d not found from its home slot (got %d, %v)", h, n, got, ok)
		}
	}
	if seen != len(want) {
		t.Fatalf("all yielded %d entries, want %d", seen, len(want))
	}
	for h, n := range want {
		if got, ok := tab.get(h); !ok || got != n {
			t.Fatalf("get(%#x) = %d, %v; want %d", h, got, ok, n)
		}
	}
}
