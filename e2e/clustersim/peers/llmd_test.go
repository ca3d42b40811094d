package peers

import (
	"math"
	"testing"

	"github.com/duet-router/duet/scheduler"
)

// TestLLMDProfiles checks the ported profiles on hand-built candidates: the
// P/D profiles (prefix 2, queue 1) and the default profile (queue 2,
// KV-cache utilization 2, prefix 3).
func TestLLMDProfiles(t *testing.T) {
	type c struct {
		prefix           float64
		waiting          int
		tokens, capacity int64
	}
	pd, _ := New("llmd_epp", scheduler.RoleDecode)
	pf, _ := New("llmd_epp", scheduler.RolePrefill)
	agg, _ := NewAggregated("llmd_epp")
	for _, tt := range []struct {
		name   string
		policy scheduler.Policy
		cs     []c
		want   int
	}{
		// P/D: a full match (2) beats an empty queue (1).
		{"pd: cache over queue", pd, []c{{1, 10, 0, 0}, {0, 0, 0, 0}}, 0},
		// 2 x 0.6 = 1.2 beats the idle queue's 1 (at weight 1 it would not).
		{"pd: prefix weighs twice the queue", pd, []c{{0.6, 10, 0, 0}, {0, 0, 0, 0}}, 0},
		// 2 x 0.4 = 0.8 is less than the idle queue's 1.
		{"pd: a weak match loses to the idle queue", pd, []c{{0.4, 10, 0, 0}, {0, 0, 0, 0}}, 1},
		// Prefix equal: the queue decides, min-max normalized.
		{"pd: queue", pf, []c{{0.5, 7, 0, 0}, {0.5, 3, 0, 0}, {0.5, 5, 0, 0}}, 1},
		// KV usage does not count in the P/D profiles.
		{"pd: kv ignored", pd, []c{{0.5, 0, 900, 1000}, {0, 0, 0, 1000}}, 0},
		// Default: 3x0.7 + 0 + 2x0.5 = 3.1 against 0 + 2 + 2x0.5 = 3 (at
		// prefix weight 2 the idle queue would win).
		{"default: prefix weighs 3", agg, []c{{0.7, 10, 500, 1000}, {0, 0, 500, 1000}}, 0},
		// Default: 3x0.5 + 2 + 2x0.1 = 3.7 against 0 + 2 + 2 = 4.
		{"default: kv counts", agg, []c{{0.5, 0, 900, 1000}, {0, 0, 0, 1000}}, 1},
		// Default: 3x0.9 + 2x0 + 2x0.5 = 3.7, 0 + 2x1 + 2x1 = 4 and
		// 0 + 2x0.5 + 2x1 = 3.
		{"default: queue and kv beat a long match", agg, []c{{0.9, 10, 500, 1000}, {0, 0, 0, 1000}, {0, 5, 0, 1000}}, 1},
		// Unknown capacity reads as usage 0 (score 1), usage over capacity
		// is clamped to 1 (score 0).
		{"default: capacity unknown", agg, []c{{0, 0, 5000, 1000}, {0, 0, 5000, 0}}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cands := make([]scheduler.Candidate, len(tt.cs))
			for i, x := range tt.cs {
				cands[i] = cand("http://e"+string(rune('0'+i)), 0)
				cands[i].Prefix = x.prefix
				cands[i].Load = scheduler.Load{Waiting: x.waiting, Tokens: x.tokens, Capacity: x.capacity, Fresh: true}
			}
			if got := pick(t, tt.policy, &scheduler.Request{}, cands); got != tt.want {
				t.Errorf("picked %d, want %d", got, tt.want)
			}
		})
	}
}

func TestLLMDScorers(t *testing.T) {
	for _, tt := range []struct {
		q, lo, hi int
		want      float64
	}{{0, 0, 10, 1}, {5, 0, 10, 0.5}, {10, 0, 10, 0}, {4, 4, 4, 1}} {
		if got := llmdQueueScore(tt.q, tt.lo, tt.hi); got != tt.want {
			t.Errorf("llmdQueueScore(%d, %d, %d) = %v, want %v", tt.q, tt.lo, tt.hi, got, tt.want)
		}
	}
	for _, tt := range []struct {
		l    scheduler.Load
		want float64
	}{
		{scheduler.Load{Tokens: 250, Capacity: 1000}, 0.25},
		{scheduler.Load{Tokens: 2000, Capacity: 1000}, 1},
		{scheduler.Load{Tokens: 2000}, 0},
	} {
		if got := llmdKVUsage(&tt.l); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("llmdKVUsage(%+v) = %v, want %v", tt.l, got, tt.want)
		}
	}
}

// TestLLMDTies checks the max-score picker's tie rule: equal totals go to a
// random candidate (it shuffles before sorting), reproducibly.
func TestLLMDTies(t *testing.T) {
	cands := []scheduler.Candidate{cand("http://a", 0), cand("http://b", 0), cand("http://c", 0)}
	cands[2].Load.Waiting = 3 // c scores lower
	draw := func() (seq []int) {
		p, _ := New("llmd_epp", scheduler.RoleDecode)
		for range 40 {
			seq = append(seq, pick(t, p, &scheduler.Request{}, cands))
		}
		return seq
	}
	seen := reproducibleChoices(t, draw)
	if seen[0] == 0 || seen[1] == 0 || seen[2] != 0 {
		t.Errorf("choices %v: want a and b, never c", seen)
	}
}
