package bench

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Equal arguments give equal workloads; another seed gives others.
func TestGenerateDeterministic(t *testing.T) {
	for _, name := range Workloads {
		t.Run(name, func(t *testing.T) {
			a, err := Generate(name, 2, 30*time.Second, 7, Params{})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := Generate(name, 2, 30*time.Second, 7, Params{})
			if !reflect.DeepEqual(a, b) {
				t.Fatal("same seed, different workloads")
			}
			c, _ := Generate(name, 2, 30*time.Second, 8, Params{})
			if reflect.DeepEqual(a.Sessions, c.Sessions) {
				t.Fatal("different seeds, same workloads")
			}
			if len(a.Sessions) == 0 {
				t.Fatal("no sessions")
			}
		})
	}
}

// Every generated value stays in its configured range, and text has four
// characters per token.
func TestGenerateRanges(t *testing.T) {
	tests := []struct {
		name   string
		check  func(t *testing.T, s Session)
		params Params
	}{
		{WorkloadVariable, func(t *testing.T, s Session) {
			if len(s.Turns) != 1 || s.System != "" {
				t.Fatalf("session %d: %d turns, system %q", s.ID, len(s.Turns), s.System)
			}
			tr := s.Turns[0]
			if tr.PromptTokens < 1500 || tr.PromptTokens > 4000 || tr.OutputTokens < 200 || tr.OutputTokens > 1500 {
				t.Fatalf("session %d: prompt %d, output %d", s.ID, tr.PromptTokens, tr.OutputTokens)
			}
			if len(tr.User) != tr.PromptTokens*charsPerToken {
				t.Fatalf("session %d: %d chars for %d tokens", s.ID, len(tr.User), tr.PromptTokens)
			}
		}, Params{}},
		{WorkloadMultiTurn, func(t *testing.T, s Session) {
			if len(s.Turns) < 3 || len(s.Turns) > 6 || s.System == "" {
				t.Fatalf("session %d: %d turns, system %d chars", s.ID, len(s.Turns), len(s.System))
			}
			history := len(s.System) / charsPerToken
			for k, tr := range s.Turns {
				history += len(tr.User) / charsPerToken
				if tr.PromptTokens != history {
					t.Fatalf("session %d turn %d: prompt %d tokens, history %d", s.ID, k, tr.PromptTokens, history)
				}
				if tr.OutputTokens < 100 || tr.OutputTokens > 400 || len(tr.Assistant) != tr.OutputTokens*charsPerToken {
					t.Fatalf("session %d turn %d: output %d, assistant %d chars", s.ID, k, tr.OutputTokens, len(tr.Assistant))
				}
				history += tr.OutputTokens
			}
		}, Params{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Generate(tc.name, 5, 60*time.Second, 1, tc.params)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range w.Sessions {
				if s.ID != i || s.Start < 0 || s.Start >= w.Window {
					t.Fatalf("session %d: id %d, start %s", i, s.ID, s.Start)
				}
				if i > 0 && s.Start < w.Sessions[i-1].Start {
					t.Fatalf("session %d starts before session %d", i, i-1)
				}
				tc.check(t, s)
			}
		})
	}
}

// Conversations share a few system prompts.
func TestMultiTurnSharesSystemPrompts(t *testing.T) {
	w, err := Generate(WorkloadMultiTurn, 5, 60*time.Second, 1, Params{})
	if err != nil {
		t.Fatal(err)
	}
	distinct := map[string]int{}
	for _, s := range w.Sessions {
		distinct[s.System]++
	}
	if len(distinct) != 8 {
		t.Fatalf("%d distinct system prompts, want 8", len(distinct))
	}
}

// The bursty mix holds both kinds of sessions.
func TestBurstyMixesKinds(t *testing.T) {
	w, err := Generate(WorkloadBursty, 5, 60*time.Second, 1, Params{})
	if err != nil {
		t.Fatal(err)
	}
	singles, convs := 0, 0
	for _, s := range w.Sessions {
		if s.System == "" {
			singles++
		} else {
			convs++
		}
	}
	if singles < len(w.Sessions)/4 || convs < len(w.Sessions)/4 {
		t.Fatalf("%d singles, %d conversations", singles, convs)
	}
}

// Arrival processes produce about rate × window arrivals, and the
// modulated one crowds its high phases.
func TestArrivalRates(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	n := len(PoissonArrivals(rng, 50, 100*time.Second))
	if math.Abs(float64(n)-5000) > 300 {
		t.Fatalf("Poisson: %d arrivals, want about 5000", n)
	}
	high, low := BurstRates(50, 3, 0.25)
	if high != 150 || math.Abs(low-50.0/3) > 1e-9 {
		t.Fatalf("BurstRates = %g, %g", high, low)
	}
	arr := ModulatedArrivals(rng, high, low, 10*time.Second, 0.25, 100*time.Second)
	if math.Abs(float64(len(arr))-5000) > 300 {
		t.Fatalf("modulated: %d arrivals, want about 5000", len(arr))
	}
	inHigh := 0
	for _, a := range arr {
		if math.Mod(a.Seconds(), 10) < 2.5 {
			inHigh++
		}
	}
	if frac := float64(inHigh) / float64(len(arr)); math.Abs(frac-0.75) > 0.05 {
		t.Fatalf("%.2f of arrivals in high phases, want about 0.75", frac)
	}
}

// BurstRates never returns a negative low rate.
func TestBurstRatesClamp(t *testing.T) {
	if _, low := BurstRates(10, 5, 0.5); low != 0 {
		t.Fatalf("low = %g, want 0", low)
	}
}

// Invalid arguments are errors.
func TestGenerateErrors(t *testing.T) {
	tests := []struct {
		name   string
		rate   float64
		window time.Duration
		want   string
	}{
		{"nope", 1, time.Second, "unknown workload"},
		{WorkloadVariable, 0, time.Second, "must be positive"},
		{WorkloadVariable, 1, 0, "must be positive"},
	}
	for _, tc := range tests {
		if _, err := Generate(tc.name, tc.rate, tc.window, 1, Params{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Generate(%q, %g, %s) = %v, want %q", tc.name, tc.rate, tc.window, err, tc.want)
		}
	}
}

// Mean turns per session follow the parameters.
func TestMeanRequestsPerSession(t *testing.T) {
	tests := []struct {
		name string
		want float64
	}{
		{WorkloadVariable, 1},
		{WorkloadMultiTurn, 4.5},
		{WorkloadBursty, 0.5 + 0.5*4.5},
	}
	for _, tc := range tests {
		if got := MeanRequestsPerSession(tc.name, Params{}); got != tc.want {
			t.Errorf("%s: %g, want %g", tc.name, got, tc.want)
		}
	}
}

// The stream fraction picks sessions without changing arrivals or prompts.
func TestStreamFraction(t *testing.T) {
	all, err := Generate(WorkloadVariable, 10, 60*time.Second, 1, Params{})
	if err != nil {
		t.Fatal(err)
	}
	some, _ := Generate(WorkloadVariable, 10, 60*time.Second, 1, Params{StreamFraction: 0.25})
	if all.StreamFraction != 1 || some.StreamFraction != 0.25 || len(all.Sessions) != len(some.Sessions) {
		t.Fatalf("fractions %g, %g; %d vs %d sessions", all.StreamFraction, some.StreamFraction, len(all.Sessions), len(some.Sessions))
	}
	streamed := 0
	for i := range all.Sessions {
		a, b := all.Sessions[i], some.Sessions[i]
		if !a.Stream {
			t.Fatalf("session %d not streamed with fraction 1", i)
		}
		if b.Stream {
			streamed++
		}
		b.Stream = true
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("session %d differs beyond Stream", i)
		}
	}
	if frac := float64(streamed) / float64(len(all.Sessions)); math.Abs(frac-0.25) > 0.07 {
		t.Fatalf("%.2f of sessions streamed, want about 0.25", frac)
	}
}

func TestMeanOutputTokens(t *testing.T) {
	tests := []struct {
		name string
		want float64
	}{
		{WorkloadVariable, 850},
		{WorkloadMultiTurn, 250},
		{WorkloadBursty, (0.5*850 + 2.25*250) / 2.75},
	}
	for _, tc := range tests {
		if got := MeanOutputTokens(tc.name, Params{}); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %g, want %g", tc.name, got, tc.want)
		}
	}
}

// The plan streams what its chunk budget allows.
func TestPlanStreamFraction(t *testing.T) {
	tests := []struct {
		name     string
		plan     Plan
		rate     float64
		scale    float64
		expected float64
	}{
		{"no budget", Plan{}, 10, 20, 1},
		{"under budget", Plan{ChunkBudget: 1e9}, 10, 20, 1},
		// 10/s × 20 × 850 tokens = 170,000 chunks/s wanted.
		{"per token", Plan{ChunkBudget: 17000}, 10, 20, 0.1},
		{"coalesced", Plan{ChunkBudget: 17000, StreamInterval: 5}, 10, 20, 0.5},
	}
	for _, tc := range tests {
		if got := tc.plan.streamFraction(WorkloadVariable, tc.rate, tc.scale); math.Abs(got-tc.expected) > 1e-9 {
			t.Errorf("%s: %g, want %g", tc.name, got, tc.expected)
		}
	}
}
