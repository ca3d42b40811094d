package scheduler

import (
	"math"
	"slices"
	"testing"
)

func TestScorerNames(t *testing.T) {
	got := ScorerNames()
	if want := []string{"kv", "prefix", "queue", "tokens"}; !slices.Equal(got, want) {
		t.Fatalf("ScorerNames() = %v, want %v", got, want)
	}
	for _, name := range got {
		s, ok := scorerByName(name)
		if !ok || s.String() != name {
			t.Errorf("scorerByName(%q) = %v, %v", name, s, ok)
		}
	}
	if _, ok := scorerByName("latency"); ok {
		t.Error(`scorerByName("latency") succeeded`)
	}
	got[0] = "changed"
	if ScorerNames()[0] != "kv" {
		t.Error("ScorerNames returns shared state")
	}
}

func TestScorers(t *testing.T) {
	load := func(tokens, capacity int64, running, waiting int) Candidate {
		return Candidate{Load: Load{Tokens: tokens, Capacity: capacity, Running: running, Waiting: waiting}}
	}
	tests := []struct {
		name  string
		s     scorer
		cands []Candidate
		want  []float64
	}{
		{"tokens", scorerTokens, []Candidate{load(0, 0, 0, 0), load(250, 0, 0, 0), load(1000, 0, 0, 0)}, []float64{1, 0.75, 0}},
		{"tokens all equal", scorerTokens, []Candidate{load(500, 0, 0, 0), load(500, 0, 0, 0)}, []float64{1, 1}},
		{"tokens all idle", scorerTokens, []Candidate{load(0, 0, 0, 0), load(0, 0, 0, 0)}, []float64{1, 1}},
		{"queue", scorerQueue, []Candidate{load(0, 0, 3, 1), load(0, 0, 1, 1), load(0, 0, 0, 0)}, []float64{0, 0.5, 1}},
		{"queue all equal", scorerQueue, []Candidate{load(0, 0, 2, 0), load(0, 0, 1, 1)}, []float64{1, 1}},
		{"kv", scorerKV, []Candidate{load(250, 1000, 0, 0), load(0, 1000, 0, 0), load(1000, 1000, 0, 0)}, []float64{0.75, 1, 0}},
		{"kv over capacity clamps", scorerKV, []Candidate{load(1500, 1000, 0, 0)}, []float64{0}},
		{"kv unknown capacity", scorerKV, []Candidate{load(1500, 0, 0, 0), load(10, -1, 0, 0)}, []float64{1, 1}},
		{"prefix as is", scorerPrefix, []Candidate{{Prefix: 0}, {Prefix: 0.25}, {Prefix: 1}}, []float64{0, 0.25, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := collectStats(tt.cands)
			for i := range tt.cands {
				if got := tt.s.score(&tt.cands[i], &st); math.Abs(got-tt.want[i]) > 1e-12 {
					t.Errorf("%s score of candidate %d = %v, want %v", tt.s, i, got, tt.want[i])
				}
			}
		})
	}
}
