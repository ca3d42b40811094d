package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// prefixRequests returns n requests with distinct random prompts of 1 to 12
// blocks.
func prefixRequests(n int, seed uint64) []*Request {
	rng := rand.New(rand.NewPCG(seed, 2))
	reqs := make([]*Request, n)
	for i := range reqs {
		reqs[i] = &Request{ID: fmt.Sprint("r", i), Blocks: randomBlocks(rng, 1+rng.IntN(12))}
	}
	return reqs
}

// pickTargets maps each request to the String() of the target p picks.
func pickTargets(t *testing.T, p Policy, reqs []*Request, cands []Candidate) []string {
	t.Helper()
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = cands[mustPick(t, p, r, cands)].String()
	}
	return out
}

func TestPrefixHashAffinityAndSpread(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	byIDs := make([]*Request, 200)
	for i := range byIDs {
		byIDs[i] = &Request{ID: fmt.Sprintf("%016x", rng.Uint64())}
	}
	tests := []struct {
		name string
		n    int
		reqs []*Request
	}{
		{"blocks, 8 targets", 8, prefixRequests(200, 1)},
		{"blocks, 2 targets", 2, prefixRequests(200, 2)},
		{"blocks, 64 targets", 64, prefixRequests(200, 3)},
		{"ids, 8 targets", 8, byIDs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := policyCands(tt.n)
			p := mustPolicy(t, PolicySpec{Name: "prefix_hash"})
			first := pickTargets(t, p, tt.reqs, cands)
			if again := pickTargets(t, p, tt.reqs, cands); !slices.Equal(first, again) {
				t.Error("the same requests went elsewhere on the second pass")
			}
			// Another replica (a fresh policy) agrees.
			other := mustPolicy(t, PolicySpec{Name: "prefix_hash"})
			if got := pickTargets(t, other, tt.reqs, policyCands(tt.n)); !slices.Equal(first, got) {
				t.Error("a fresh policy over equal candidates mapped the requests differently")
			}
			counts := map[string]int{}
			for _, s := range first {
				counts[s]++
			}
			if len(counts) < (tt.n+1)/2 {
				t.Errorf("%d distinct prompts used %d of %d targets, want at least half: %v", len(tt.reqs), len(counts), tt.n, counts)
			}
		})
	}
}

func TestPrefixHashKey(t *testing.T) {
	a := []uint64{1, 2, 3, 4, 5, 6}
	tests := []struct {
		name string
		x, y *Request
		same bool
	}{
		{"only the first four blocks count", &Request{Blocks: a}, &Request{Blocks: []uint64{1, 2, 3, 4, 9}}, true},
		{"blocks win over the id", &Request{ID: "a", Blocks: a}, &Request{ID: "b", Blocks: a}, true},
		{"same id without blocks", &Request{ID: "a"}, &Request{ID: "a", Prompt: []byte("x")}, true},
		{"nil is the empty request", nil, &Request{}, true},
		{"different first block", &Request{Blocks: a}, &Request{Blocks: []uint64{9, 2, 3, 4, 5, 6}}, false},
		{"fourth block differs", &Request{Blocks: a}, &Request{Blocks: []uint64{1, 2, 3, 9}}, false},
		{"shorter prefix", &Request{Blocks: a[:2]}, &Request{Blocks: a[:3]}, false},
		{"different ids", &Request{ID: "a"}, &Request{ID: "b"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := prefixHashKey(tt.x) == prefixHashKey(tt.y); got != tt.same {
				t.Errorf("same key = %v, want %v", got, tt.same)
			}
		})
	}
}

func TestPrefixHashBoundedLoad(t *testing.T) {
	reqs := prefixRequests(50, 4)
	tests := []struct {
		name       string
		loadFactor float64
		home       int64 // tokens on the request's home target
		others     int64 // tokens on each of the 7 others
		stay       bool
	}{
		{"idle pool", 0, 0, 0, true},
		{"home busy, within 1.25 x mean", 0, 120, 100, true},
		{"home overloaded", 0, 1000, 0, false},
		{"home over 1.25 x mean", 0, 140, 100, false},
		{"home over a tighter bound", 1.1, 120, 100, false},
		{"a looser bound keeps it", 2, 180, 100, true},
		{"one token of slack", 0, 1, 0, true},
		{"two tokens over an idle pool", 0, 2, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "prefix_hash", LoadFactor: tt.loadFactor})
			for _, r := range reqs {
				cands := policyCands(8)
				home := mustPick(t, p, r, cands)
				for i := range cands {
					cands[i].Load.Tokens = tt.others
				}
				cands[home].Load.Tokens = tt.home
				got := mustPick(t, p, r, cands)
				if (got == home) != tt.stay {
					t.Fatalf("request %s: home %d, picked %d, want stay=%v", r.ID, home, got, tt.stay)
				}
				if again := mustPick(t, p, r, cands); again != got {
					t.Fatalf("request %s: picked %d then %d under the same loads", r.ID, got, again)
				}
			}
		})
	}
}

// TestPrefixHashSetChange checks consistent hashing: when a target leaves
// only its keys move, and when one joins only keys that it takes move.
func TestPrefixHashSetChange(t *testing.T) {
	reqs := prefixRequests(2000, 5)
	base := policyCands(8)
	tests := []struct {
		name    string
		cands   []Candidate
		removed string // the target that left, if any
		maxMove float64
	}{
		{"first target leaves", base[1:], base[0].String(), 0.25},
		{"middle target leaves", slices.Delete(slices.Clone(base), 3, 4), base[3].String(), 0.25},
		{"a target joins", policyCands(9), "", 0.25},
		{"four targets join", policyCands(12), "", 0.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "prefix_hash"})
			before := pickTargets(t, p, reqs, base)
			after := pickTargets(t, p, reqs, tt.cands)
			known := map[string]bool{}
			for _, c := range base {
				known[c.String()] = true
			}
			moved := 0
			for i := range reqs {
				if before[i] == after[i] {
					continue
				}
				moved++
				if tt.removed != "" && before[i] != tt.removed {
					t.Errorf("request %d moved from %s, which stayed, to %s", i, before[i], after[i])
				}
				if tt.removed == "" && known[after[i]] {
					t.Errorf("request %d moved from %s to %s, not to a new target", i, before[i], after[i])
				}
			}
			share := float64(moved) / float64(len(reqs))
			t.Logf("%.1f%% of the keys moved", 100*share)
			if share > tt.maxMove {
				t.Errorf("%.1f%% of the keys moved, want at most %.0f%%", 100*share, 100*tt.maxMove)
			}
		})
	}
}

// TestPrefixHashRingCache checks that the ring is rebuilt when the
// candidate set changes and only then.
func TestPrefixHashRingCache(t *testing.T) {
	reqs := prefixRequests(100, 6)
	p := mustPolicy(t, PolicySpec{Name: "prefix_hash"}).(*prefixHash)
	cands := policyCands(16)
	want := pickTargets(t, p, reqs, cands)
	pickTargets(t, p, reqs, cands)
	if p.ring.builds != 1 {
		t.Fatalf("%d ring builds for one candidate set, want 1", p.ring.builds)
	}

	// A newer snapshot: equal endpoints at new addresses.
	fresh := policyCands(16)
	if fresh[0].Endpoint == cands[0].Endpoint {
		t.Fatal("policyCands reused endpoints")
	}
	if got := pickTargets(t, p, reqs, fresh); !slices.Equal(got, want) {
		t.Error("a newer snapshot of the same targets moved keys")
	}
	if p.ring.builds != 1 {
		t.Errorf("a newer snapshot of the same targets rebuilt the ring (%d builds)", p.ring.builds)
	}

	// The same targets in another order: new indices, same targets.
	reordered := slices.Clone(cands)
	slices.Reverse(reordered)
	if got := pickTargets(t, p, reqs, reordered); !slices.Equal(got, want) {
		t.Error("reordering the candidates moved keys")
	}
	if p.ring.builds != 2 {
		t.Errorf("%d ring builds after a reorder, want 2", p.ring.builds)
	}

	// A changed address is another target.
	changed := policyCands(16)
	changed[5].Endpoint.Address = "10.9.9.9:30000" // ranks 4..7 of one engine
	pickTargets(t, p, reqs, changed)
	if p.ring.builds != 3 {
		t.Errorf("%d ring builds after an address change, want 3", p.ring.builds)
	}
	if got := pickTargets(t, p, reqs, changed[:10]); len(got) != len(reqs) || p.ring.builds != 4 {
		t.Errorf("%d ring builds after a shrink, want 4", p.ring.builds)
	}
}

func TestPrefixHashSpec(t *testing.T) {
	tests := []struct {
		loadFactor float64
		wantErr    bool
	}{
		{0, false},
		{1, false},
		{1.25, false},
		{10, false},
		{0.99, true},
		{-1, true},
		{math.NaN(), true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.loadFactor), func(t *testing.T) {
			_, err := NewPolicy(PolicySpec{Name: "prefix_hash", LoadFactor: tt.loadFactor})
			if (err != nil) != tt.wantErr {
				t.Errorf("NewPolicy(load factor %v) error = %v, want error %v", tt.loadFactor, err, tt.wantErr)
			}
		})
	}
}

// BenchmarkPrefixHashRebuild measures a ring rebuild, which happens when
// the candidate set changes.
func BenchmarkPrefixHashRebuild(b *testing.B) {
	for _, n := range []int{8, 512, 8192} {
		b.Run(fmt.Sprint("n=", n), func(b *testing.B) {
			sets := [2][]Candidate{policyCands(n), policyCands(n + 1)[1:]}
			var r hashRing
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.sync(sets[i%2])
				i++
			}
		})
	}
}
