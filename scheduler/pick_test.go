package scheduler

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/duet-router/duet/scheduler/load"
)

// leastTokens builds a scheduler whose decode pool (n engines × dp ranks)
// uses least_tokens, with scraping left to the test.
func leastTokensScheduler(t *testing.T, n, dp int, reg prometheus.Registerer) *Scheduler {
	t.Helper()
	s := newTestScheduler(t, Config{
		Decode:       enginePool(t, n, dp, "null"),
		DecodePolicy: PolicySpec{Name: "least_tokens"},
		Registerer:   reg,
	}, nil)
	mustDiscover(t, s)
	return s
}

// Concurrent picks never see the same minimum: with equal requests, every
// target ends with exactly the same number of reservations.
func TestPickReservesAtomically(t *testing.T) {
	s := leastTokensScheduler(t, 2, 4, nil)
	const workers, each = 8, 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[string]int{}
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				d, err := s.Pick(testContext(t), &Request{ID: fmt.Sprintf("w%d-%d", w, i), Prompt: make([]byte, 400)})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				counts[d.Decode.String()]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(counts) != 8 {
		t.Fatalf("picks reached %d targets, want 8: %v", len(counts), counts)
	}
	for target, n := range counts {
		if n != workers*each/8 {
			t.Errorf("%s got %d picks, want exactly %d: %v", target, n, workers*each/8, counts)
		}
	}
}

// Ties break deterministically: with equal loads the earliest target wins,
// and the same sequence of requests gives the same sequence of targets.
func TestPickDeterministicTies(t *testing.T) {
	run := func() []string {
		s := leastTokensScheduler(t, 2, 2, nil)
		var seq []string
		for i := range 6 {
			d, err := s.Pick(testContext(t), &Request{ID: fmt.Sprint(i), Prompt: []byte("same size")})
			if err != nil {
				t.Fatal(err)
			}
			seq = append(seq, fmt.Sprintf("%d/%d", s.snap.Load().decode.index[d.Decode.Key()], d.Decode.Rank))
		}
		return seq
	}
	a, b := run(), run()
	if fmt.Sprint(a) != fmt.Sprint(b) || a[0] != "0/0" {
		t.Errorf("tie-breaking not deterministic or not earliest-first: %v vs %v", a, b)
	}
}

// A request without text still reserves tokens (a seed bug reserved zero,
// so a burst of such requests all landed on one rank).
func TestPickNeverReservesZero(t *testing.T) {
	s := leastTokensScheduler(t, 1, 2, nil)
	seen := map[int]bool{}
	for i := range 4 {
		d, err := s.Pick(testContext(t), &Request{ID: fmt.Sprint(i), Path: "/v1/chat/completions"})
		if err != nil {
			t.Fatal(err)
		}
		seen[d.Decode.Rank] = true
	}
	if len(seen) != 2 {
		t.Errorf("empty prompts all went to ranks %v: nothing was reserved", seen)
	}
	s.ledger.mu.Lock()
	defer s.ledger.mu.Unlock()
	for _, ts := range s.snap.Load().decode.states {
		if ts.reserved <= 0 {
			t.Errorf("%s reserved %d tokens", ts.label, ts.reserved)
		}
	}
}

// Feedback releases a request's reservation; the decode hold includes the
// expected output.
func TestPickFeedbackReleases(t *testing.T) {
	s := leastTokensScheduler(t, 1, 1, nil)
	d, err := s.Pick(testContext(t), &Request{ID: "r", Prompt: make([]byte, 400), MaxTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	ts := s.snap.Load().decode.states[0]
	if got := ts.reserved; got != 100+100 {
		t.Fatalf("decode reservation %d, want 100 prompt + 100 output tokens", got)
	}
	s.Complete(Feedback{RequestID: "r", Role: RoleDecode, Address: d.Decode.Endpoint.Address, Rank: d.Decode.Rank, PromptTokens: 80})
	if ts.reserved != 0 {
		t.Errorf("reservation %d after feedback", ts.reserved)
	}
	s.Complete(Feedback{RequestID: "r", PromptTokens: 80})
	// 400 bytes reported as 80 tokens: 5 characters per token, up from 4.
	if r := s.tokens.Ratio(""); r <= 4.0 || r >= 5.0 {
		t.Errorf("the reported usage did not move the ratio toward 5: %.2f", r)
	}
}

// A scrape that started after the request reached the engine replaces the
// reservation with the engine's own numbers; the engine's load steers picks.
func TestPickFollowsScrapedLoad(t *testing.T) {
	loads := `{"loads":[{"dp_rank":0,"num_used_tokens":5000,"num_total_tokens":5000,"max_total_num_tokens":100000},` +
		`{"dp_rank":1,"num_used_tokens":10,"num_total_tokens":10,"max_total_num_tokens":100000}]}`
	eng := newFakeEngine(t, map[string]response{"/server_info": ok(info(2, "null", -1)), "/v1/loads": ok(loads)})
	s := newTestScheduler(t, Config{
		Decode:       []EndpointSpec{{URL: eng.url()}},
		DecodePolicy: PolicySpec{Name: "least_tokens"},
		Load:         LoadConfig{CoverDelay: time.Millisecond},
	}, nil)
	mustDiscover(t, s)
	s.ScrapeLoads(testContext(t))
	for i := range 5 {
		d, err := s.Pick(testContext(t), &Request{ID: fmt.Sprint(i), Prompt: make([]byte, 400)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Decode.Rank != 1 {
			t.Fatalf("pick %d went to rank %d, the loaded one", i, d.Decode.Rank)
		}
	}
	time.Sleep(5 * time.Millisecond)
	s.ScrapeLoads(testContext(t)) // covers the five reservations
	ts := s.snap.Load().decode.states[s.snap.Load().decode.index[TargetKey{URL: eng.url(), Rank: 1}]]
	s.ledger.mu.Lock()
	ld := s.ledger.load(ts, time.Now())
	s.ledger.mu.Unlock()
	if ld.Reserved != 0 || ld.Tokens != 10 || !ld.Fresh || ld.Capacity != 100000 {
		t.Errorf("after a covering scrape: %+v, want the engine's 10 tokens only", ld)
	}
}

// When an endpoint stops being schedulable its targets leave the ledger and
// the prefix index at once, reservations included.
func TestPickEvictsRemovedEndpoint(t *testing.T) {
	eng := newFakeEngine(t, serverInfo200(info(2, "null", -1)))
	other := newFakeEngine(t, serverInfo200(info(1, "null", -1)))
	s := newTestScheduler(t, Config{
		Decode:       []EndpointSpec{{URL: eng.url()}, {URL: other.url()}},
		DecodePolicy: PolicySpec{Name: "cache_aware"}, // a policy that reads the prefix index
	}, nil)
	mustDiscover(t, s)
	if _, err := s.Pick(testContext(t), &Request{ID: "r", Prompt: make([]byte, 640)}); err != nil {
		t.Fatal(err)
	}
	key := TargetKey{URL: eng.url(), Rank: 0}
	if s.index.Blocks(key) == 0 || len(s.ledger.requests) != 1 {
		t.Fatalf("setup: blocks %d requests %d", s.index.Blocks(key), len(s.ledger.requests))
	}
	eng.set(map[string]response{"/server_info": {status: 500}, "/get_server_info": {status: 500}})
	// Without a configured DP size the endpoint keeps its last known values,
	// so take it out the way discovery does when nothing is known.
	s.discoverMu.Lock()
	s.members[0].cur.Ready = false
	s.publish()
	s.discoverMu.Unlock()
	s.ledger.mu.Lock()
	_, present := s.ledger.targets[key]
	s.ledger.mu.Unlock()
	if present || s.index.Blocks(key) != 0 {
		t.Errorf("removed target still known: ledger %v, %d prefix blocks", present, s.index.Blocks(key))
	}
	if d, err := s.Pick(testContext(t), &Request{ID: "r2"}); err != nil || d.Decode.Endpoint.URL != other.url() {
		t.Errorf("pick after removal = %v, %v", d.Decode, err)
	}
}

// The metrics name every target and count picks.
func TestPickMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := leastTokensScheduler(t, 1, 2, reg)
	for i := range 3 {
		if _, err := s.Pick(testContext(t), &Request{ID: fmt.Sprint(i), Prompt: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := testutil.GatherAndCount(reg, "duet_picks_total", "duet_target_tokens", "duet_pick_duration_seconds", "duet_reservations")
	if err != nil {
		t.Fatal(err)
	}
	// 2 pick counters + 2 targets × 2 kinds + 1 histogram + 1 gauge.
	if n != 8 {
		t.Errorf("%d series, want 8", n)
	}
	if got := testutil.ToFloat64(s.metrics.picks.WithLabelValues("decode", "least_tokens", s.snap.Load().decode.targets[0].String())); got != 2 {
		t.Errorf("picks of the first target = %v, want 2", got)
	}
}

// With EngineRanks, duet chooses engines only: one NoRank target each.
func TestPickEngineRanks(t *testing.T) {
	s := newTestScheduler(t, Config{
		Prefill:     enginePool(t, 2, 4, "prefill"),
		Decode:      enginePool(t, 2, 4, "decode"),
		EngineRanks: true,
	}, nil)
	mustDiscover(t, s)
	snap := s.snap.Load()
	if len(snap.prefill.targets) != 2 || len(snap.decode.targets) != 2 {
		t.Fatalf("targets: %d prefill, %d decode; want one per engine", len(snap.prefill.targets), len(snap.decode.targets))
	}
	d, err := s.Pick(testContext(t), &Request{ID: "r", Prompt: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if d.Prefill.Rank != NoRank || d.Decode.Rank != NoRank {
		t.Errorf("ranks pinned: prefill %d decode %d", d.Prefill.Rank, d.Decode.Rank)
	}
}

// A prefill rank's load is its pending prefill tokens; a decode rank's is
// all its tokens (KV in use plus pending).
func TestRankLoadOfByRole(t *testing.T) {
	r := load.Rank{Rank: 1, UsedTokens: 9000, TotalTokens: 9500, MaxTotalTokens: 100000, HasTokens: true}
	prefill := &Endpoint{Role: RolePrefill, URL: "http://p:1", DPSize: 4}
	decode := &Endpoint{Role: RoleDecode, URL: "http://d:1", DPSize: 4}
	if got := rankLoadOf(prefill, r).tokens; got != 500 {
		t.Errorf("prefill load %d, want the 500 pending tokens", got)
	}
	if got := rankLoadOf(decode, r).tokens; got != 9500 {
		t.Errorf("decode load %d, want 9500", got)
	}
	single := &Endpoint{Role: RoleDecode, URL: "http://d:2", DPSize: 1}
	if got := rankLoadOf(single, load.Rank{Rank: 0, HasTokens: true}).key.Rank; got != NoRank {
		t.Errorf("single-rank decode target rank %d, want NoRank", got)
	}
	vllm := rankLoadOf(decode, load.Rank{Rank: 0, Running: 3, KVUsage: 0.5})
	if vllm.tokens != 0 || vllm.running != 3 {
		t.Errorf("vLLM rank load %+v, want request counts only", vllm)
	}
}

// Picks record prompts in the prefix index only for a role whose policy
// reads prefix matches: for the others it would be work for nothing.
func TestPrefixIndexOnlyForPrefixReaders(t *testing.T) {
	tests := []struct {
		policy PolicySpec
		want   bool
	}{
		{PolicySpec{Name: "least_tokens"}, false},
		{PolicySpec{Name: "round_robin"}, false},
		{PolicySpec{Name: "cache_aware"}, true},
		{PolicySpec{Name: "weighted", Weights: map[string]float64{"tokens": 1, "prefix": 1}}, true},
		{PolicySpec{Name: "weighted", Weights: map[string]float64{"tokens": 1}}, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.policy.Name, tt.policy.Weights), func(t *testing.T) {
			eng := newFakeEngine(t, serverInfo200(info(1, "null", -1)))
			s := newTestScheduler(t, Config{Decode: []EndpointSpec{{URL: eng.url()}}, DecodePolicy: tt.policy}, nil)
			mustDiscover(t, s)
			d, err := s.Pick(testContext(t), &Request{ID: "r", Prompt: make([]byte, 640)})
			if err != nil {
				t.Fatal(err)
			}
			if got := s.index.Blocks(d.Decode.Key()) > 0; got != tt.want {
				t.Errorf("prompt recorded in the prefix index: %t, want %t", got, tt.want)
			}
		})
	}
}

// With EngineRanks an engine's one target carries the sum of its ranks'
// scraped loads (tokens, capacity, request counts), so load-aware policies
// still see the engines' load: least_tokens avoids the busy engine.
func TestPickEngineRanksFollowsSummedLoad(t *testing.T) {
	busy := `{"loads":[{"dp_rank":0,"num_used_tokens":3000,"num_total_tokens":3000,"max_total_num_tokens":100000,"num_waiting_reqs":2},` +
		`{"dp_rank":1,"num_used_tokens":4000,"num_total_tokens":4000,"max_total_num_tokens":100000,"num_waiting_reqs":1}]}`
	idle := `{"loads":[{"dp_rank":0,"num_used_tokens":10,"num_total_tokens":10,"max_total_num_tokens":100000},` +
		`{"dp_rank":1,"num_used_tokens":20,"num_total_tokens":20,"max_total_num_tokens":100000}]}`
	a := newFakeEngine(t, map[string]response{"/server_info": ok(info(2, "null", -1)), "/v1/loads": ok(busy)})
	b := newFakeEngine(t, map[string]response{"/server_info": ok(info(2, "null", -1)), "/v1/loads": ok(idle)})
	s := newTestScheduler(t, Config{
		Decode:       []EndpointSpec{{URL: a.url()}, {URL: b.url()}},
		DecodePolicy: PolicySpec{Name: "least_tokens"},
		EngineRanks:  true,
	}, nil)
	mustDiscover(t, s)
	s.ScrapeLoads(testContext(t))
	snap := s.snap.Load()
	ts := snap.decode.states[snap.decode.index[TargetKey{URL: a.url(), Rank: NoRank}]]
	s.ledger.mu.Lock()
	ld := s.ledger.load(ts, time.Now())
	s.ledger.mu.Unlock()
	if !ld.Fresh || ld.Tokens != 7000 || ld.Capacity != 200000 || ld.Waiting != 3 {
		t.Errorf("busy engine's target: %+v, want its ranks summed (7000 tokens, capacity 200000, 3 waiting)", ld)
	}
	for i := range 3 {
		d, err := s.Pick(testContext(t), &Request{ID: fmt.Sprint(i), Prompt: make([]byte, 400)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Decode.Endpoint.URL != b.url() || d.Decode.Rank != NoRank {
			t.Fatalf("pick %d went to %v, want the idle engine, engine-chosen rank", i, d.Decode)
		}
	}
}
