package scheduler

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// policyCands returns n candidates in a stable order: engines with four DP
// ranks each, all idle.
func policyCands(n int) []Candidate {
	const ranks = 4
	eps := make([]Endpoint, (n+ranks-1)/ranks)
	for i := range eps {
		eps[i] = Endpoint{
			Role:    RoleDecode,
			URL:     fmt.Sprintf("http://10.0.%d.%d:30000", i/250, i%250+1),
			Address: fmt.Sprintf("10.0.%d.%d:30000", i/250, i%250+1),
			DPSize:  ranks,
			Ready:   true,
		}
	}
	cands := make([]Candidate, n)
	for i := range cands {
		cands[i].Target = Target{Endpoint: &eps[i/ranks], Rank: i % ranks}
	}
	return cands
}

// withTokens returns len(tokens) candidates carrying those token loads.
func withTokens(tokens ...int64) []Candidate {
	cands := policyCands(len(tokens))
	for i, t := range tokens {
		cands[i].Load.Tokens = t
	}
	return cands
}

// mustPolicy builds the policy spec names or fails the test.
func mustPolicy(t testing.TB, spec PolicySpec) Policy {
	t.Helper()
	p, err := NewPolicy(spec)
	if err != nil {
		t.Fatalf("NewPolicy(%+v): %v", spec, err)
	}
	return p
}

// mustPick picks or fails the test, and checks that the index is in range
// and that cands was left alone.
func mustPick(t testing.TB, p Policy, req *Request, cands []Candidate) int {
	t.Helper()
	before := slices.Clone(cands)
	got, err := p.Pick(t.Context(), req, cands)
	if err != nil {
		t.Fatalf("%s: Pick: %v", p.Name(), err)
	}
	if got < 0 || got >= len(cands) {
		t.Fatalf("%s: Pick = %d, out of range [0, %d)", p.Name(), got, len(cands))
	}
	if !slices.Equal(before, cands) {
		t.Fatalf("%s: Pick modified the candidates", p.Name())
	}
	return got
}

// pickFast is mustPick without the copy: for the loops that pick
// thousands of times (TestPolicyContract checks that cands stay untouched).
func pickFast(t testing.TB, p Policy, req *Request, cands []Candidate) int {
	t.Helper()
	got, err := p.Pick(t.Context(), req, cands)
	if err != nil || got < 0 || got >= len(cands) {
		t.Fatalf("%s: Pick = %d, %v", p.Name(), got, err)
	}
	return got
}

// randomLoads fills in varied loads and prefix matches, reproducibly.
func randomLoads(cands []Candidate, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range cands {
		cands[i].Load = Load{
			Tokens:   rng.Int64N(100_000),
			Capacity: 200_000,
			Running:  rng.IntN(32),
			Waiting:  rng.IntN(8),
			Fresh:    true,
		}
		cands[i].Prefix = rng.Float64()
	}
}

// randomBlocks returns a chain of n random block hashes.
func randomBlocks(rng *rand.Rand, n int) []uint64 {
	b := make([]uint64, n)
	for i := range b {
		b[i] = rng.Uint64()
	}
	return b
}

// TestPolicyContract checks what every registered policy owes the
// scheduler: ErrNoEndpoints on no candidates, the only candidate when
// there is one, an index in range, and candidates left untouched.
func TestPolicyContract(t *testing.T) {
	for _, name := range PolicyNames() {
		t.Run(name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: name, Seed: 7})
			if p.Name() != name {
				t.Errorf("Name() = %q, want %q", p.Name(), name)
			}
			for _, cands := range [][]Candidate{nil, {}} {
				if _, err := p.Pick(t.Context(), &Request{}, cands); !errors.Is(err, ErrNoEndpoints) {
					t.Errorf("Pick(%v) = %v, want ErrNoEndpoints", cands, err)
				}
			}
			if got := mustPick(t, p, &Request{ID: "x"}, withTokens(123)); got != 0 {
				t.Errorf("Pick(one candidate) = %d, want 0", got)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			for _, n := range []int{2, 3, 17, 300} {
				cands := policyCands(n)
				randomLoads(cands, uint64(n))
				for range 50 {
					req := &Request{ID: fmt.Sprint(rng.Uint64()), Blocks: randomBlocks(rng, rng.IntN(6))}
					mustPick(t, p, req, cands)
				}
				mustPick(t, p, nil, cands) // a nil request is an empty one
			}
		})
	}
}

// BenchmarkPolicies measures one pick of every policy over pools of
// several sizes, with varied loads and prefix matches.
func BenchmarkPolicies(b *testing.B) {
	rng := rand.New(rand.NewPCG(11, 12))
	reqs := make([]*Request, 64)
	for i := range reqs {
		reqs[i] = &Request{ID: fmt.Sprint("req-", i), Blocks: randomBlocks(rng, 1+rng.IntN(8))}
	}
	for _, name := range PolicyNames() {
		for _, n := range []int{8, 64, 512, 8192} {
			b.Run(fmt.Sprintf("%s/n=%d", name, n), func(b *testing.B) {
				cands := policyCands(n)
				randomLoads(cands, uint64(n))
				p := mustPolicy(b, PolicySpec{Name: name, Seed: 1})
				ctx := b.Context()
				if _, err := p.Pick(ctx, reqs[0], cands); err != nil { // builds caches
					b.Fatal(err)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if _, err := p.Pick(ctx, reqs[i%len(reqs)], cands); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}
