package scheduler

import "testing"

func TestLeastTokens(t *testing.T) {
	tests := []struct {
		name   string
		tokens []int64
		want   int
	}{
		{"one", []int64{7}, 0},
		{"minimum first", []int64{1, 5, 9}, 0},
		{"minimum in the middle", []int64{5, 3, 9}, 1},
		{"minimum last", []int64{5, 4, 9, 2}, 3},
		{"tie goes to the earliest", []int64{5, 3, 9, 3}, 1},
		{"all equal", []int64{4, 4, 4}, 0},
		{"all idle", []int64{0, 0, 0, 0}, 0},
		{"large loads", []int64{1 << 40, 1<<40 - 1, 1 << 41}, 1},
	}
	p := mustPolicy(t, PolicySpec{Name: "least_tokens"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustPick(t, p, &Request{}, withTokens(tt.tokens...)); got != tt.want {
				t.Errorf("Pick(%v) = %d, want %d", tt.tokens, got, tt.want)
			}
		})
	}
}

// TestLeastTokensSpreadsWithReservations plays the scheduler's part:
// reserving the request's tokens on the chosen target before the next pick
// spreads consecutive picks over the targets.
func TestLeastTokensSpreadsWithReservations(t *testing.T) {
	p := mustPolicy(t, PolicySpec{Name: "least_tokens"})
	cands := withTokens(0, 0, 0, 0)
	counts := make([]int, len(cands))
	for i := range 40 {
		got := mustPick(t, p, &Request{}, cands)
		if want := i % len(cands); got != want {
			t.Fatalf("pick %d = %d, want %d", i, got, want)
		}
		counts[got]++
		cands[got].Load.Tokens += 100
	}
	for i, c := range counts {
		if c != 10 {
			t.Errorf("target %d picked %d times, want 10", i, c)
		}
	}
}
