package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// costCands returns prefill candidates on engines (one URL each, given by
// engine index), each with its cached tokens and scraped pending tokens.
func costCands(specs ...struct {
	engine         int
	cached, queued int64
}) []Candidate {
	eps := map[int]*Endpoint{}
	out := make([]Candidate, len(specs))
	for i, s := range specs {
		ep := eps[s.engine]
		if ep == nil {
			ep = &Endpoint{Role: RolePrefill, URL: "http://e" + string(rune('0'+s.engine)), Ready: true}
			eps[s.engine] = ep
		}
		out[i] = Candidate{Target: Target{Endpoint: ep, Rank: i}, CachedTokens: s.cached,
			Load: Load{Scraped: s.queued, Tokens: s.queued, Fresh: true}}
	}
	return out
}

type costSpec = struct {
	engine         int
	cached, queued int64
}

// TestLeastCostPrefillPricesTheTrade checks the prefill price: a cached
// prefix wins while the queue in front of it is shorter than what it saves,
// and loses once the queue is longer.
func TestLeastCostPrefillPricesTheTrade(t *testing.T) {
	tests := []struct {
		name   string
		prompt int64
		cands  []costSpec
		want   int
	}{
		{"idle pool, no cache: the earliest", 4096, []costSpec{{0, 0, 0}, {0, 0, 0}, {1, 0, 0}}, 0},
		{"cached rank, idle: follow the cache", 8192, []costSpec{{0, 0, 0}, {0, 6144, 0}, {1, 0, 0}}, 1},
		{"cached rank, short queue: still follow (3072 + 3×2048 < 3×8192)", 8192, []costSpec{{0, 0, 0}, {0, 6144, 3072}, {1, 0, 0}}, 1},
		// Counted once, the 6144 tokens saved would not pay for the 9216
		// queued; they are also work later requests would wait for.
		{"cached rank, queue longer than the hit: follow (9216 + 3×2048 < 3×8192)", 8192, []costSpec{{0, 0, 0}, {0, 6144, 9216}, {1, 0, 0}}, 1},
		// Counted twice (the weight before issue 28), the conversation
		// moved here (14336 + 2×2048 > 2×8192) and recomputed its history.
		{"cached rank, queue twice the hit: follow (14336 + 3×2048 < 3×8192)", 8192, []costSpec{{0, 0, 0}, {0, 6144, 14336}, {1, 0, 0}}, 1},
		{"cached rank, long queue: leave it (20480 + 3×2048 > 3×8192)", 8192, []costSpec{{0, 0, 0}, {0, 6144, 20480}, {1, 0, 0}}, 0},
		{"partly cached everywhere: the larger hit", 8192, []costSpec{{0, 1024, 0}, {1, 4096, 0}}, 1},
		{"the shorter queue when nothing is cached", 2048, []costSpec{{0, 0, 4096}, {1, 0, 1024}, {1, 0, 2048}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "least_cost", Role: RolePrefill})
			req := &Request{PromptTokens: tt.prompt, Now: time.Unix(100, 0)}
			if got := mustPick(t, p, req, costCands(tt.cands...)); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestLeastCostCountsWorkInFlight checks the wait: duet's own in-flight
// work (reservations less believed-cached prefixes) counts even where the
// engine reports nothing pending (a prompt leaves SGLang's queue when its
// prefill starts); the engine's report counts less the cached part of
// duet's own reservations, which it counts while they wait; the larger of
// the two counts.
func TestLeastCostCountsWorkInFlight(t *testing.T) {
	tests := []struct {
		name                      string
		reserved0, work0, scrape0 int64
		reserved1, work1, scrape1 int64
		want                      int
	}{
		{"work in flight, nothing reported", 8192, 8192, 0, 0, 0, 0, 1},
		{"reported pending, no work of duet's", 0, 0, 8192, 0, 0, 0, 1},
		{"the larger of the two", 1024, 1024, 0, 0, 0, 4096, 0},
		{"equal: the earliest", 2048, 2048, 0, 0, 0, 2048, 0},
		// Rank 0 waits on 8192 reported tokens, 7168 of them prefixes
		// duet's own requests find cached: 1024 of work, against 2048.
		{"the engine's count less duet's cached prefixes", 8192, 1024, 8192, 2048, 2048, 2048, 0},
		{"traffic duet did not send still counts", 1024, 1024, 8192, 2048, 2048, 2048, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "least_cost", Role: RolePrefill})
			cands := costCands(costSpec{0, 0, tt.scrape0}, costSpec{1, 0, tt.scrape1})
			cands[0].Load.Reserved, cands[0].Load.ReservedWork = tt.reserved0, tt.work0
			cands[1].Load.Reserved, cands[1].Load.ReservedWork = tt.reserved1, tt.work1
			if got := mustPick(t, p, &Request{PromptTokens: 2048}, cands); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestLeastCostPricesEvictionWhereTheCacheIsFull checks the reuse term: on a
// workload that reuses its prefixes, moving a conversation to an idle rank
// is cheap while that rank's cache has room for it, and priced by what it
// evicts once the cache is full. Ties go to the emptier cache.
func TestLeastCostPricesEvictionWhereTheCacheIsFull(t *testing.T) {
	warm := func() Policy {
		p := mustPolicy(t, PolicySpec{Name: "least_cost", Role: RolePrefill})
		for i := range 300 {
			mustPick(t, p, &Request{PromptTokens: 4096, Now: time.Unix(int64(i), 0)}, costCands(costSpec{0, 3584, 0}, costSpec{1, 0, 0}))
		}
		return p
	}
	tests := []struct {
		name             string
		indexed, capable int64 // rank 1's indexed tokens and KV capacity
		want             int
	}{
		// Rank 0: 12288 queued + 512 own; rank 1: 4096 own; reuse 0.875.
		{"room on the idle rank: move (12288 + 512×4.75 > 4096×3)", 0, 150000, 1},
		{"idle rank's cache full: stay (12288 + 512×4.75 < 4096×4.75)", 150000, 150000, 0},
		{"capacity unknown: priced as full", 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := costCands(costSpec{0, 3584, 12288}, costSpec{1, 0, 0})
			cands[0].Load.Capacity, cands[0].IndexedTokens = 150000, 150000
			cands[1].Load.Capacity, cands[1].IndexedTokens = tt.capable, tt.indexed
			if got := mustPick(t, warm(), &Request{PromptTokens: 4096, Now: time.Unix(1000, 0)}, cands); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}

	cands := costCands(costSpec{0, 0, 0}, costSpec{0, 0, 0}, costSpec{1, 0, 0})
	cands[0].IndexedTokens, cands[1].IndexedTokens, cands[2].IndexedTokens = 9000, 1000, 5000
	if got := mustPick(t, mustPolicy(t, PolicySpec{Name: "least_cost", Role: RolePrefill}), &Request{PromptTokens: 4096}, cands); got != 1 {
		t.Errorf("tie: Pick = %d, want 1 (the emptiest cache)", got)
	}
}

// TestLeastCostTiesGoToRecentWork checks the prefill tie-break: among
// candidates of equal price, the one sent the least prefill work lately
// (decayed with recentWorkTau), then the emptiest cache, then the
// earliest.
func TestLeastCostTiesGoToRecentWork(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type pick struct {
		prompt int64
		at     time.Duration // after t0
	}
	tests := []struct {
		name    string
		before  []pick // earlier picks among the same idle candidates
		indexed [3]int64
		want    int
	}{
		{"nothing sent yet: the emptiest cache", nil, [3]int64{9000, 1000, 5000}, 1},
		{"nothing sent yet, equal caches: the earliest", nil, [3]int64{}, 0},
		// The first pick takes rank 0, the second rank 1 (0 was sent 2048).
		{"the rank sent nothing lately", []pick{{2048, 0}, {2048, 0}}, [3]int64{}, 2},
		// Ranks 0 and 1 were sent 4096 and 2048, 1 s apart; the emptiest
		// cache no longer decides.
		{"the least work sent, before the emptiest cache", []pick{{4096, 0}, {2048, time.Second}, {8192, time.Second}}, [3]int64{0, 9000, 0}, 1},
		// 4096 sent to rank 0 five minutes ago has decayed below the 2048
		// sent to ranks 1 and 2 a second ago (4096 × e^-10 < 1).
		{"old work decays", []pick{{4096, 0}, {2048, 299 * time.Second}, {2048, 299 * time.Second}}, [3]int64{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "least_cost", Role: RolePrefill})
			for _, b := range tt.before {
				mustPick(t, p, &Request{PromptTokens: b.prompt, Now: t0.Add(b.at)}, costCands(costSpec{0, 0, 0}, costSpec{0, 0, 0}, costSpec{1, 0, 0}))
			}
			cands := costCands(costSpec{0, 0, 0}, costSpec{0, 0, 0}, costSpec{1, 0, 0})
			for i := range cands {
				cands[i].IndexedTokens = tt.indexed[i]
			}
			if got := mustPick(t, p, &Request{PromptTokens: 1024, Now: t0.Add(300 * time.Second)}, cands); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestLeastCostLearnsReuse checks the reuse rate: it stays zero on
// prompts that share nothing and grows when the candidates cache most of
// each prompt, which makes a cached rank worth a longer queue.
func TestLeastCostLearnsReuse(t *testing.T) {
	cold := mustPolicy(t, PolicySpec{Name: "least_cost", Role: RolePrefill}).(*leastCost)
	warm := mustPolicy(t, PolicySpec{Name: "least_cost", Role: RolePrefill}).(*leastCost)
	for i := range 300 {
		now := time.Unix(int64(i), 0)
		mustPick(t, cold, &Request{PromptTokens: 4096, Now: now}, costCands(costSpec{0, 0, 0}, costSpec{1, 0, 0}))
		mustPick(t, warm, &Request{PromptTokens: 4096, Now: now}, costCands(costSpec{0, 3584, 0}, costSpec{1, 0, 0}))
	}
	if cold.reuse != 0 {
		t.Errorf("reuse without shared prefixes = %v, want 0", cold.reuse)
	}
	if warm.reuse < 0.8 {
		t.Errorf("reuse with 7/8 cached = %v, want about 0.875", warm.reuse)
	}
	// Cached rank queued 12288 tokens + 512 own, against 4096 own idle:
	// without reuse it leaves (12288 + 512×3 > 4096×3); priced with reuse
	// (the capacity unknown, so every uncached token evicts) it stays
	// (12288 + 512×4.75 < 4096×4.75).
	cands := costCands(costSpec{0, 3584, 12288}, costSpec{1, 0, 0})
	if got := mustPick(t, cold, &Request{PromptTokens: 4096, Now: time.Unix(1000, 0)}, cands); got != 1 {
		t.Errorf("cold policy Pick = %d, want 1", got)
	}
	if got := mustPick(t, warm, &Request{PromptTokens: 4096, Now: time.Unix(1000, 0)}, cands); got != 0 {
		t.Errorf("warm policy Pick = %d, want 0", got)
	}
}

// TestLeastCostDecode checks the decode price: the lockstep term prefers a
// rank on an engine whose heaviest rank already paces it, and KV beyond a
// rank's capacity is expensive.
func TestLeastCostDecode(t *testing.T) {
	a := &Endpoint{Role: RoleDecode, URL: "http://a"}
	b := &Endpoint{Role: RoleDecode, URL: "http://b"}
	cand := func(ep *Endpoint, rank int, tokens, capacity int64) Candidate {
		return Candidate{Target: Target{Endpoint: ep, Rank: rank}, Load: Load{Tokens: tokens, Capacity: capacity, Fresh: true}}
	}
	tests := []struct {
		name  string
		need  int64
		cands []Candidate
		want  int
	}{
		// least_tokens would take a/1 (1000 tokens), whose engine steps at
		// the pace of a/0 (30000); b/1 (2000) steps at b's pace (5000).
		{"lockstep: avoid an engine paced by a heavy rank", 1000,
			[]Candidate{cand(a, 0, 30000, 0), cand(a, 1, 1000, 0), cand(b, 0, 5000, 0), cand(b, 1, 2000, 0)}, 3},
		{"small requests: the least-loaded rank", 100,
			[]Candidate{cand(a, 0, 30000, 0), cand(a, 1, 2000, 0), cand(b, 0, 1000, 0), cand(b, 1, 1500, 0)}, 2},
		{"KV overflow is avoided", 20000,
			[]Candidate{cand(a, 0, 10000, 25000), cand(b, 0, 14000, 150000)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "least_cost", Role: RoleDecode})
			if got := mustPick(t, p, &Request{PromptTokens: tt.need}, tt.cands); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
	if mustPolicy(t, PolicySpec{Name: "least_cost", Role: RoleDecode}).(PrefixReader).ReadsPrefix() {
		t.Error("decode least_cost reads prefixes: the decode index would be kept for nothing")
	}
}

// TestLeastCostDecodeCache checks the decode price on engines with a decode
// radix cache: a rank holding the conversation keeps it while its extra
// load is below what the cache saves, and loses it beyond; the same
// candidates on engines without the cache (or with ignore_decode_cache)
// are priced by load alone.
func TestLeastCostDecodeCache(t *testing.T) {
	radix := func(url string) *Endpoint {
		return &Endpoint{Role: RoleDecode, URL: url, DecodeCache: DecodeCache{Radix: true}}
	}
	plain := func(url string) *Endpoint { return &Endpoint{Role: RoleDecode, URL: url} }
	cand := func(ep *Endpoint, tokens, cached int64) Candidate {
		return Candidate{Target: Target{Endpoint: ep, Rank: 0}, CachedTokens: cached, Load: Load{Tokens: tokens, Capacity: 1000000, Fresh: true}}
	}
	// A 40k-token turn; rank a holds 36k of it. Separate engines, so that
	// the price is 2×after - 8×cached: a wins while
	// 2×(load_a - load_b) < 288k.
	tests := []struct {
		name   string
		a, b   *Endpoint
		loadA  int64
		ignore bool
		want   int
	}{
		{"cache wins over more load", radix("http://a"), radix("http://b"), 130000, false, 0},
		{"load wins past four times the cached prefix", radix("http://a"), radix("http://b"), 150000, false, 1},
		{"no decode cache: load alone", plain("http://a"), plain("http://b"), 10000, false, 1},
		{"ignore_decode_cache: load alone", radix("http://a"), radix("http://b"), 10000, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "least_cost", Role: RoleDecode, IgnoreDecodeCache: tt.ignore})
			cands := []Candidate{cand(tt.a, tt.loadA, 36000), cand(tt.b, 0, 0)}
			if got := mustPick(t, p, &Request{PromptTokens: 40000, MaxTokens: 300}, cands); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
	if !mustPolicy(t, PolicySpec{Name: "least_cost", Role: RoleDecode}).(DecodeCacheReader).ReadsDecodeCache() {
		t.Error("decode least_cost does not read decode caches")
	}
	for _, spec := range []PolicySpec{{Name: "least_cost", Role: RolePrefill}, {Name: "least_cost", Role: RoleDecode, IgnoreDecodeCache: true}} {
		if mustPolicy(t, spec).(DecodeCacheReader).ReadsDecodeCache() {
			t.Errorf("%+v reads decode caches", spec)
		}
	}
}

// TestLeastCostForgetsDepartedTargets checks that the recent work of
// targets that left the pool is forgotten once it has decayed, so that
// endpoint churn does not grow the policy's state without bound.
func TestLeastCostForgetsDepartedTargets(t *testing.T) {
	p, err := newLeastCost(PolicySpec{Role: RolePrefill})
	if err != nil {
		t.Fatal(err)
	}
	lc := p.(*leastCost)
	now := time.Unix(1000, 0)
	for i := range 500 {
		// Each pick sees two fresh endpoints, as in a rollout that
		// replaces every pod, ten minutes apart.
		now = now.Add(10 * time.Minute)
		cands := []Candidate{
			{Target: Target{Endpoint: &Endpoint{URL: fmt.Sprintf("http://a%d", i)}, Rank: 0}},
			{Target: Target{Endpoint: &Endpoint{URL: fmt.Sprintf("http://b%d", i)}, Rank: 0}},
		}
		if _, err := p.Pick(context.Background(), &Request{PromptTokens: 100, Now: now}, cands); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(lc.recent); n > 2*2+64+1 {
		t.Fatalf("recent work kept for %d targets after 500 picks on ever-new endpoints", n)
	}
}
