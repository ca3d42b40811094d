package bench

import (
	"fmt"
	"hash/fnv"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"
)

// The priority mix is deterministic from its seed, its classes and
// tenants come in their shares, each class's requests stay in its ranges,
// and every interactive session streams whatever the stream fraction,
// while the batch ones stream at that fraction. It runs only when named.
func TestPriorityMixShape(t *testing.T) {
	tests := []struct {
		name          string
		params        Params
		interactive   float64
		weights       []float64
		inPrompt, in  IntRange // interactive prompt and output
		batchPrompt   IntRange
		batchOut      IntRange
		streamBatches float64 // the stream fraction asked for (0: 1)
	}{
		{name: "defaults", interactive: 0.2, weights: []float64{4, 2, 1, 1},
			inPrompt: IntRange{300, 1500}, in: IntRange{50, 300}, batchPrompt: IntRange{2000, 6000}, batchOut: IntRange{100, 800}},
		{name: "quick", params: QuickParams(), interactive: 0.2, weights: []float64{4, 2, 1, 1},
			inPrompt: IntRange{50, 150}, in: IntRange{5, 20}, batchPrompt: IntRange{500, 1500}, batchOut: IntRange{10, 40}},
		{name: "half streamed, custom", interactive: 0.5, weights: []float64{1, 1},
			params:   Params{StreamFraction: 0.5, PriorityMix: PriorityMixParams{InteractiveShare: 0.5, TenantWeights: []float64{1, 1}}},
			inPrompt: IntRange{300, 1500}, in: IntRange{50, 300}, batchPrompt: IntRange{2000, 6000}, batchOut: IntRange{100, 800}, streamBatches: 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Generate(WorkloadPriorityMix, 20, 300*time.Second, 5, tc.params)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := Generate(WorkloadPriorityMix, 20, 300*time.Second, 5, tc.params)
			if !reflect.DeepEqual(w, again) {
				t.Fatal("same seed, different workloads")
			}
			n := float64(len(w.Sessions))
			if math.Abs(n-6000) > 4*math.Sqrt(6000) {
				t.Fatalf("%d sessions, want about 6000", len(w.Sessions))
			}
			classes, tenants, streamed := map[string]int{}, map[string]int{}, map[string]int{}
			for i, s := range w.Sessions {
				if s.ID != i || len(s.Turns) != 1 || s.System != "" || (i > 0 && s.Start < w.Sessions[i-1].Start) {
					t.Fatalf("session %d: %+v", i, s)
				}
				classes[s.Class]++
				tenants[s.Tenant]++
				if s.Stream {
					streamed[s.Class]++
				}
				prompt, out := tc.batchPrompt, tc.batchOut
				if s.Class == ClassInteractive {
					prompt, out = tc.inPrompt, tc.in
				}
				turn := s.Turns[0]
				if turn.PromptTokens < prompt.Min || turn.PromptTokens > prompt.Max || turn.OutputTokens < out.Min || turn.OutputTokens > out.Max ||
					len(turn.User) != turn.PromptTokens*charsPerToken {
					t.Fatalf("%s session %d: prompt %d, output %d", s.Class, i, turn.PromptTokens, turn.OutputTokens)
				}
			}
			if len(classes) != 2 || !near1(float64(classes[ClassInteractive])/n, tc.interactive, 0.03) {
				t.Errorf("classes %v, want %g interactive", classes, tc.interactive)
			}
			total := 0.0
			for _, x := range tc.weights {
				total += x
			}
			for i, x := range tc.weights {
				if got := float64(tenants[TenantName(i)]) / n; !near1(got, x/total, 0.03) {
					t.Errorf("tenant %s: share %.3f, want %.3f", TenantName(i), got, x/total)
				}
			}
			if len(tenants) != len(tc.weights) {
				t.Errorf("tenants %v", tenants)
			}
			frac := tc.streamBatches
			if frac == 0 {
				frac = 1
			}
			if streamed[ClassInteractive] != classes[ClassInteractive] || !near1(float64(streamed[ClassBatch])/float64(classes[ClassBatch]), frac, 0.03) {
				t.Errorf("streamed %v of %v", streamed, classes)
			}
			if want := float64(streamed[ClassInteractive]+streamed[ClassBatch]) / n; w.StreamFraction != want {
				t.Errorf("stream fraction %g, want %g", w.StreamFraction, want)
			}
		})
	}
	if slices.Contains(Workloads, WorkloadPriorityMix) || !slices.Contains(AllWorkloads(), WorkloadPriorityMix) {
		t.Errorf("Workloads %v, AllWorkloads %v", Workloads, AllWorkloads())
	}
	if got := MeanOutputTokens(WorkloadPriorityMix, Params{}); !near(got, 0.2*175+0.8*450) {
		t.Errorf("mean output %g", got)
	}
	if got := MeanRequestsPerSession(WorkloadPriorityMix, Params{}); got != 1 {
		t.Errorf("requests per session %g", got)
	}
}

// The stream draw leaves every workload without classes as it was: its
// sessions stream at the fraction asked for, and StreamFraction is that
// fraction.
func TestAlwaysStreams(t *testing.T) {
	tests := []struct {
		s    Session
		want bool
	}{
		{Session{}, false},
		{Session{Class: ClassBatch, Tenant: "tenant-1"}, false},
		{Session{Class: ClassInteractive}, true},
	}
	for _, tc := range tests {
		if got := alwaysStreams(tc.s); got != tc.want {
			t.Errorf("alwaysStreams(%+v) = %v", tc.s, got)
		}
	}
	w, err := Generate(WorkloadVariable, 10, time.Minute, 1, Params{StreamFraction: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	if w.StreamFraction != 0.3 {
		t.Errorf("variable stream fraction %g", w.StreamFraction)
	}
}

// near1 reports whether a is within tol of b.
func near1(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// The priority mix the benchmark's report was measured on stays what it
// was: this fingerprint of its overload case with -seed 1 (18 requests/s,
// the plan's second rate, so the workload's seed 2, over 180 s) changes
// with any change of its draws.
func TestPriorityMixUnchanged(t *testing.T) {
	w, err := Generate(WorkloadPriorityMix, 18, 180*time.Second, 2, Params{})
	if err != nil {
		t.Fatal(err)
	}
	h := fnv.New64a()
	fmt.Fprintln(h, fingerprint(w))
	for _, s := range w.Sessions {
		fmt.Fprintf(h, "%s %s\n", s.Class, s.Tenant)
	}
	if got, want := fmt.Sprintf("%016x", h.Sum64()), "c58075b9690cf74b"; len(w.Sessions) != 3191 || got != want {
		t.Errorf("%d sessions, fingerprint %s; want %s", len(w.Sessions), got, want)
	}
}
