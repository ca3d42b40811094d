package bench

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want Dist
	}{
		{"empty", nil, Dist{}},
		{"one", []float64{5}, Dist{N: 1, Mean: 5, P50: 5, P99: 5}},
		{"two", []float64{10, 0}, Dist{N: 2, Mean: 5, P50: 5, P99: 9.9}},
		{"hundred and one", seq(101), Dist{N: 101, Mean: 50, P50: 50, P99: 99}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Summarize(tc.in)
			if got.N != tc.want.N || !near(got.Mean, tc.want.Mean) || !near(got.P50, tc.want.P50) || !near(got.P99, tc.want.P99) {
				t.Fatalf("Summarize = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// seq returns 0, 1, ..., n-1 in reverse order (Summarize must sort).
func seq(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(n - 1 - i)
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestImbalance(t *testing.T) {
	poll := func(at time.Duration, decode ...float64) Poll {
		return Poll{At: at, Tokens: map[string][]float64{RoleDecode: decode}}
	}
	tests := []struct {
		name  string
		polls []Poll
		want  float64
	}{
		{"balanced", []Poll{poll(1*time.Second, 5, 5, 5, 5)}, 1},
		{"one rank holds all", []Poll{poll(1*time.Second, 8, 0, 0, 0)}, 4},
		{"average over polls", []Poll{poll(1*time.Second, 8, 0, 0, 0), poll(2*time.Second, 2, 2, 2, 2)}, 2.5},
		{"idle polls skipped", []Poll{poll(1*time.Second, 0, 0, 0, 0), poll(2*time.Second, 3, 1, 1, 3)}, 1.5},
		{"outside the window", []Poll{poll(20*time.Second, 8, 0, 0, 0)}, 0},
		{"no polls", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Imbalance(tc.polls, RoleDecode, 0, 10*time.Second); !near(got, tc.want) {
				t.Fatalf("Imbalance = %g, want %g", got, tc.want)
			}
		})
	}
}

func TestTokensWithin(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	tests := []struct {
		name     string
		o        Outcome
		from, to float64
		want     float64
	}{
		{"inside", Outcome{Stream: true, First: at(1), Last: at(2), Chunks: 10}, 0, 5, 10},
		{"half", Outcome{Stream: true, First: at(1), Last: at(3), Chunks: 10}, 2, 5, 5},
		{"usage wins", Outcome{Stream: true, First: at(1), Last: at(3), Chunks: 3, Usage: &Usage{CompletionTokens: 20}}, 0, 2, 10},
		{"after", Outcome{Stream: true, First: at(6), Last: at(7), Chunks: 10}, 0, 5, 0},
		{"no tokens", Outcome{Stream: true}, 0, 5, 0},
		{"one instant", Outcome{Stream: true, First: at(1), Last: at(1), Chunks: 1}, 0, 5, 1},
		{"not streamed", Outcome{Sent: at(1), Done: at(5), Usage: &Usage{CompletionTokens: 8}}, 0, 2, 2},
		{"not streamed, unfinished", Outcome{Sent: at(1), Canceled: true}, 0, 5, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tokensWithin(tc.o, at(tc.from), at(tc.to)); !near(got, tc.want) {
				t.Fatalf("tokensWithin = %g, want %g", got, tc.want)
			}
		})
	}
}

// Summary.Summarize counts outcomes in the window, scales times into model
// time and prefers usage-reported cache hits.
func TestSummaryFromResults(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(v int) time.Time { return t0.Add(time.Duration(v) * time.Millisecond) }
	ok := func(sent, first, last, tokens, prompt, cached int) Outcome {
		return Outcome{Stream: true, Sent: ms(sent), First: ms(first), Last: ms(last), Done: ms(last), Chunks: tokens,
			Usage: &Usage{PromptTokens: prompt, CompletionTokens: tokens, CachedTokens: cached, HasCached: true}}
	}
	results := []Result{
		// Sent before the window (model 0.5 s): not counted.
		{Offset: 500 * time.Millisecond, Outcome: ok(50, 60, 70, 2, 100, 0)},
		{Offset: 2 * time.Second, Outcome: ok(200, 210, 300, 10, 100, 50)},
		{Offset: 3 * time.Second, Outcome: ok(300, 320, 400, 11, 300, 50)},
		{Offset: 4 * time.Second, Outcome: Outcome{Stream: true, Sent: ms(400), Err: "status 503: no engine"}},
		// Never got a token: counted with its wait until the cutoff.
		{Offset: 5 * time.Second, Outcome: Outcome{Stream: true, Sent: ms(500), Canceled: true}},
		// Not streamed: in the counts, the end-to-end latency and the hit
		// rate, not in TTFT or TPOT.
		{Offset: 5 * time.Second, Outcome: Outcome{Sent: ms(500), Done: ms(550),
			Usage: &Usage{PromptTokens: 200, CompletionTokens: 4, CachedTokens: 100, HasCached: true}}},
	}
	polls := []Poll{{At: 2 * time.Second, Tokens: map[string][]float64{RolePrefill: {2, 0}, RoleDecode: {1, 1}}}}
	var s Summary
	// Scale 10: 100 ms of wall time is one model second.
	s.Summarize(results, polls, nil, Window{From: time.Second, To: 6 * time.Second}, t0, ms(600), 10)
	if s.Requests != 5 || s.Completed != 3 || s.Errors != 1 || s.Unfinished != 1 {
		t.Fatalf("counts = %d requests, %d completed, %d errors, %d unfinished", s.Requests, s.Completed, s.Errors, s.Unfinished)
	}
	// TTFT: 100, 200 and (600-500)×10 = 1000 model ms.
	if s.TTFTms.N != 3 || !near(s.TTFTms.Mean, 1300.0/3) {
		t.Fatalf("TTFT = %+v", s.TTFTms)
	}
	// TPOT: 900/9 = 100 and 800/10 = 80 model ms.
	if s.TPOTms.N != 2 || !near(s.TPOTms.Mean, 90) {
		t.Fatalf("TPOT = %+v", s.TPOTms)
	}
	// E2E: 1000, 1000 and 500 model ms.
	if s.E2Ems.N != 3 || !near(s.E2Ems.Mean, 2500.0/3) {
		t.Fatalf("E2E = %+v", s.E2Ems)
	}
	if !near(s.HitRate, 200.0/600) || s.HitSource != "usage" {
		t.Fatalf("hit rate = %g (%s)", s.HitRate, s.HitSource)
	}
	if !near(s.ImbalancePrefill, 2) || !near(s.ImbalanceDecode, 1) {
		t.Fatalf("imbalance = %g, %g", s.ImbalancePrefill, s.ImbalanceDecode)
	}
	// 25 tokens over the 5 model seconds of the window (the first
	// request's tokens arrived before it).
	if !near(s.Throughput, 25.0/5) {
		t.Fatalf("throughput = %g", s.Throughput)
	}
	if s.FirstError != "status 503: no engine" {
		t.Fatalf("first error = %q", s.FirstError)
	}
}

// The hit rate comes from the best evidence available.
func TestSummaryHitRateSources(t *testing.T) {
	gauge := func(v float64) []Poll {
		return []Poll{{At: 2 * time.Second, CacheHitRate: map[string][]float64{RolePrefill: {v, v, 0.9}},
			Tokens: map[string][]float64{RolePrefill: {10, 10, 0}}}}
	}
	usage := func(prompt, cached int) []Result {
		return []Result{{Offset: time.Second, Outcome: Outcome{Sent: time.Now(), Done: time.Now(),
			Usage: &Usage{PromptTokens: prompt, CompletionTokens: 1, CachedTokens: cached, HasCached: true}}}}
	}
	tests := []struct {
		name     string
		results  []Result
		counters *CounterDelta
		polls    []Poll
		want     float64
		source   string
	}{
		{"counters win", usage(100, 10), &CounterDelta{Prompt: 200, Cached: 150}, gauge(0.4), 0.75, "prefill counters"},
		{"usage", usage(100, 10), nil, gauge(0.4), 0.1, "usage"},
		{"usage says zero, gauge", usage(100, 0), nil, gauge(0.4), 0.4, "prefill gauge"},
		{"both zero", usage(100, 0), nil, gauge(0), 0, "usage"},
		{"gauge only", nil, nil, gauge(0.4), 0.4, "prefill gauge"},
		{"zero gauge only", nil, nil, gauge(0), -1, "not reported"},
		{"nothing", nil, &CounterDelta{}, nil, -1, "not reported"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s Summary
			s.Summarize(tc.results, tc.polls, tc.counters, Window{From: 0, To: 5 * time.Second}, time.Now(), time.Now(), 1)
			if !near(s.HitRate, tc.want) || s.HitSource != tc.source {
				t.Fatalf("hit rate = %g (%s), want %g (%s)", s.HitRate, s.HitSource, tc.want, tc.source)
			}
		})
	}
}

// Counters are read from SGLang or vLLM metric names and summed.
func TestReadCounters(t *testing.T) {
	tests := []struct {
		name string
		body string
		ok   bool
		want CounterDelta
	}{
		{"sglang", "# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{dp_rank=\"0\"} 100\nsglang:prompt_tokens_total{dp_rank=\"1\"} 50\n" +
			"# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total{dp_rank=\"0\"} 30\n", true, CounterDelta{Prompt: 300, Cached: 60}},
		{"vllm", "vllm:prefix_cache_queries 10\nvllm:prefix_cache_hits 4\n", true, CounterDelta{Prompt: 20, Cached: 8}},
		{"none", "sglang:num_running_reqs 3\n", false, CounterDelta{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			got, ok, err := ReadCounters(context.Background(), srv.Client(), []string{srv.URL, srv.URL})
			if err != nil || ok != tc.ok || (ok && got != tc.want) {
				t.Fatalf("ReadCounters = %+v, %v, %v", got, ok, err)
			}
		})
	}
	if d := (CounterDelta{Prompt: 10, Cached: 4}).Sub(CounterDelta{Prompt: 4, Cached: 1}); d != (CounterDelta{Prompt: 6, Cached: 3}) {
		t.Fatalf("Sub = %+v", d)
	}
}

// Only busy ranks count towards the gauge.
func TestActiveHitRate(t *testing.T) {
	polls := []Poll{
		{At: time.Second, Tokens: map[string][]float64{RolePrefill: {5, 0}}, CacheHitRate: map[string][]float64{RolePrefill: {0.2, 0.9}}},
		{At: 2 * time.Second, Tokens: map[string][]float64{RolePrefill: {5, 5}}, CacheHitRate: map[string][]float64{RolePrefill: {0.4, 0.6}}},
		{At: 9 * time.Second, Tokens: map[string][]float64{RolePrefill: {5, 5}}, CacheHitRate: map[string][]float64{RolePrefill: {1, 1}}},
	}
	if got := ActiveHitRate(polls, RolePrefill, 0, 5*time.Second); !near(got, 0.4) {
		t.Fatalf("ActiveHitRate = %g, want 0.4", got)
	}
	if got := ActiveHitRate(polls, RoleDecode, 0, 5*time.Second); got != -1 {
		t.Fatalf("no data: %g", got)
	}
}

func TestLoadShareImbalance(t *testing.T) {
	poll := func(at time.Duration, v ...float64) Poll {
		return Poll{At: at, Tokens: map[string][]float64{RolePrefill: v}}
	}
	tests := []struct {
		name  string
		polls []Poll
		want  float64
	}{
		// Work alternates between ranks: instantaneously maximal imbalance,
		// but each rank carried the same share.
		{"alternating", []Poll{poll(1, 10, 0), poll(2, 0, 10), poll(3, 10, 0), poll(4, 0, 10)}, 1},
		{"one rank does everything", []Poll{poll(1, 10, 0), poll(2, 10, 0)}, 2},
		{"idle", []Poll{poll(1, 0, 0)}, 0},
		{"outside the window", []Poll{poll(100, 10, 0)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := LoadShareImbalance(tt.polls, RolePrefill, 0, 10); !near(got, tt.want) {
				t.Errorf("LoadShareImbalance = %g, want %g", got, tt.want)
			}
		})
	}
	if got := Imbalance([]Poll{poll(1, 10, 0), poll(2, 0, 10)}, RolePrefill, 0, 10); !near(got, 2) {
		t.Errorf("instantaneous Imbalance of alternating work = %g, want 2", got)
	}
}
