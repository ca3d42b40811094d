package scheduler

import (
	"slices"
	"testing"
)

// picks returns n consecutive picks of p over cands.
func picks(t *testing.T, p Policy, cands []Candidate, n int) []int {
	t.Helper()
	out := make([]int, n)
	for i := range out {
		out[i] = pickFast(t, p, &Request{}, cands)
	}
	return out
}

func TestRandom(t *testing.T) {
	tests := []struct {
		name  string
		n     int
		seed  uint64
		picks int
	}{
		{"one target", 1, 1, 50},
		{"two targets", 2, 1, 4000},
		{"five targets", 5, 42, 10000},
		{"64 targets", 64, 7, 64 * 300},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := policyCands(tt.n)
			cands[0].Load.Tokens = 1 << 30 // loads are ignored
			got := picks(t, mustPolicy(t, PolicySpec{Name: "random", Seed: tt.seed}), cands, tt.picks)
			counts := make([]int, tt.n)
			for _, g := range got {
				counts[g]++
			}
			want := float64(tt.picks) / float64(tt.n)
			for i, c := range counts {
				// Picks are binomial; 0.7..1.3 of the mean is > 5 sigma away
				// for every row.
				if float64(c) < 0.7*want || float64(c) > 1.3*want {
					t.Errorf("target %d picked %d times of %d, want about %.0f", i, c, tt.picks, want)
				}
			}
			again := picks(t, mustPolicy(t, PolicySpec{Name: "random", Seed: tt.seed}), cands, tt.picks)
			if !slices.Equal(got, again) {
				t.Errorf("seed %d: two policies picked different sequences", tt.seed)
			}
		})
	}
}

func TestRandomSeeds(t *testing.T) {
	cands := policyCands(16)
	seq := func(seed uint64) []int {
		return picks(t, mustPolicy(t, PolicySpec{Name: "random", Seed: seed}), cands, 100)
	}
	if slices.Equal(seq(1), seq(2)) {
		t.Error("seeds 1 and 2 picked the same 100 targets")
	}
	if slices.Equal(seq(0), seq(0)) {
		t.Error("seed 0 (random) picked the same 100 targets twice")
	}
}
