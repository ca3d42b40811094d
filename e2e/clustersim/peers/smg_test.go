package peers

import (
	"fmt"
	"testing"
	"time"

	"github.com/duet-router/duet/scheduler"
)

// TestSMGSelect checks cache_aware's choice (smgSelect) on hand-built
// workers: the threshold, the least-loaded holder, the per-request spill
// gate against the mean and its two margins, and the min-load tie-break.
func TestSMGSelect(t *testing.T) {
	type w struct {
		load, processed int
		prefix          float64
	}
	for _, tt := range []struct {
		name string
		ws   []w
		want int
	}{
		{"no match: least loaded", []w{{5, 0, 0}, {2, 0, 0}, {3, 0, 0}}, 1},
		{"match at the threshold is not above it", []w{{5, 0, 0.3}, {2, 0, 0}}, 1},
		{"match above the threshold wins over load", []w{{5, 0, 0.31}, {2, 0, 0}}, 0},
		{"least-loaded holder of the longest match", []w{{9, 0, 0.8}, {5, 0, 0.8}, {0, 0, 0.5}}, 1},
		// Two workers, the holder carrying L, the other none: mean L/2, so
		// the gate needs L > 1.5 L/2 (always) and L > L/2 + 64, L > 128.
		{"holder at 128 of 2 workers keeps the request", []w{{128, 0, 1}, {0, 0, 0}}, 0},
		{"holder at 129 of 2 workers spills", []w{{129, 0, 1}, {0, 0, 0}}, 1},
		// Only the relative margin clears: mean 2.5, 10 > 3.75 but not > 66.5.
		{"small counts never spill", []w{{10, 0, 1}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}, 0},
		// Only the absolute margin clears: mean 190, 280 > 254 but not > 285.
		{"busy fleet: 1.5x the mean needed", []w{{280, 0, 1}, {160, 0, 0}, {160, 0, 0}, {160, 0, 0}}, 0},
		// Mean 220: 400 > 330 and 400 > 284.
		{"busy fleet: both margins cleared", []w{{400, 0, 1}, {160, 0, 0}, {160, 0, 0}, {160, 0, 0}}, 1},
		// The gate tests the chosen holder (190; mean 98.25): it spills to
		// the least-loaded worker, not to another holder.
		{"spill goes to the least loaded, not the next holder", []w{{200, 0, 1}, {190, 0, 1}, {0, 0, 0}, {3, 0, 0}}, 2},
		{"load tie: fewer processed", []w{{1, 7, 0}, {1, 3, 0}, {1, 5, 0}}, 1},
		{"load and processed tie: first", []w{{1, 3, 0}, {1, 3, 0}}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ws := make([]smgWorker, len(tt.ws))
			for i, x := range tt.ws {
				ws[i] = smgWorker{cand: i, load: x.load, processed: x.processed, prefix: x.prefix}
			}
			if got := smgSelect(ws, newRand("test", "")); got != tt.want {
				t.Errorf("smgSelect = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestSMGHolderTiesAreRandom checks that equally loaded holders of the
// longest match share the requests (argmax_with_random_ties), and that the
// draw is the same for every fresh generator.
func TestSMGHolderTiesAreRandom(t *testing.T) {
	ws := []smgWorker{{cand: 0, prefix: 1}, {cand: 1, prefix: 1}, {cand: 2, prefix: 0}}
	draw := func() (seq []int) {
		rng := newRand("test", "")
		for range 60 {
			seq = append(seq, smgSelect(ws, rng))
		}
		return seq
	}
	seen := reproducibleChoices(t, draw)
	if seen[0] == 0 || seen[1] == 0 || seen[2] != 0 {
		t.Errorf("choices %v: want both holders and never the non-holder", seen)
	}
}

// TestSMGCacheAwareSpillsAndReturns drives the policy through Pick and
// ObserveLeg: a prompt cached on one of four ranks stays there while its
// in-flight count is within the gate, spills to the least-loaded ranks
// once the count is over 1.5x and 64 above the mean, and comes back when
// legs end.
func TestSMGCacheAwareSpillsAndReturns(t *testing.T) {
	p, _ := New("smg_cache_aware", scheduler.RolePrefill)
	cands := []scheduler.Candidate{cand("http://a", 0), cand("http://b", 0), cand("http://a", 1), cand("http://b", 1)}
	cands[0].Prefix = 0.9
	var got []int
	for i := range 90 {
		got = append(got, pick(t, p, &scheduler.Request{ID: fmt.Sprint(i)}, cands))
	}
	// Holder load L against mean L/4 (the others idle): the gate opens at
	// 0.75 L > 64, L = 86. Picks 0-85 stay; pick 86 spills to candidate 1;
	// then loads 86,1,0,0 (mean 21.75, 86 > 85.75) spill again to 2; then
	// 86,1,1,0 (mean 22, 86 is not > 86) stays; then 87,1,1,0 spills to 3.
	for i := range 86 {
		if got[i] != 0 {
			t.Fatalf("pick %d went to %d, want the holder 0: %v", i, got[i], got)
		}
	}
	if want := []int{1, 2, 0, 3}; fmt.Sprint(got[86:]) != fmt.Sprint(want) {
		t.Errorf("picks 86-89 = %v, want %v", got[86:], want)
	}
	// Ten of the holder's legs end: 77 in flight against a mean of 20, under
	// the gate (77 is not above 84).
	for i := range 10 {
		p.(scheduler.LegObserver).ObserveLeg(leg(fmt.Sprint(i), scheduler.RolePrefill, cands[0]))
	}
	if i := pick(t, p, &scheduler.Request{ID: "after"}, cands); i != 0 {
		t.Errorf("after ten legs ended: picked %d, want the holder 0", i)
	}
	if l := p.(*smgPolicy).load[cands[0].Key()]; l != 78 {
		t.Errorf("holder's in-flight count %d, want 78", l)
	}
}

// TestSMGNewPairHoldsPrefillUntilDecodeEnds checks NewPair: the prefill
// worker's count lasts until the request's decode leg ends, in either
// report order, and a pick without a request ID ends with its own leg.
func TestSMGNewPairHoldsPrefillUntilDecodeEnds(t *testing.T) {
	for _, name := range []string{"smg_cache_aware", "smg_dp_min_tokens"} {
		pp, dp, err := NewPair(name)
		if err != nil {
			t.Fatal(err)
		}
		pre, dec := pp.(*smgPolicy), dp.(*smgPolicy)
		pc := []scheduler.Candidate{cand("http://p", 0)}
		dc := []scheduler.Candidate{cand("http://d", 0)}
		pk, dk := pre.workerKey(pc[0].Key()), dec.workerKey(dc[0].Key())
		now := time.Unix(0, 0)
		for _, id := range []string{"r1", "r2", ""} {
			pick(t, pp, &scheduler.Request{ID: id, Now: now}, pc)
			pick(t, dp, &scheduler.Request{ID: id, Now: now}, dc)
		}
		if pre.load[pk] != 3 || dec.load[dk] != 3 {
			t.Fatalf("%s: loads %d/%d, want 3/3", name, pre.load[pk], dec.load[dk])
		}
		// r1: prefill leg ends first (the usual order); its count stays.
		pre.ObserveLeg(leg("r1", scheduler.RolePrefill, pc[0]))
		if pre.load[pk] != 3 {
			t.Errorf("%s: prefill leg r1 ended: prefill load %d, want still 3", name, pre.load[pk])
		}
		dec.ObserveLeg(leg("r1", scheduler.RoleDecode, dc[0]))
		if pre.load[pk] != 2 || dec.load[dk] != 2 {
			t.Errorf("%s: request r1 ended: loads %d/%d, want 2/2", name, pre.load[pk], dec.load[dk])
		}
		// r2: decode leg reported first; the later prefill report is a no-op.
		dec.ObserveLeg(leg("r2", scheduler.RoleDecode, dc[0]))
		pre.ObserveLeg(leg("r2", scheduler.RolePrefill, pc[0]))
		if pre.load[pk] != 1 || dec.load[dk] != 1 {
			t.Errorf("%s: request r2 ended: loads %d/%d, want 1/1", name, pre.load[pk], dec.load[dk])
		}
		// No request ID: the scheduler reports a generated one, so the
		// prefill count ends with the prefill leg.
		pre.ObserveLeg(leg("anonymous-1", scheduler.RolePrefill, pc[0]))
		dec.ObserveLeg(leg("anonymous-1", scheduler.RoleDecode, dc[0]))
		if pre.load[pk] != 0 || dec.load[dk] != 0 {
			t.Errorf("%s: all ended: loads %d/%d, want 0/0", name, pre.load[pk], dec.load[dk])
		}
		if len(pre.releasedEarly) != 0 || len(pre.holds.byID) != 0 || len(dec.holds.byID) != 0 {
			t.Errorf("%s: leftover state %v %v %v", name, pre.releasedEarly, pre.holds.byID, dec.holds.byID)
		}
	}
	// New (unpaired) releases the prefill count with the prefill leg.
	p, _ := New("smg_cache_aware", scheduler.RolePrefill)
	c := []scheduler.Candidate{cand("http://p", 0)}
	pick(t, p, &scheduler.Request{ID: "r"}, c)
	p.(scheduler.LegObserver).ObserveLeg(leg("r", scheduler.RolePrefill, c[0]))
	if l := p.(*smgPolicy).load[c[0].Key()]; l != 0 {
		t.Errorf("unpaired prefill: load %d after its leg ended, want 0", l)
	}
}

// TestSMGDPMinTokens checks smg_dp_min_tokens: cache_aware chooses the
// engine from engine-level counts and the best match over its ranks, then
// MinimumTokensPolicy chooses the rank with the least polled tokens plus
// the costs added since, ties to the lower rank, re-polling every 10 s.
func TestSMGDPMinTokens(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prompt := []byte("user\none two three four five six seven eight nine\n") // 10 words: cost 13
	mk := func(scraped ...int64) []scheduler.Candidate {
		// Two engines of two ranks, rank-major: a/0, b/0, a/1, b/1.
		cs := []scheduler.Candidate{cand("http://a", 0), cand("http://b", 0), cand("http://a", 1), cand("http://b", 1)}
		for i := range cs {
			cs[i].Load = scheduler.Load{Fresh: true, Scraped: scraped[i]}
		}
		return cs
	}
	req := func(id string, at time.Time) *scheduler.Request {
		return &scheduler.Request{ID: id, Prompt: prompt, Now: at}
	}

	t.Run("engine by cache, rank by tokens", func(t *testing.T) {
		p, _ := New("smg_dp_min_tokens", scheduler.RolePrefill)
		cs := mk(0, 500, 0, 100)
		cs[3].Prefix = 0.8 // b's rank 1 holds the prompt: engine b
		if i := pick(t, p, req("1", t0), cs); i != 3 {
			t.Errorf("picked %d, want 3 (engine b, its rank with fewer tokens)", i)
		}
		if l := p.(*smgPolicy).load[scheduler.TargetKey{URL: "http://b", Rank: scheduler.NoRank}]; l != 1 {
			t.Errorf("engine b's in-flight count %d, want 1", l)
		}
	})

	t.Run("ties to the lower rank, costs accumulate", func(t *testing.T) {
		p, _ := New("smg_dp_min_tokens", scheduler.RoleDecode)
		cs := mk(0, 0, 0, 0)
		one := []scheduler.Candidate{cs[0], cs[2]} // engine a only
		var got []int
		for i := range 5 {
			got = append(got, one[pick(t, p, req(fmt.Sprint(i), t0), one)].Rank)
		}
		if fmt.Sprint(got) != "[0 1 0 1 0]" {
			t.Errorf("ranks %v, want [0 1 0 1 0]", got)
		}
		if m := p.(*smgPolicy).ranks.loads["http://a"]; m[0] != 39 || m[1] != 26 {
			t.Errorf("cached loads %v, want rank 0: 3x13, rank 1: 2x13", m)
		}
	})

	t.Run("poll every 10 s", func(t *testing.T) {
		p, _ := New("smg_dp_min_tokens", scheduler.RoleDecode)
		one := func(s0, s1 int64) []scheduler.Candidate {
			cs := mk(s0, 0, s1, 0)
			return []scheduler.Candidate{cs[0], cs[2]}
		}
		rankAt := func(id string, at time.Time, cs []scheduler.Candidate) int {
			return cs[pick(t, p, req(id, at), cs)].Rank
		}
		// Polled at t0: rank 0 has 100 used tokens. Rank 1 takes the
		// requests until its added costs pass 100 (8 x 13 = 104).
		cs := one(100, 0)
		for i := range 8 {
			if r := rankAt(fmt.Sprint(i), t0.Add(time.Duration(i)*time.Second), cs); r != 1 {
				t.Fatalf("pick %d at +%ds: rank %d, want 1", i, i, r)
			}
		}
		// The engines' numbers change, but no poll is due before t0+10s:
		// rank 0 (100) is now below rank 1 (104).
		cs = one(5000, 0)
		if r := rankAt("9", t0.Add(9*time.Second), cs); r != 0 {
			t.Errorf("at +9s: rank %d, want 0 (the cache from t0, with costs)", r)
		}
		// At t0+10s the poll replaces the cache: 5000 against 0.
		if r := rankAt("10", t0.Add(10*time.Second), cs); r != 1 {
			t.Errorf("at +10s: rank %d, want 1 (fresh poll)", r)
		}
		// A rank without a fresh scrape keeps its polled value.
		cs = one(0, 0)
		cs[0].Load.Fresh = false
		if r := rankAt("20", t0.Add(25*time.Second), cs); r != 1 {
			t.Errorf("at +25s, rank 0 stale: rank %d, want 1 (rank 0 keeps 5000)", r)
		}
		if m := p.(*smgPolicy).ranks.loads["http://a"]; m[0] != 5000 || m[1] != 13 {
			t.Errorf("cache %v, want rank 0 5000 (kept), rank 1 13 (polled 0, +13)", m)
		}
	})
}

func TestSMGEstimatedCost(t *testing.T) {
	for _, tt := range []struct {
		req  scheduler.Request
		want int64
	}{
		{scheduler.Request{}, 1},
		{scheduler.Request{Prompt: []byte("hello")}, 2},                      // ceil(1.3)
		{scheduler.Request{Prompt: []byte("a b c d e f g h i j")}, 13},       // ceil(13.0)
		{scheduler.Request{Prompt: []byte("a b c"), PromptTokens: 1000}, 4},  // words, not tokens
		{scheduler.Request{TokenIDs: make([]int64, 100), Prompt: nil}, 130},  // one word per id
		{scheduler.Request{TokenIDs: make([]int64, 7), PromptTokens: 7}, 10}, // ceil(9.1)
	} {
		if got := smgEstimatedCost(&tt.req); got != tt.want {
			t.Errorf("smgEstimatedCost(%q, %d ids) = %d, want %d", tt.req.Prompt, len(tt.req.TokenIDs), got, tt.want)
		}
	}
}
