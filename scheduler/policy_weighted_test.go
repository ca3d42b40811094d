package scheduler

import (
	"math"
	"strings"
	"testing"
)

func TestWeighted(t *testing.T) {
	// a: light, no cache; b: heavy, most of the prompt cached; c: between.
	abc := func() []Candidate { return prefixCands([]int64{1000, 10000, 5000}, []float64{0, 0.9, 0.5}) }
	queues := func() []Candidate {
		c := withTokens(100, 100, 100)
		c[0].Load.Running, c[0].Load.Waiting = 10, 5
		c[1].Load.Running, c[1].Load.Waiting = 2, 1
		c[2].Load.Running, c[2].Load.Waiting = 4, 0
		return c
	}
	kv := func() []Candidate {
		c := withTokens(1000, 5000, 3000)
		c[0].Load.Capacity = 1200  // 1/6 free
		c[1].Load.Capacity = 50000 // 9/10 free
		c[2].Load.Capacity = 0     // unknown: 1
		return c
	}
	tests := []struct {
		name    string
		weights map[string]float64
		cands   []Candidate
		want    int
	}{
		{"tokens only: the lightest", map[string]float64{"tokens": 1}, abc(), 0},
		{"prefix only: the best cached", map[string]float64{"prefix": 1}, abc(), 1},
		{"default weights: the balance", nil, abc(), 2}, // 0.9, 0.9, 1.0
		{"tokens weigh more", map[string]float64{"tokens": 3, "prefix": 1}, abc(), 0},
		{"prefix weighs more", map[string]float64{"tokens": 1, "prefix": 3}, abc(), 1},
		{"zero weight ignored", map[string]float64{"tokens": 0, "prefix": 1}, abc(), 1},
		{"queue: the shortest queue", map[string]float64{"queue": 1}, queues(), 1},
		{"kv: unknown capacity counts as free", map[string]float64{"kv": 1}, kv(), 2},
		{"kv and tokens", map[string]float64{"kv": 1, "tokens": 1}, kv(), 2},      // 1/6+0.8, 0.9+0, 1+0.4
		{"kv and more tokens", map[string]float64{"kv": 1, "tokens": 3}, kv(), 0}, // 1/6+2.4, 0.9+0, 1+1.2
		{"all equal: earliest", nil, prefixCands([]int64{7, 7, 7}, []float64{0.5, 0.5, 0.5}), 0},
		{"tie for best: earliest", map[string]float64{"prefix": 1}, prefixCands([]int64{1, 9, 5}, []float64{0.2, 0.7, 0.7}), 1},
		{"all idle: earliest", map[string]float64{"tokens": 1, "queue": 1, "kv": 1}, withTokens(0, 0, 0, 0), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "weighted", Weights: tt.weights})
			if got := mustPick(t, p, &Request{}, tt.cands); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestWeightedSpec(t *testing.T) {
	tests := []struct {
		name    string
		weights map[string]float64
		wantErr string // "" for a valid spec; else a part of the error
	}{
		{"default", nil, ""},
		{"every scorer", map[string]float64{"tokens": 1, "prefix": 2, "queue": 0.5, "kv": 0}, ""},
		{"empty", map[string]float64{}, "none given"},
		{"unknown scorer", map[string]float64{"tokens": 1, "latency": 1}, `"latency"`},
		{"names are case sensitive", map[string]float64{"Prefix": 1}, `"Prefix"`},
		{"negative weight", map[string]float64{"tokens": 1, "prefix": -1}, `"prefix"`},
		{"NaN weight", map[string]float64{"queue": math.NaN()}, `"queue"`},
		{"infinite weight", map[string]float64{"kv": math.Inf(1)}, `"kv"`},
		{"zero sum", map[string]float64{"tokens": 0, "prefix": 0}, "positive"},
		{"infinite sum", map[string]float64{"tokens": math.MaxFloat64, "prefix": math.MaxFloat64}, "finite sum"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPolicy(PolicySpec{Name: "weighted", Weights: tt.weights})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("NewPolicy: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("NewPolicy error = %v, want one containing %s", err, tt.wantErr)
			}
		})
	}
}
