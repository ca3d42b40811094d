package scheduler

import (
	"fmt"
	"math"
	"sync"
	"testing"
)

func TestTokenEstimator(t *testing.T) {
	tests := []struct {
		name  string
		ratio float64
		model string
		bytes int
		want  int64
	}{
		{"default ratio", 0, "m", 400, 100},
		{"rounds up", 4, "m", 401, 101},
		{"empty prompt is one token", 4, "m", 0, 1},
		{"custom ratio", 2, "m", 10, 5},
		{"absurd ratio clamped", 1000, "m", 120, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NewTokenEstimator(tt.ratio).Estimate(tt.model, tt.bytes); got != tt.want {
				t.Errorf("Estimate = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestTokenEstimatorLearnsPerModel(t *testing.T) {
	e := NewTokenEstimator(4)
	for range 100 {
		e.Observe("dense", 3000, 1000) // 3 chars per token
	}
	if r := e.Ratio("dense"); math.Abs(r-3) > 0.01 {
		t.Errorf("dense ratio = %.3f, want about 3", r)
	}
	if r := e.Ratio("other"); r != 4 {
		t.Errorf("an unobserved model moved to %.3f", r)
	}
	before := e.Ratio("dense")
	e.Observe("dense", 0, 10)
	e.Observe("dense", 10, 0)
	if e.Ratio("dense") != before {
		t.Error("nonsense observations changed the ratio")
	}
}

func TestTokenEstimatorBoundsModels(t *testing.T) {
	e := NewTokenEstimator(4)
	for i := range maxModels + 50 {
		e.Observe(fmt.Sprint("m", i), 200, 100)
	}
	if n := len(e.perModel); n != maxModels {
		t.Errorf("%d models tracked, want the bound %d", n, maxModels)
	}
}

func TestTokenEstimatorConcurrent(t *testing.T) {
	e := NewTokenEstimator(4)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 1000 {
				e.Observe(fmt.Sprint("m", i%3), 100+j, 30)
				_ = e.Estimate("m1", j)
			}
		})
	}
	wg.Wait()
}
