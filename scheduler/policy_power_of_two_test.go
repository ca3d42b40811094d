package scheduler

import (
	"math"
	"slices"
	"testing"
)

// powerOfTwoOdds returns the probability with which power_of_two picks each
// candidate: the pair is uniform over the distinct pairs and the candidate
// with fewer tokens wins, the earlier one on a tie. So candidate k is
// chosen with probability (number of candidates it beats) / C(n, 2).
func powerOfTwoOdds(tokens []int64) []float64 {
	n := len(tokens)
	odds := make([]float64, n)
	pairs := float64(n*(n-1)) / 2
	for k := range tokens {
		beats := 0
		for j := range tokens {
			if j != k && (tokens[k] < tokens[j] || tokens[k] == tokens[j] && k < j) {
				beats++
			}
		}
		odds[k] = float64(beats) / pairs
	}
	return odds
}

func TestPowerOfTwo(t *testing.T) {
	tests := []struct {
		name   string
		tokens []int64
	}{
		{"two: the lighter always", []int64{5, 3}},
		{"two equal: the earlier always", []int64{3, 3}},
		{"three distinct", []int64{30, 10, 20}},
		{"three equal: ties go to the earlier", []int64{7, 7, 7}},
		{"four with a tie", []int64{40, 10, 30, 10}},
		{"eight distinct", []int64{800, 100, 700, 200, 600, 300, 500, 400}},
	}
	const picks = 40000
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "power_of_two", Seed: 99})
			cands := withTokens(tt.tokens...)
			counts := make([]int, len(cands))
			for range picks {
				counts[pickFast(t, p, &Request{}, cands)]++
			}
			want := powerOfTwoOdds(tt.tokens)
			for k, c := range counts {
				got := float64(c) / picks
				if want[k] == 0 && c != 0 {
					t.Errorf("candidate %d (tokens %d) picked %d times: it loses every pair it is in", k, tt.tokens[k], c)
				}
				// Binomial sd is at most 0.0025 here; 0.015 is 6 sigma.
				if math.Abs(got-want[k]) > 0.015 {
					t.Errorf("candidate %d (tokens %d) picked %.3f of the time, want %.3f", k, tt.tokens[k], got, want[k])
				}
			}
			heaviest := slices.Index(tt.tokens, slices.Max(tt.tokens))
			unique := slices.Index(tt.tokens[heaviest+1:], tt.tokens[heaviest]) < 0
			if len(cands) >= 3 && unique {
				if uniform := float64(picks) / float64(len(cands)); float64(counts[heaviest]) >= uniform {
					t.Errorf("the heaviest candidate was picked %d times, not less than uniform %.0f", counts[heaviest], uniform)
				}
			}
		})
	}
}

// TestPowerOfTwoNeverPicksTheHeaviest checks, over many pools, that a
// strictly most loaded candidate of three or more is never chosen: the
// other member of its pair always has fewer tokens.
func TestPowerOfTwoNeverPicksTheHeaviest(t *testing.T) {
	p := mustPolicy(t, PolicySpec{Name: "power_of_two", Seed: 5})
	for _, n := range []int{3, 4, 9, 100} {
		cands := policyCands(n)
		for i := range cands {
			cands[i].Load.Tokens = int64(i % 3) // ties among the lighter ones
		}
		heaviest := n / 2
		cands[heaviest].Load.Tokens = 1000
		for range 2000 {
			if got := pickFast(t, p, &Request{}, cands); got == heaviest {
				t.Fatalf("n=%d: picked the strictly heaviest candidate %d", n, got)
			}
		}
	}
}

func TestPowerOfTwoReproducible(t *testing.T) {
	cands := withTokens(5, 1, 4, 2, 3, 9, 0, 7)
	seq := func(seed uint64) []int {
		p := mustPolicy(t, PolicySpec{Name: "power_of_two", Seed: seed})
		out := make([]int, 200)
		for i := range out {
			out[i] = pickFast(t, p, &Request{}, cands)
		}
		return out
	}
	if !slices.Equal(seq(3), seq(3)) {
		t.Error("the same seed gave different picks")
	}
	if slices.Equal(seq(3), seq(4)) {
		t.Error("seeds 3 and 4 gave the same 200 picks")
	}
}
