package bench

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/sim"
)

// Equal arguments give equal workloads; another seed gives others.
func TestGenerateDeterministic(t *testing.T) {
	for _, name := range AllWorkloads() {
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
		{WorkloadVariable, checkSingle(IntRange{1500, 4000}, IntRange{200, 1500}), Params{}},
		{WorkloadMultiTurn, checkConversation(IntRange{900, 1100}, IntRange{3, 6}, IntRange{100, 400}), Params{}},
		{WorkloadPrefillBound, checkSingle(IntRange{6000, 14000}, IntRange{16, 64}), Params{}},
		{WorkloadHeavyTail, checkSingle(IntRange{16, 16000}, IntRange{8, 2048}), Params{}},
		{WorkloadCachePressure, checkConversation(IntRange{1500, 2500}, IntRange{3, 6}, IntRange{100, 400}), Params{}},
		{WorkloadPrefillBound, checkSingle(IntRange{1000, 2000}, IntRange{2, 12}), QuickParams()},
		{WorkloadHeavyTail, checkSingle(IntRange{16, 2000}, IntRange{2, 40}), QuickParams()},
		{WorkloadCachePressure, checkConversation(IntRange{100, 200}, IntRange{2, 3}, IntRange{5, 15}), QuickParams()},
		{WorkloadMultiTenant, checkTenant(IntRange{5500, 6500}, IntRange{200, 800}, IntRange{100, 300}), Params{}},
		{WorkloadMultiTenant, checkTenant(IntRange{500, 700}, IntRange{20, 80}, IntRange{5, 20}), QuickParams()},
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

// checkSingle checks an independent request: one turn without a system
// prompt, lengths within prompt and output, four characters per token.
func checkSingle(prompt, output IntRange) func(t *testing.T, s Session) {
	return func(t *testing.T, s Session) {
		t.Helper()
		if len(s.Turns) != 1 || s.System != "" {
			t.Fatalf("session %d: %d turns, system %q", s.ID, len(s.Turns), s.System)
		}
		tr := s.Turns[0]
		if tr.PromptTokens < prompt.Min || tr.PromptTokens > prompt.Max || tr.OutputTokens < output.Min || tr.OutputTokens > output.Max {
			t.Fatalf("session %d: prompt %d, output %d", s.ID, tr.PromptTokens, tr.OutputTokens)
		}
		if len(tr.User) != tr.PromptTokens*charsPerToken {
			t.Fatalf("session %d: %d chars for %d tokens", s.ID, len(tr.User), tr.PromptTokens)
		}
	}
}

// checkConversation checks a conversation: a system prompt within system,
// turns within turns, answers within answer, and prompts that hold the
// whole history.
func checkConversation(system, turns, answer IntRange) func(t *testing.T, s Session) {
	return func(t *testing.T, s Session) {
		t.Helper()
		sys := len(s.System) / charsPerToken
		if len(s.Turns) < turns.Min || len(s.Turns) > turns.Max || sys < system.Min || sys > system.Max {
			t.Fatalf("session %d: %d turns, system %d tokens", s.ID, len(s.Turns), sys)
		}
		history := sys
		for k, tr := range s.Turns {
			history += len(tr.User) / charsPerToken
			if tr.PromptTokens != history {
				t.Fatalf("session %d turn %d: prompt %d tokens, history %d", s.ID, k, tr.PromptTokens, history)
			}
			if tr.OutputTokens < answer.Min || tr.OutputTokens > answer.Max || len(tr.Assistant) != tr.OutputTokens*charsPerToken {
				t.Fatalf("session %d turn %d: output %d, assistant %d chars", s.ID, k, tr.OutputTokens, len(tr.Assistant))
			}
			history += tr.OutputTokens
		}
	}
}

// checkTenant checks a multi-tenant request: one turn, a prefix (the system
// message) within prefix, a question within question, an answer within
// answer without a reply to send back, four characters per token.
func checkTenant(prefix, question, answer IntRange) func(t *testing.T, s Session) {
	return func(t *testing.T, s Session) {
		t.Helper()
		if len(s.Turns) != 1 {
			t.Fatalf("session %d: %d turns, want 1", s.ID, len(s.Turns))
		}
		tr := s.Turns[0]
		sys, q := len(s.System)/charsPerToken, len(tr.User)/charsPerToken
		if len(s.System)%charsPerToken != 0 || len(tr.User)%charsPerToken != 0 {
			t.Fatalf("session %d: %d and %d chars, not whole tokens", s.ID, len(s.System), len(tr.User))
		}
		if sys < prefix.Min || sys > prefix.Max || q < question.Min || q > question.Max || tr.PromptTokens != sys+q {
			t.Fatalf("session %d: prefix %d, question %d, prompt %d tokens", s.ID, sys, q, tr.PromptTokens)
		}
		if tr.OutputTokens < answer.Min || tr.OutputTokens > answer.Max || tr.Assistant != "" || tr.Seed != 0 {
			t.Fatalf("session %d: output %d, assistant %q, seed %d", s.ID, tr.OutputTokens, tr.Assistant, tr.Seed)
		}
	}
}

// The multi-tenant workload spreads its requests over its tenants'
// prefixes, each a prefix of its own, with a question of each request's
// own, in words of the one-token vocabulary; it is not among the default
// workloads, and Generate names it when it refuses a name.
func TestMultiTenantShape(t *testing.T) {
	tests := []struct {
		name    string
		params  Params
		rate    float64
		tenants int
	}{
		{"defaults", Params{}, 10, 150},
		{"quick", QuickParams(), 10, 12},
		{"few tenants", Params{MultiTenant: MultiTenantParams{Tenants: 3}}, 2, 3},
	}
	vocab := map[string]bool{}
	for _, w := range tokenWordList() {
		vocab[w] = true
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Generate(WorkloadMultiTenant, tc.rate, 300*time.Second, 3, tc.params)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(w.Sessions); math.Abs(float64(n)-tc.rate*300) > 4*math.Sqrt(tc.rate*300) {
				t.Fatalf("%d requests, want about %g", n, tc.rate*300)
			}
			perTenant := map[string]int{}
			questions := map[string]bool{}
			for _, s := range w.Sessions {
				perTenant[s.System]++
				questions[s.Turns[0].User] = true
			}
			if len(perTenant) != tc.tenants {
				t.Fatalf("%d distinct prefixes, want %d", len(perTenant), tc.tenants)
			}
			if len(questions) != len(w.Sessions) {
				t.Fatalf("%d distinct questions for %d requests", len(questions), len(w.Sessions))
			}
			// Uniform tenants: none gets more than three times its share.
			for _, n := range perTenant {
				if share := float64(len(w.Sessions)) / float64(tc.tenants); float64(n) > 3*share {
					t.Fatalf("a tenant got %d requests of %d over %d tenants", n, len(w.Sessions), tc.tenants)
				}
			}
			for _, word := range strings.Fields(w.Sessions[0].System + w.Sessions[0].Turns[0].User) {
				if !vocab[word] {
					t.Fatalf("word %q is not in the one-token vocabulary", word)
				}
			}
		})
	}
	if slices.Contains(Workloads, WorkloadMultiTenant) || !slices.Contains(AllWorkloads(), WorkloadMultiTenant) {
		t.Errorf("Workloads %v, AllWorkloads %v", Workloads, AllWorkloads())
	}
	if _, err := Generate("nope", 1, time.Second, 1, Params{}); err == nil || !strings.Contains(err.Error(), WorkloadMultiTenant) {
		t.Errorf("unknown workload error %v does not name %s", err, WorkloadMultiTenant)
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
		{WorkloadPrefillBound, 1},
		{WorkloadHeavyTail, 1},
		{WorkloadCachePressure, 4.5},
		{WorkloadMultiTenant, 1},
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

// Mean max_tokens follow the parameters.
func TestMeanOutputTokens(t *testing.T) {
	tests := []struct {
		name string
		want float64
		tol  float64 // 0: 1e-9
	}{
		{WorkloadVariable, 850, 0},
		{WorkloadMultiTurn, 250, 0},
		{WorkloadBursty, (0.5*850 + 2.25*250) / 2.75, 0},
		{WorkloadPrefillBound, 40, 0},
		// The clamped lognormal's mean by numeric integration (midpoint
		// rule over z in [-12, 12], 400,000 steps) outside this package:
		// below the unclamped e^(mu+sigma²/2) ≈ 481.34.
		{WorkloadHeavyTail, 480.709, 0.001},
		{WorkloadCachePressure, 250, 0},
		{WorkloadMultiTenant, 200, 0},
	}
	for _, tc := range tests {
		tol := tc.tol
		if tol == 0 {
			tol = 1e-9
		}
		if got := MeanOutputTokens(tc.name, Params{}); math.Abs(got-tc.want) > tol {
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

// The three original workloads are byte-identical to what they were before
// more workloads were added: these fingerprints were taken from the code
// before the change, and a change of their draw order changes them.
func TestOriginalWorkloadsUnchanged(t *testing.T) {
	if got := Workloads[:3]; !reflect.DeepEqual(got, []string{WorkloadVariable, WorkloadMultiTurn, WorkloadBursty}) {
		t.Fatalf("Workloads starts %v", got)
	}
	tests := []struct {
		name        string
		quick       bool
		sessions    int
		fingerprint string
	}{
		{WorkloadVariable, false, 48, "4e1dba916357f875"},
		{WorkloadVariable, true, 48, "bf3c43f91316c875"},
		{WorkloadMultiTurn, false, 57, "bd41a820e65914ce"},
		{WorkloadMultiTurn, true, 64, "94973d0d8d876b77"},
		{WorkloadBursty, false, 77, "e8bfc79e4a33383c"},
		{WorkloadBursty, true, 62, "9d2a223f5170f294"},
	}
	for _, tc := range tests {
		p := Params{}
		if tc.quick {
			p = QuickParams()
		}
		w, err := Generate(tc.name, 2, 30*time.Second, 7, p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fingerprint(w); len(w.Sessions) != tc.sessions || got != tc.fingerprint {
			t.Errorf("%s (quick %t): %d sessions, fingerprint %s; want %d, %s", tc.name, tc.quick, len(w.Sessions), got, tc.sessions, tc.fingerprint)
		}
	}
}

// fingerprint hashes every field of a workload (FNV-1a).
func fingerprint(w Workload) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s %g %d %g\n", w.Name, w.Rate, w.Window, w.StreamFraction)
	for _, s := range w.Sessions {
		fmt.Fprintf(h, "%d %d %t %q\n", s.ID, s.Start, s.Stream, s.System)
		for _, t := range s.Turns {
			fmt.Fprintf(h, "%q %q %d %d %d\n", t.User, t.Assistant, t.PromptTokens, t.OutputTokens, t.Think)
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// z99 is the standard normal's 0.99 quantile.
const z99 = 2.3263478740408408

// exponentialTail is an exponential distribution's p99/p50 ratio,
// ln 100 / ln 2 ≈ 6.64, whatever its rate: the usual light-tailed
// reference. The uniform lengths of the other workloads stay far below it
// (variable's 1500-4000 prompts: about 1.45).
var exponentialTail = math.Log(100) / math.Log(2)

// quantile returns the nearest-rank p quantile of sorted.
func quantile(sorted []int, p float64) float64 {
	return float64(sorted[int(math.Ceil(p*float64(len(sorted))))-1])
}

// Heavy-tail requests follow their lognormals: the sample median is e^mu
// within 10%, every length is within its clamp, and the prompts' p99/p50
// ratio is beyond an exponential's (the ShareGPT fit's is e^(z99·sigma) ≈
// 8.7).
func TestWorkloadHeavyTailLengths(t *testing.T) {
	tests := []struct {
		name   string
		rate   float64 // sessions per second over 100s
		params Params
		// Medians: the published ShareGPT ones for the defaults.
		prompt, output float64
	}{
		// About 2,000 requests: the median's standard error is about 3%
		// and the prompt p99's about 8% (log scale), against margins of
		// 10% and ln(8.7/6.64) = 27%.
		{"defaults", 20, Params{}, 1730, 415},
		{"quick", 100, QuickParams(), 300, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Generate(WorkloadHeavyTail, tc.rate, 100*time.Second, 3, tc.params)
			if err != nil {
				t.Fatal(err)
			}
			hp := tc.params.HeavyTail.withDefaults()
			var prompts, outputs []int
			for _, s := range w.Sessions {
				prompts = append(prompts, s.Turns[0].PromptTokens)
				outputs = append(outputs, s.Turns[0].OutputTokens)
			}
			if len(prompts) < 1500 {
				t.Fatalf("only %d requests", len(prompts))
			}
			for _, d := range []struct {
				what    string
				lengths []int
				median  float64
				clamp   IntRange
			}{
				{"prompt", prompts, tc.prompt, hp.Prompt},
				{"output", outputs, tc.output, hp.Output},
			} {
				slices.Sort(d.lengths)
				if d.lengths[0] < d.clamp.Min || d.lengths[len(d.lengths)-1] > d.clamp.Max {
					t.Errorf("%s lengths %d-%d outside %v", d.what, d.lengths[0], d.lengths[len(d.lengths)-1], d.clamp)
				}
				if median := quantile(d.lengths, 0.5); math.Abs(median/d.median-1) > 0.1 {
					t.Errorf("%s median %g, want %g within 10%%", d.what, median, d.median)
				}
			}
			if ratio := quantile(prompts, 0.99) / quantile(prompts, 0.5); ratio <= exponentialTail {
				t.Errorf("prompt p99/p50 = %.2f, want above an exponential's %.2f", ratio, exponentialTail)
			}
		})
	}
}

// The heavy-tail defaults are the lognormals whose medians and P90s are the
// published ShareGPT figures (1730 and 5696 prompt tokens, 415 and 834
// output tokens), with the documented clamps.
func TestWorkloadHeavyTailDefaults(t *testing.T) {
	p := HeavyTailParams{}.withDefaults()
	const normalZ90 = 1.2815515655446004 // Φ⁻¹(0.9), independent of the package's z90
	tests := []struct {
		what                string
		mu, sigma           float64
		wantMu, wantSigma   float64
		wantMedian, wantP90 float64
		clamp, wantClamp    IntRange
	}{
		{"prompt", p.PromptMu, p.PromptSigma, 7.4559, 0.9298, 1730, 5696, p.Prompt, IntRange{16, 16000}},
		{"output", p.OutputMu, p.OutputSigma, 6.0283, 0.5446, 415, 834, p.Output, IntRange{8, 2048}},
	}
	for _, tc := range tests {
		if math.Abs(tc.mu-tc.wantMu) > 1e-4 || math.Abs(tc.sigma-tc.wantSigma) > 1e-4 {
			t.Errorf("%s: mu %.5f, sigma %.5f; want %.4f, %.4f", tc.what, tc.mu, tc.sigma, tc.wantMu, tc.wantSigma)
		}
		if median, p90 := math.Exp(tc.mu), math.Exp(tc.mu+normalZ90*tc.sigma); math.Abs(median-tc.wantMedian) > 1e-6 || math.Abs(p90-tc.wantP90) > 1e-6 {
			t.Errorf("%s: median %g, P90 %g; want %g, %g", tc.what, median, p90, tc.wantMedian, tc.wantP90)
		}
		if tc.clamp != tc.wantClamp {
			t.Errorf("%s: clamp %v, want %v", tc.what, tc.clamp, tc.wantClamp)
		}
	}
}

// The lognormal sampler matches its distribution closely over 100,000
// draws: median, p99 (clamped where the clamp binds) and mean, which also
// checks clampedLognormalMean against the draws.
func TestWorkloadLognormalTokens(t *testing.T) {
	def := HeavyTailParams{}.withDefaults()
	tests := []struct {
		name      string
		mu, sigma float64
		clamp     IntRange
	}{
		{"ShareGPT prompt", def.PromptMu, def.PromptSigma, def.Prompt},
		{"ShareGPT output", def.OutputMu, def.OutputSigma, def.Output},
		// The clamps bind on both sides: P(X < 50) = P(X > 200) ≈ 24%.
		{"clamped", math.Log(100), 1, IntRange{50, 200}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			const n = 100000
			draws := make([]int, n)
			sum := 0.0
			for i := range draws {
				draws[i] = lognormalTokens(rng, tc.mu, tc.sigma, tc.clamp)
				sum += float64(draws[i])
			}
			slices.Sort(draws)
			if draws[0] < tc.clamp.Min || draws[n-1] > tc.clamp.Max {
				t.Fatalf("draws %d-%d outside %v", draws[0], draws[n-1], tc.clamp)
			}
			clamped := func(z float64) float64 {
				return math.Min(math.Max(math.Exp(tc.mu+z*tc.sigma), float64(tc.clamp.Min)), float64(tc.clamp.Max))
			}
			if got, want := quantile(draws, 0.5), clamped(0); math.Abs(got/want-1) > 0.02 {
				t.Errorf("median %g, want %.1f", got, want)
			}
			if got, want := quantile(draws, 0.99), clamped(z99); math.Abs(got/want-1) > 0.05 {
				t.Errorf("p99 %g, want %.1f", got, want)
			}
			if got, want := sum/n, clampedLognormalMean(tc.mu, tc.sigma, tc.clamp); math.Abs(got/want-1) > 0.01 {
				t.Errorf("mean %g, clampedLognormalMean %g", got, want)
			}
		})
	}
}

// The cache-pressure workload's distinct system prompts hold more tokens
// than one dsv3-dp8-h100-node rank's KV cache, while conversations still
// share them; the multi-turn workload's few system prompts fit easily.
func TestWorkloadCachePressureExceedsRankCache(t *testing.T) {
	const rankKVTokens = 150000 // dsv3-dp8-h100-node, per DP rank
	tests := []struct {
		name     string
		exceeds  bool
		atLeast  int // distinct system prompts
		sessions int // at least
	}{
		// About 300 conversations over 400 prompts use about
		// 400·(1 - e^(-0.75)) ≈ 210 of them, about 420,000 tokens.
		{WorkloadCachePressure, true, 150, 250},
		{WorkloadMultiTurn, false, 8, 250},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Generate(tc.name, 5, 60*time.Second, 1, Params{})
			if err != nil {
				t.Fatal(err)
			}
			distinct := map[string]bool{}
			tokens := 0
			for _, s := range w.Sessions {
				if !distinct[s.System] {
					distinct[s.System] = true
					tokens += len(s.System) / charsPerToken
				}
			}
			if len(w.Sessions) < tc.sessions || len(distinct) < tc.atLeast || len(distinct) >= len(w.Sessions) {
				t.Fatalf("%d distinct system prompts over %d sessions", len(distinct), len(w.Sessions))
			}
			if exceeds := tokens > rankKVTokens; exceeds != tc.exceeds {
				t.Fatalf("%d distinct system prompts hold %d tokens; exceeding %d: %t, want %t",
					len(distinct), tokens, rankKVTokens, exceeds, tc.exceeds)
			}
		})
	}
}

// The agentic workload has the shape its doc promises: histories of 20k to
// 60k tokens, about 90 % of each later turn's prompt being the previous
// turn's prompt and answer, answers of hundreds of tokens, and replies that
// are the engine's own (a seed per turn, sim.ReplyText).
func TestWorkloadAgenticShape(t *testing.T) {
	w, err := Generate(WorkloadAgentic, 0.1, 10*time.Minute, 3, Params{})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) < 30 {
		t.Fatalf("%d sessions", len(w.Sessions))
	}
	var reused, later float64
	maxHistory := 0
	for _, s := range w.Sessions {
		if len(s.Turns) < 2 {
			t.Errorf("session %d has %d turns", s.ID, len(s.Turns))
		}
		for k, turn := range s.Turns {
			if turn.Seed == 0 || turn.Assistant != sim.ReplyText(turn.Seed, turn.OutputTokens) {
				t.Fatalf("session %d turn %d: the reply is not the engine's for its seed", s.ID, k)
			}
			if turn.OutputTokens < 100 || turn.OutputTokens > 600 {
				t.Errorf("answer of %d tokens", turn.OutputTokens)
			}
			if k == 0 {
				if turn.PromptTokens < 17000 || turn.PromptTokens > 33000 {
					t.Errorf("first prompt of %d tokens", turn.PromptTokens)
				}
				continue
			}
			prev := s.Turns[k-1]
			reused += float64(prev.PromptTokens + prev.OutputTokens)
			later += float64(turn.PromptTokens)
			maxHistory = max(maxHistory, turn.PromptTokens+turn.OutputTokens)
		}
	}
	if maxHistory > 60000 || maxHistory < 50000 {
		t.Errorf("longest history %d tokens, want up to 60000", maxHistory)
	}
	if share := reused / later; share < 0.85 || share > 0.95 {
		t.Errorf("%.2f of later prompts is the previous turn, want about 0.9", share)
	}
	if got, want := MeanRequestsPerSession(WorkloadAgentic, Params{}), float64(w.Requests())/float64(len(w.Sessions)); math.Abs(got-want) > 0.25*want {
		t.Errorf("MeanRequestsPerSession = %.1f, generated %.1f", got, want)
	}
}
