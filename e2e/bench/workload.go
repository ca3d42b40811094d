package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/duet-router/duet/e2e/sim"
)

// Workload names.
const (
	// WorkloadVariable is independent prompts of variable length.
	WorkloadVariable = "variable"
	// WorkloadMultiTurn is multi-turn conversations sharing system prompts.
	WorkloadMultiTurn = "multiturn"
	// WorkloadBursty alternates high and low arrival rates over a mix of
	// the two.
	WorkloadBursty = "bursty"
	// WorkloadPrefillBound is independent requests with long prompts and
	// short outputs: nearly all of their engine time is prefill.
	WorkloadPrefillBound = "prefill_bound"
	// WorkloadHeavyTail is independent requests whose prompt and output
	// lengths are lognormal, fitted to published ShareGPT statistics and
	// clamped (see HeavyTailParams).
	WorkloadHeavyTail = "heavy_tail"
	// WorkloadCachePressure is multi-turn conversations over many more
	// distinct system prompts than one DP rank's prefix cache holds (see
	// CachePressureParams).
	WorkloadCachePressure = "multiturn_pressure"
	// WorkloadAgentic is long-context agent sessions: each starts from a
	// context of its own and grows by tool output and answers, turn after
	// turn, to tens of thousands of tokens (see AgenticParams).
	WorkloadAgentic = "agentic"
	// WorkloadMultiTenant is llm-d's precise-prefix benchmark shape: many
	// tenants, each with a long prefix of its own, and every request one
	// tenant's prefix and a question of its own, without history (see
	// MultiTenantParams). It is not in Workloads: it runs when named.
	WorkloadMultiTenant = "multi_tenant"
	// WorkloadPriorityMix is independent requests of two priority classes
	// from several tenants: 20 % short interactive turns, 80 % long batch
	// prompts (see PriorityMixParams). It is not in Workloads: it runs when
	// named.
	WorkloadPriorityMix = "priority_mix"
)

// Workloads lists the workload names in report order.
var Workloads = []string{
	WorkloadVariable, WorkloadMultiTurn, WorkloadBursty,
	WorkloadPrefillBound, WorkloadHeavyTail, WorkloadCachePressure, WorkloadAgentic,
}

// AllWorkloads returns every workload Generate knows: Workloads, then
// those that run only when named (WorkloadMultiTenant,
// WorkloadPriorityMix).
func AllWorkloads() []string {
	return append(slices.Clone(Workloads), WorkloadMultiTenant, WorkloadPriorityMix)
}

// charsPerToken is the text size of one token: every generated word is three
// letters and a space, which both duet's default estimate and the
// simulator's ceil(chars/4) count as one token.
const charsPerToken = 4

// Turn is one request of a session.
type Turn struct {
	// User is the new user message of this turn.
	User string
	// Assistant is the reply the session appends to its history after this
	// turn. It is planned (OutputTokens long), not taken from the response,
	// so that every policy replays identical prompts. With a Seed it is
	// the reply duet-sim generates for the turn (sim.ReplyText), as a
	// client sends back the model's answer: an engine that caches its
	// answers (SGLang's decode radix cache) then finds it in the next
	// turn's prompt.
	Assistant string
	// Seed is the request's sampling seed (the body's seed); 0 sends none.
	Seed int64
	// PromptTokens is the planned size of the whole prompt (system prompt,
	// history and User).
	PromptTokens int
	// OutputTokens is the request's max_tokens.
	OutputTokens int
	// Think is the model-time pause between this turn's response and the
	// next turn.
	Think time.Duration
}

// Session is a sequence of turns: the next turn is sent after the previous
// response plus its think time. An independent request is a session of one
// turn without a system prompt.
type Session struct {
	// ID numbers the sessions of a workload in arrival order.
	ID int
	// Start is the session's model-time arrival offset from the run start.
	Start time.Duration
	// System is the shared system prompt ("" for none).
	System string
	// Turns are sent in order.
	Turns []Turn
	// Stream makes the session's requests streaming: only they show time to
	// first token and time per output token (see Params.StreamFraction).
	Stream bool
	// Class names the priority class the session's requests are sent with
	// (a gateway's x-duet-priority header in the simulator; the class's API
	// key on the real path, ChatRequest.Class), and Tenant who sends them
	// (TenantHeader); "" where the workload names none, and then the
	// requests carry neither. Only admission reads them
	// (clustersim.Admission, duet's admission section).
	Class, Tenant string
}

// Workload is a deterministic schedule of sessions.
type Workload struct {
	// Name is one of the Workload* constants.
	Name string
	// Rate is the offered session arrival rate (per model second).
	Rate float64
	// Window is the model-time arrival window: no request is sent after it.
	Window time.Duration
	// Sessions are sorted by Start.
	Sessions []Session
	// StreamFraction is the share of sessions drawn to stream.
	StreamFraction float64
}

// LimitStreaming keeps streaming on about frac (0 to 1) of the sessions
// that stream, spread evenly over them in order, and sends the others
// without streaming; StreamFraction becomes the share that streams.
func (w *Workload) LimitStreaming(frac float64) {
	frac = min(max(frac, 0), 1)
	kept, total := 0, 0
	for i := range w.Sessions {
		s := &w.Sessions[i]
		if !s.Stream {
			continue
		}
		total++
		// Session k of the streaming ones keeps streaming when the running
		// quota floor(k × frac) grows at it.
		if int(float64(total)*frac) > kept {
			kept++
		} else {
			s.Stream = false
		}
	}
	if len(w.Sessions) > 0 {
		w.StreamFraction = float64(kept) / float64(len(w.Sessions))
	}
}

// Requests is the number of requests planned: every session's turns.
func (w Workload) Requests() int {
	n := 0
	for _, s := range w.Sessions {
		n += len(s.Turns)
	}
	return n
}

// IntRange is an inclusive range sampled uniformly.
type IntRange struct{ Min, Max int }

// sample draws uniformly from [Min, Max].
func (r IntRange) sample(rng *rand.Rand) int {
	if r.Max <= r.Min {
		return r.Min
	}
	return r.Min + rng.IntN(r.Max-r.Min+1)
}

// mean returns the range's mean.
func (r IntRange) mean() float64 { return float64(r.Min+max(r.Max, r.Min)) / 2 }

// VariableParams shape the variable-length workload.
type VariableParams struct {
	// Prompt and Output are token ranges (default 1500-4000 and 200-1500).
	Prompt, Output IntRange
}

// MultiTurnParams shape the multi-turn workload.
type MultiTurnParams struct {
	// Systems is the number of distinct system prompts (default 8).
	Systems int
	// System is the system prompts' token range (default 900-1100).
	System IntRange
	// Turns is the number of turns per conversation (default 3-6).
	Turns IntRange
	// Question and Answer are token ranges of each turn (default 50-250
	// and 100-400).
	Question, Answer IntRange
	// Think is the mean model-time think time between turns, exponential
	// (default 2s).
	Think time.Duration
	// EngineAnswers makes each turn's reply the engine's own answer (a
	// seed per turn, see Turn.Seed), as clients send back what the model
	// said; off, replies are drawn text (the workload as first published).
	EngineAnswers bool
}

// BurstyParams shape the bursty mix.
type BurstyParams struct {
	// Period is one high phase plus one low phase (default 20s model time).
	Period time.Duration
	// HighFraction is the high phase's share of a period (default 0.25).
	HighFraction float64
	// HighFactor multiplies the mean rate during the high phase (default
	// 3); the low phase's rate makes the mean equal to the offered rate.
	HighFactor float64
	// SingleFraction is the share of arrivals that are independent
	// variable-length requests; the rest start conversations (default 0.5).
	SingleFraction float64
	Variable       VariableParams
	MultiTurn      MultiTurnParams
}

// PrefillBoundParams shape the prefill-bound workload: independent requests
// whose prompts are two orders of magnitude longer than their outputs.
type PrefillBoundParams struct {
	// Prompt and Output are token ranges (default 6000-14000 and 16-64).
	// The default prompts span 6-14 chunks of the dsv3-dp8-h100-node
	// profile's 1024-token chunked prefill and 1-2 of dense-8b-h100's 8192,
	// and fit either profile's per-rank KV cache.
	Prompt, Output IntRange
}

// CachePressureParams shape the cache-pressure workload: conversations
// like the multi-turn workload's, over so many distinct system prompts that
// their prefixes cannot all stay cached on one DP rank. The defaults draw
// 400 system prompts of 1500-2500 tokens, about 800,000 tokens of distinct
// prefixes against the 150,000-token KV cache of one dsv3-dp8-h100-node
// rank: a router that sends every system prompt everywhere keeps evicting
// them, while one that keeps each prompt on a few ranks can keep most of
// them cached (800,000 tokens over 8 ranks is 100,000 a rank).
type CachePressureParams struct {
	// Systems is the number of distinct system prompts (default 400).
	Systems int
	// System is the system prompts' token range (default 1500-2500).
	System IntRange
	// Turns is the number of turns per conversation (default 3-6, as in
	// MultiTurnParams).
	Turns IntRange
	// Question and Answer are token ranges of each turn (default 50-250
	// and 100-400, as in MultiTurnParams).
	Question, Answer IntRange
	// Think is the mean model-time think time between turns, exponential
	// (default 2s, as in MultiTurnParams).
	Think time.Duration
	// EngineAnswers is as in MultiTurnParams.
	EngineAnswers bool
}

// AgenticParams shape the agentic workload: long-context agent sessions.
// Each session shares one of a few system prompts (tool definitions),
// starts with a context of its own (a repository, a document, earlier
// conversation), and grows by a tool result and an answer per turn. The
// defaults give histories of about 20k to 60k tokens, of which about 90 %
// is the previous turn's prompt and answer, and answers of a few hundred
// tokens: the shape of coding agents, where a decode engine that caches
// its answers holds all but the last tool result of the next prompt.
type AgenticParams struct {
	// Systems is the number of distinct system prompts (default 4).
	Systems int
	// System is the system prompts' token range (default 1500-2500).
	System IntRange
	// Context is the session's first message, its own (default
	// 16000-30000 tokens).
	Context IntRange
	// Step is each later turn's new input, a tool result (default
	// 1500-4000 tokens).
	Step IntRange
	// Answer is each turn's output (default 100-600 tokens).
	Answer IntRange
	// MaxHistory ends a session before a turn would take its history
	// beyond it (default 60000 tokens).
	MaxHistory int
	// MaxTurns bounds a session's turns (default 16).
	MaxTurns int
	// Think is the mean model-time pause between a response and the next
	// turn (the tool's run time), exponential (default 2s).
	Think time.Duration
}

// MultiTenantParams shape the multi-tenant workload, after llm-d's
// precise prefix-cache benchmark: Tenants prefixes of Prefix tokens each,
// drawn once; each request (a session of one turn, Poisson arrivals) is a
// tenant drawn uniformly, its prefix as the system message and a Question
// of its own as the user message, answered in Answer tokens. There is no
// history. The defaults make 150 prefixes of 5.5k-6.5k tokens, about 900k
// tokens: three quarters of the KV of the eight prefill ranks of 2 × dp 4
// dsv3-dp8-h100-node engines (150k each), 1.5 times that of 2 × dp 2. The
// text is of words that are one token each for Llama-3.1, Qwen3 and
// DeepSeek-V3 as well as four characters each (tokenText), so that an
// engine that tokenizes counts the tokens planned.
type MultiTenantParams struct {
	// Tenants is the number of distinct prefixes (default 150).
	Tenants int
	// Prefix is each tenant's prefix length in tokens (default 5500-6500).
	Prefix IntRange
	// Question and Answer are each request's question and max_tokens
	// (default 200-800 and 100-300).
	Question, Answer IntRange
}

// withDefaults fills zero fields.
func (p MultiTenantParams) withDefaults() MultiTenantParams {
	if p.Tenants == 0 {
		p.Tenants = 150
	}
	if p.Prefix == (IntRange{}) {
		p.Prefix = IntRange{5500, 6500}
	}
	if p.Question == (IntRange{}) {
		p.Question = IntRange{200, 800}
	}
	if p.Answer == (IntRange{}) {
		p.Answer = IntRange{100, 300}
	}
	return p
}

// withDefaults fills zero fields.
func (p AgenticParams) withDefaults() AgenticParams {
	if p.Systems == 0 {
		p.Systems = 4
	}
	if p.System == (IntRange{}) {
		p.System = IntRange{1500, 2500}
	}
	if p.Context == (IntRange{}) {
		p.Context = IntRange{16000, 30000}
	}
	if p.Step == (IntRange{}) {
		p.Step = IntRange{1500, 4000}
	}
	if p.Answer == (IntRange{}) {
		p.Answer = IntRange{100, 600}
	}
	if p.MaxHistory == 0 {
		p.MaxHistory = 60000
	}
	if p.MaxTurns == 0 {
		p.MaxTurns = 16
	}
	if p.Think == 0 {
		p.Think = 2 * time.Second
	}
	return p
}

// withDefaults fills zero fields.
func (p VariableParams) withDefaults() VariableParams {
	if p.Prompt == (IntRange{}) {
		p.Prompt = IntRange{1500, 4000}
	}
	if p.Output == (IntRange{}) {
		p.Output = IntRange{200, 1500}
	}
	return p
}

// withDefaults fills zero fields.
func (p MultiTurnParams) withDefaults() MultiTurnParams {
	if p.Systems == 0 {
		p.Systems = 8
	}
	if p.System == (IntRange{}) {
		p.System = IntRange{900, 1100}
	}
	if p.Turns == (IntRange{}) {
		p.Turns = IntRange{3, 6}
	}
	if p.Question == (IntRange{}) {
		p.Question = IntRange{50, 250}
	}
	if p.Answer == (IntRange{}) {
		p.Answer = IntRange{100, 400}
	}
	if p.Think == 0 {
		p.Think = 2 * time.Second
	}
	return p
}

// withDefaults fills zero fields.
func (p BurstyParams) withDefaults() BurstyParams {
	if p.Period == 0 {
		p.Period = 20 * time.Second
	}
	if p.HighFraction == 0 {
		p.HighFraction = 0.25
	}
	if p.HighFactor == 0 {
		p.HighFactor = 3
	}
	if p.SingleFraction == 0 {
		p.SingleFraction = 0.5
	}
	p.Variable = p.Variable.withDefaults()
	p.MultiTurn = p.MultiTurn.withDefaults()
	return p
}

// withDefaults fills zero fields.
func (p PrefillBoundParams) withDefaults() PrefillBoundParams {
	if p.Prompt == (IntRange{}) {
		p.Prompt = IntRange{6000, 14000}
	}
	if p.Output == (IntRange{}) {
		p.Output = IntRange{16, 64}
	}
	return p
}

// multiTurn returns the conversation parameters with zero fields filled:
// the system prompts take this workload's defaults, the turns those of the
// multi-turn workload.
func (p CachePressureParams) multiTurn() MultiTurnParams {
	if p.Systems == 0 {
		p.Systems = 400
	}
	if p.System == (IntRange{}) {
		p.System = IntRange{1500, 2500}
	}
	return MultiTurnParams(p).withDefaults()
}

// Params holds the parameters of every workload; zero values take the
// defaults documented on each field.
type Params struct {
	Variable  VariableParams
	MultiTurn MultiTurnParams
	Bursty    BurstyParams
	// PrefillBound shapes the prefill_bound workload.
	PrefillBound PrefillBoundParams
	// HeavyTail shapes the heavy_tail workload.
	HeavyTail HeavyTailParams
	// CachePressure shapes the multiturn_pressure workload.
	CachePressure CachePressureParams
	// Agentic shapes the agentic workload.
	Agentic AgenticParams
	// MultiTenant shapes the multi_tenant workload.
	MultiTenant MultiTenantParams
	// PriorityMix shapes the priority_mix workload.
	PriorityMix PriorityMixParams
	// StreamFraction is the share of sessions that stream, drawn per
	// session independently of everything else, so that it changes no
	// arrival and no prompt (0 means 1: every session streams).
	StreamFraction float64
}

// Generate builds the named workload: sessions arriving at rate per model
// second during window, from seed. Equal arguments give equal workloads.
func Generate(name string, rate float64, window time.Duration, seed uint64, p Params) (Workload, error) {
	if rate <= 0 || window <= 0 {
		return Workload{}, fmt.Errorf("workload %s: rate and window must be positive", name)
	}
	// The workload name is part of the seed, so that workloads built from
	// one seed do not share text.
	rng := rand.New(rand.NewPCG(seed, stringSeed(name)))
	w := Workload{Name: name, Rate: rate, Window: window}
	switch name {
	case WorkloadVariable:
		vp := p.Variable.withDefaults()
		for i, at := range PoissonArrivals(rng, rate, window) {
			w.Sessions = append(w.Sessions, variableSession(rng, i, at, vp))
		}
	case WorkloadMultiTurn:
		mp := p.MultiTurn.withDefaults()
		systems := systemPrompts(rng, mp)
		for i, at := range PoissonArrivals(rng, rate, window) {
			w.Sessions = append(w.Sessions, conversation(rng, i, at, systems, mp))
		}
	case WorkloadBursty:
		bp := p.Bursty.withDefaults()
		systems := systemPrompts(rng, bp.MultiTurn)
		high, low := BurstRates(rate, bp.HighFactor, bp.HighFraction)
		arrivals := ModulatedArrivals(rng, high, low, bp.Period, bp.HighFraction, window)
		for i, at := range arrivals {
			if rng.Float64() < bp.SingleFraction {
				w.Sessions = append(w.Sessions, variableSession(rng, i, at, bp.Variable))
			} else {
				w.Sessions = append(w.Sessions, conversation(rng, i, at, systems, bp.MultiTurn))
			}
		}
	case WorkloadPrefillBound:
		pp := p.PrefillBound.withDefaults()
		vp := VariableParams(pp)
		for i, at := range PoissonArrivals(rng, rate, window) {
			w.Sessions = append(w.Sessions, variableSession(rng, i, at, vp))
		}
	case WorkloadHeavyTail:
		hp := p.HeavyTail.withDefaults()
		for i, at := range PoissonArrivals(rng, rate, window) {
			w.Sessions = append(w.Sessions, heavyTailSession(rng, i, at, hp))
		}
	case WorkloadCachePressure:
		mp := p.CachePressure.multiTurn()
		systems := systemPrompts(rng, mp)
		for i, at := range PoissonArrivals(rng, rate, window) {
			w.Sessions = append(w.Sessions, conversation(rng, i, at, systems, mp))
		}
	case WorkloadAgentic:
		ap := p.Agentic.withDefaults()
		systems := make([]string, ap.Systems)
		for i := range systems {
			systems[i] = Text(rng, ap.System.sample(rng))
		}
		for i, at := range PoissonArrivals(rng, rate, window) {
			w.Sessions = append(w.Sessions, agentSession(rng, i, at, systems, ap))
		}
	case WorkloadMultiTenant:
		w.Sessions = multiTenantSessions(rng, rate, window, p.MultiTenant.withDefaults())
	case WorkloadPriorityMix:
		w.Sessions = priorityMixSessions(rng, rate, window, p.PriorityMix.withDefaults())
	default:
		return Workload{}, fmt.Errorf("unknown workload %q (want %s)", name, strings.Join(AllWorkloads(), ", "))
	}
	frac := p.StreamFraction
	if frac <= 0 || frac > 1 {
		frac = 1
	}
	w.StreamFraction = frac
	streams := rand.New(rand.NewPCG(seed, stringSeed(name+"/stream")))
	streamed := 0
	for i := range w.Sessions {
		// Every session draws, so that the others' draws stay the same.
		s := &w.Sessions[i]
		s.Stream = streams.Float64() < frac || alwaysStreams(*s)
		if s.Stream {
			streamed++
		}
	}
	if name == WorkloadPriorityMix && len(w.Sessions) > 0 {
		w.StreamFraction = float64(streamed) / float64(len(w.Sessions))
	}
	return w, nil
}

// stringSeed hashes s (FNV-1a) into a seed.
func stringSeed(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// variableSession is one independent request.
func variableSession(rng *rand.Rand, id int, at time.Duration, p VariableParams) Session {
	prompt := p.Prompt.sample(rng)
	out := p.Output.sample(rng)
	return Session{ID: id, Start: at, Turns: []Turn{{
		User: Text(rng, prompt), PromptTokens: prompt, OutputTokens: out,
	}}}
}

// systemPrompts draws the shared system prompts.
func systemPrompts(rng *rand.Rand, p MultiTurnParams) []string {
	out := make([]string, p.Systems)
	for i := range out {
		out[i] = Text(rng, p.System.sample(rng))
	}
	return out
}

// conversation is one multi-turn session on a random shared system prompt.
// With p.EngineAnswers each turn carries a seed and its reply is the
// engine's for that seed (seededTurn).
func conversation(rng *rand.Rand, id int, at time.Duration, systems []string, p MultiTurnParams) Session {
	s := Session{ID: id, Start: at, System: systems[rng.IntN(len(systems))]}
	history := len(s.System) / charsPerToken
	for range p.Turns.sample(rng) {
		q, a := p.Question.sample(rng), p.Answer.sample(rng)
		history += q
		turn := Turn{
			User:         Text(rng, q),
			Assistant:    Text(rng, a),
			PromptTokens: history,
			OutputTokens: a,
			Think:        time.Duration(rng.ExpFloat64() * float64(p.Think)),
		}
		if p.EngineAnswers {
			turn = seededTurn(turn, len(s.Turns))
		}
		s.Turns = append(s.Turns, turn)
		history += a
	}
	return s
}

// seededTurn gives turn k of a session a seed drawn from its user text
// (not from the workload's generator, whose sequence stays as it was) and
// makes its Assistant the reply duet-sim generates for that seed, of the
// same length.
func seededTurn(t Turn, k int) Turn {
	t.Seed = int64(stringSeed(t.User)>>1) + int64(k) + 1
	t.Assistant = sim.ReplyText(t.Seed, t.OutputTokens)
	return t
}

// multiTenantSessions draws the tenants' prefixes, then one single-turn
// session per Poisson arrival: a tenant drawn uniformly and a question of
// its own.
func multiTenantSessions(rng *rand.Rand, rate float64, window time.Duration, p MultiTenantParams) []Session {
	words := tokenWordList()
	prefixes := make([]string, p.Tenants)
	lengths := make([]int, p.Tenants)
	for i := range prefixes {
		lengths[i] = p.Prefix.sample(rng)
		prefixes[i] = tokenText(rng, words, lengths[i])
	}
	var out []Session
	for i, at := range PoissonArrivals(rng, rate, window) {
		t := rng.IntN(p.Tenants)
		q, a := p.Question.sample(rng), p.Answer.sample(rng)
		out = append(out, Session{ID: i, Start: at, System: prefixes[t], Turns: []Turn{{
			User: tokenText(rng, words, q), PromptTokens: lengths[t] + q, OutputTokens: a,
		}}})
	}
	return out
}

// agentSession is one long-context agent session: a shared system prompt
// (the tools' definitions), a context of its own, then turns that each add
// a tool result and get an answer, until the history reaches MaxHistory.
func agentSession(rng *rand.Rand, id int, at time.Duration, systems []string, p AgenticParams) Session {
	s := Session{ID: id, Start: at, System: systems[rng.IntN(len(systems))]}
	history := len(s.System) / charsPerToken
	first := true
	for len(s.Turns) < p.MaxTurns {
		q := p.Step.sample(rng)
		if first {
			q = p.Context.sample(rng)
		}
		a := p.Answer.sample(rng)
		if !first && history+q+a > p.MaxHistory {
			break
		}
		first = false
		history += q
		s.Turns = append(s.Turns, seededTurn(Turn{
			User:         Text(rng, q),
			PromptTokens: history,
			OutputTokens: a,
			Think:        time.Duration(rng.ExpFloat64() * float64(p.Think)),
		}, len(s.Turns)))
		history += a
	}
	return s
}

// Text returns tokens pseudo-random three-letter words, each followed by a
// space: tokens×4 characters.
func Text(rng *rand.Rand, tokens int) string {
	b := make([]byte, 0, tokens*charsPerToken)
	for range tokens {
		b = append(b, byte('a'+rng.IntN(26)), byte('a'+rng.IntN(26)), byte('a'+rng.IntN(26)), ' ')
	}
	return string(b)
}

// PoissonArrivals returns the arrival offsets of a Poisson process of rate
// per second within window.
func PoissonArrivals(rng *rand.Rand, rate float64, window time.Duration) []time.Duration {
	var out []time.Duration
	t := 0.0
	end := window.Seconds()
	for {
		t += rng.ExpFloat64() / rate
		if t >= end {
			return out
		}
		out = append(out, time.Duration(t*float64(time.Second)))
	}
}

// BurstRates returns the high and low rates of a two-phase process whose
// mean is rate: the high phase (a highFraction share of the time) runs at
// factor×rate, the low phase at what is left (never below zero).
func BurstRates(rate, factor, highFraction float64) (high, low float64) {
	high = rate * factor
	low = rate * (1 - highFraction*factor) / (1 - highFraction)
	return high, math.Max(low, 0)
}

// ModulatedArrivals returns the arrivals of a Poisson process whose rate
// alternates: each period starts with a high phase (highFraction of the
// period at the high rate), then a low phase at the low rate.
func ModulatedArrivals(rng *rand.Rand, high, low float64, period time.Duration, highFraction float64, window time.Duration) []time.Duration {
	var out []time.Duration
	p := period.Seconds()
	for start := 0.0; start < window.Seconds(); start += p {
		phases := []struct{ from, to, rate float64 }{
			{start, start + p*highFraction, high},
			{start + p*highFraction, start + p, low},
		}
		for _, ph := range phases {
			to := math.Min(ph.to, window.Seconds())
			if ph.rate <= 0 || ph.from >= to {
				continue
			}
			for t := ph.from + rng.ExpFloat64()/ph.rate; t < to; t += rng.ExpFloat64() / ph.rate {
				out = append(out, time.Duration(t*float64(time.Second)))
			}
		}
	}
	return out
}

// MeanOutputTokens is the expected max_tokens of a workload's requests.
func MeanOutputTokens(name string, p Params) float64 {
	switch name {
	case WorkloadMultiTurn:
		return p.MultiTurn.withDefaults().Answer.mean()
	case WorkloadBursty:
		bp := p.Bursty.withDefaults()
		single := bp.SingleFraction
		turns := (1 - single) * bp.MultiTurn.Turns.mean()
		return (single*bp.Variable.Output.mean() + turns*bp.MultiTurn.Answer.mean()) / (single + turns)
	case WorkloadPrefillBound:
		return p.PrefillBound.withDefaults().Output.mean()
	case WorkloadHeavyTail:
		hp := p.HeavyTail.withDefaults()
		return clampedLognormalMean(hp.OutputMu, hp.OutputSigma, hp.Output)
	case WorkloadCachePressure:
		return p.CachePressure.multiTurn().Answer.mean()
	case WorkloadAgentic:
		return p.Agentic.withDefaults().Answer.mean()
	case WorkloadMultiTenant:
		return p.MultiTenant.withDefaults().Answer.mean()
	case WorkloadPriorityMix:
		pp := p.PriorityMix.withDefaults()
		return pp.InteractiveShare*pp.Interactive.Output.mean() + (1-pp.InteractiveShare)*pp.Batch.Output.mean()
	}
	return p.Variable.withDefaults().Output.mean()
}

// MeanRequestsPerSession is the expected number of turns of a workload's
// sessions, used to express offered load in requests per second.
func MeanRequestsPerSession(name string, p Params) float64 {
	switch name {
	case WorkloadMultiTurn:
		return p.MultiTurn.withDefaults().Turns.mean()
	case WorkloadBursty:
		bp := p.Bursty.withDefaults()
		return bp.SingleFraction + (1-bp.SingleFraction)*bp.MultiTurn.Turns.mean()
	case WorkloadCachePressure:
		return p.CachePressure.multiTurn().Turns.mean()
	case WorkloadAgentic:
		// About (MaxHistory - System - Context) / (Step + Answer) turns
		// after the first.
		ap := p.Agentic.withDefaults()
		return 1 + max(0, float64(ap.MaxHistory)-ap.System.mean()-ap.Context.mean())/(ap.Step.mean()+ap.Answer.mean())
	}
	// Independent requests (variable, prefill_bound, heavy_tail,
	// multi_tenant, priority_mix).
	return 1
}

// QuickParams are small workloads for smoke runs and tests: short prompts
// and outputs, two-turn conversations without think time to speak of. The
// added workloads keep their shape at a smaller scale: prefill-bound
// prompts stay about 200 times their outputs, the heavy tail keeps its
// lognormal shapes around smaller medians, and the cache-pressure
// conversations keep 20 times as many system prompts as the multi-turn
// ones. The multi-tenant workload keeps tenants whose prefixes are about
// ten times their questions, and the priority mix batch prompts about ten
// times the interactive ones.
func QuickParams() Params {
	v := VariableParams{Prompt: IntRange{200, 600}, Output: IntRange{5, 20}}
	m := MultiTurnParams{Systems: 2, System: IntRange{100, 200}, Turns: IntRange{2, 3},
		Question: IntRange{20, 50}, Answer: IntRange{5, 15}, Think: 100 * time.Millisecond}
	return Params{Variable: v, MultiTurn: m, Bursty: BurstyParams{Period: 4 * time.Second, Variable: v, MultiTurn: m},
		PrefillBound: PrefillBoundParams{Prompt: IntRange{1000, 2000}, Output: IntRange{2, 12}},
		// Medians 300 and 10 tokens; the sigmas stay the defaults.
		HeavyTail: HeavyTailParams{PromptMu: math.Log(300), OutputMu: math.Log(10),
			Prompt: IntRange{16, 2000}, Output: IntRange{2, 40}},
		CachePressure: CachePressureParams{Systems: 40, System: m.System, Turns: m.Turns,
			Question: m.Question, Answer: m.Answer, Think: m.Think},
		Agentic: AgenticParams{Systems: 2, System: IntRange{100, 200}, Context: IntRange{1600, 3000},
			Step: IntRange{150, 400}, Answer: IntRange{10, 60}, MaxHistory: 6000, Think: m.Think},
		MultiTenant: MultiTenantParams{Tenants: 12, Prefix: IntRange{500, 700}, Question: IntRange{20, 80}, Answer: IntRange{5, 20}},
		PriorityMix: PriorityMixParams{Interactive: VariableParams{Prompt: IntRange{50, 150}, Output: IntRange{5, 20}},
			Batch: VariableParams{Prompt: IntRange{500, 1500}, Output: IntRange{10, 40}}},
	}
}
