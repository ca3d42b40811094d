package scheduler

import (
	"math"
	"strings"
	"testing"
)

// prefixCands returns candidates with the given tokens and prefix matches.
func prefixCands(tokens []int64, prefix []float64) []Candidate {
	cands := withTokens(tokens...)
	for i, p := range prefix {
		cands[i].Prefix = p
	}
	return cands
}

func TestCacheAware(t *testing.T) {
	tests := []struct {
		name   string
		spec   PolicySpec
		tokens []int64
		prefix []float64
		want   int
	}{
		{"follows the prefix above the threshold", PolicySpec{}, []int64{0, 5000, 0}, []float64{0, 0.8, 0.1}, 1},
		{"follows the prefix at the threshold", PolicySpec{}, []int64{0, 5000, 0}, []float64{0, 0.3, 0.1}, 1},
		{"ignores the prefix below the threshold", PolicySpec{}, []int64{300, 5000, 200}, []float64{0, 0.29, 0.1}, 2},
		{"no prefix anywhere: least tokens", PolicySpec{}, []int64{300, 100, 200}, nil, 1},
		{"no prefix, tie: earliest", PolicySpec{}, []int64{300, 100, 100}, nil, 1},
		{"prefix tie: fewer tokens", PolicySpec{}, []int64{900, 500, 700}, []float64{0.6, 0.6, 0.6}, 1},
		{"prefix and tokens tie: earliest", PolicySpec{}, []int64{900, 500, 500}, []float64{0.2, 0.6, 0.6}, 1},
		{"highest prefix wins over fewer tokens", PolicySpec{}, []int64{100, 9000, 8000}, []float64{0.5, 0.9, 0.7}, 1},
		// Imbalance needs max-min > 16384 and max > 1.5*min.
		{"imbalanced: least tokens", PolicySpec{}, []int64{10000, 30000, 20000}, []float64{0, 1, 0}, 0},
		{"abs alone is not imbalance", PolicySpec{}, []int64{100000, 120000}, []float64{0, 1}, 1},
		{"rel alone is not imbalance", PolicySpec{}, []int64{100, 10000}, []float64{0, 1}, 1},
		{"abs bound is strict", PolicySpec{}, []int64{0, 16384}, []float64{0, 1}, 1},
		{"abs bound just passed", PolicySpec{}, []int64{0, 16385}, []float64{0, 1}, 0},
		{"rel bound is strict", PolicySpec{}, []int64{40000, 60000}, []float64{0, 1}, 1},
		{"rel bound just passed", PolicySpec{}, []int64{40000, 60001}, []float64{0, 1}, 0},
		{"idle target makes any large gap imbalanced", PolicySpec{}, []int64{20000, 0, 3}, []float64{1, 0, 0}, 1},
		// Parameters.
		{"lower threshold follows", PolicySpec{CacheThreshold: 0.1}, []int64{0, 5000}, []float64{0, 0.2}, 1},
		{"higher threshold ignores", PolicySpec{CacheThreshold: 0.9}, []int64{0, 5000}, []float64{0, 0.8}, 0},
		{"smaller abs bound", PolicySpec{BalanceAbsTokens: 1000}, []int64{1000, 3000}, []float64{0, 1}, 0},
		{"larger rel bound", PolicySpec{BalanceRel: 4}, []int64{10000, 30000}, []float64{0, 1}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Name = "cache_aware"
			p := mustPolicy(t, tt.spec)
			if got := mustPick(t, p, &Request{}, prefixCands(tt.tokens, tt.prefix)); got != tt.want {
				t.Errorf("Pick(tokens %v, prefix %v) = %d, want %d", tt.tokens, tt.prefix, got, tt.want)
			}
		})
	}
}

func TestCacheAwareSpec(t *testing.T) {
	tests := []struct {
		name    string
		spec    PolicySpec
		wantErr string
	}{
		{"defaults", PolicySpec{}, ""},
		{"threshold 1", PolicySpec{CacheThreshold: 1}, ""},
		{"rel 1", PolicySpec{BalanceRel: 1}, ""},
		{"infinite rel disables the gate", PolicySpec{BalanceRel: math.Inf(1)}, ""},
		{"negative threshold", PolicySpec{CacheThreshold: -0.1}, "cache threshold"},
		{"threshold above 1", PolicySpec{CacheThreshold: 1.5}, "cache threshold"},
		{"NaN threshold", PolicySpec{CacheThreshold: math.NaN()}, "cache threshold"},
		{"negative abs", PolicySpec{BalanceAbsTokens: -1}, "balance abs"},
		{"rel below 1", PolicySpec{BalanceRel: 0.5}, "balance rel"},
		{"NaN rel", PolicySpec{BalanceRel: math.NaN()}, "balance rel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Name = "cache_aware"
			_, err := NewPolicy(tt.spec)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("NewPolicy: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("NewPolicy error = %v, want one naming %q", err, tt.wantErr)
			}
		})
	}
}
