package clustersim

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/duet-router/duet/scheduler"
)

// Request is what one request saw, in model time.
type Request struct {
	// Session and Turn locate the request in the workload.
	Session, Turn int
	// Arrival is when it was sent.
	Arrival time.Duration
	// Prefill and Decode name the ranks that served it ("p1/r3").
	Prefill, Decode string
	// PromptTokens and CachedTokens are the prompt's length and the part
	// the serving rank's prefix cache held.
	PromptTokens, CachedTokens int
	// HitBound is the part of the prompt that a cache holding every prompt
	// sent before it, on every rank, would hold: no routing can hit more.
	HitBound int
	// DecodeCached is the part of the prompt the decode rank's radix cache
	// held (its KV was not transferred), and DecodeBound what a decode
	// cache holding every earlier prompt and answer would hold; both 0
	// without a decode radix cache.
	DecodeCached, DecodeBound int
	// OutputTokens is the number of tokens generated.
	OutputTokens int
	// TTFT is the time to the first token, E2E to the last; TPOT is the
	// mean time per output token after the first. Zero when not reached.
	TTFT, TPOT, E2E time.Duration
	// Err is why it failed ("" when it was served; "unfinished" when the
	// run ended first; "refused: " and Refused when admission refused it).
	Err string
	// Class and Tenant are the request's priority class and tenant: its
	// session's, or with admission the class duet's rules gave it; "" when
	// the workload names none.
	Class  string `json:",omitempty"`
	Tenant string `json:",omitempty"`
	// Queued reports that it waited in duet's admission queue, for Wait
	// (until it was let through or refused).
	Queued bool          `json:",omitempty"`
	Wait   time.Duration `json:",omitempty"`
	// Refused is why admission refused it (admit.Outcome: queue_full,
	// wait_limit, shed); "" when it was let through.
	Refused string `json:",omitempty"`
	// Timeline of a PD request, in model time since the run's start (0
	// where not reached): PrefillAdmitted when its prefill rank admitted
	// the prompt, PrefillComputed when the prompt was in KV, PrefillDone
	// when its KV had reached the decode, and DecodeAdmitted when the
	// decode rank preallocated its KV (see Result.TTFTParts). Left out of
	// the JSON, which TestNoAdmissionUnchanged pins.
	PrefillAdmitted, PrefillComputed, PrefillDone, DecodeAdmitted time.Duration `json:"-"`
}

// sample is the ranks' true load at one instant.
type sample struct {
	at      time.Duration
	prefill []float64 // pending prefill tokens per prefill rank
	decode  []float64 // KV in use per decode rank
}

// sample records every rank's true load now.
func (r *run) sample() {
	s := sample{at: r.now}
	for _, e := range r.prefill {
		for _, st := range e.model.Ranks(r.now) {
			s.prefill = append(s.prefill, float64(st.PendingPrefill))
		}
	}
	for _, e := range r.decode {
		for _, st := range e.model.Ranks(r.now) {
			s.decode = append(s.decode, float64(st.UsedTokens))
		}
	}
	r.samples = append(r.samples, s)
}

// Result is the outcome of a run.
type Result struct {
	// Requests are every request sent, in the order they were sent.
	Requests []Request
	// Window and Warmup delimit the measured arrivals: [Warmup, Window).
	Window, Warmup time.Duration
	// PrefillWork is, per prefill rank (rank-major is not implied: engine
	// by engine, rank by rank), the prompt tokens it computed for measured
	// requests (prompt minus cache hit).
	PrefillWork []float64
	// PrefillImbalance and DecodeImbalance are the time averages, over
	// the measured window, of max/mean across ranks of the true pending
	// prefill tokens and KV in use (1 is perfect; instants with an idle
	// pool are skipped).
	PrefillImbalance, DecodeImbalance float64
}

// result collects the run's outcome.
func (r *run) result() *Result {
	w := r.cfg.Workload.Workload
	res := &Result{Window: w.Window, Warmup: r.cfg.Warmup}
	index := map[*engine]int{}
	n := 0
	for _, e := range r.prefill {
		index[e] = n
		n += e.dp
	}
	res.PrefillWork = make([]float64, n)
	for _, q := range r.requests {
		out := Request{
			Session: q.session, Turn: q.turn, Arrival: q.arrival,
			PromptTokens: q.turnInfo.prompt.Tokens, CachedTokens: q.cached, HitBound: q.bound, OutputTokens: q.generated, Err: q.err,
			DecodeCached: q.decodeCached, DecodeBound: q.decodeBound,
			Class: q.class, Tenant: q.tenant, Queued: q.queued, Wait: q.wait, Refused: q.refused,
		}
		if q.pEng != nil {
			out.Prefill = rankName("p", q.pEng, q.pRank)
		}
		if q.dEng != nil {
			out.Decode = rankName("d", q.dEng, q.dRank)
		}
		if q.pItem != nil {
			out.PrefillAdmitted, out.PrefillComputed, out.PrefillDone = q.pItem.AdmittedAt(), q.pItem.FirstTokenAt(), q.pItem.DoneAt()
		}
		if q.dItem != nil && q.pItem != nil {
			out.DecodeAdmitted = q.dItem.AdmittedAt()
		}
		if !q.finished {
			out.Err = "unfinished"
		}
		if q.firstAt > 0 {
			out.TTFT = q.firstAt - q.arrival
		}
		if q.finished && out.Err == "" {
			out.E2E = q.doneAt - q.arrival
			if q.generated > 1 {
				out.TPOT = (q.doneAt - q.firstAt) / time.Duration(q.generated-1)
			}
		}
		if q.pEng != nil && q.prefillDone && res.measured(q.arrival) {
			res.PrefillWork[index[q.pEng]+q.pRank] += float64(out.PromptTokens - out.CachedTokens)
		}
		res.Requests = append(res.Requests, out)
	}
	var pre, dec []float64
	for _, s := range r.samples {
		if !res.measured(s.at) {
			continue
		}
		if v, ok := maxOverMean(s.prefill); ok {
			pre = append(pre, v)
		}
		if v, ok := maxOverMean(s.decode); ok {
			dec = append(dec, v)
		}
	}
	res.PrefillImbalance, res.DecodeImbalance = mean(pre), mean(dec)
	return res
}

// measured reports whether an arrival at t counts.
func (res *Result) measured(t time.Duration) bool { return t >= res.Warmup && t < res.Window }

// rankName names a rank for reports.
func rankName(prefix string, e *engine, rank int) string {
	if rank == scheduler.NoRank {
		rank = 0
	}
	return prefix + strconv.Itoa(e.index) + "/r" + strconv.Itoa(rank)
}

// maxOverMean is max/mean of xs; ok is false when the mean is zero.
func maxOverMean(xs []float64) (float64, bool) {
	if len(xs) == 0 {
		return 0, false
	}
	m := mean(xs)
	if m <= 0 {
		return 0, false
	}
	return slices.Max(xs) / m, true
}

// mean of xs; 0 when empty.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// Summary condenses the measured requests of a Result.
type Summary struct {
	// Requests, Served and Failed count the measured requests; Failed
	// includes the unfinished ones and those admission refused, which
	// Refused counts.
	Requests, Served, Failed int
	Refused                  int `json:",omitempty"`
	// TTFT and E2E in model milliseconds over served requests.
	TTFTMean, TTFTP50, TTFTP99 float64
	// TPOTMean is the mean time per output token (ms) over served
	// requests with more than one output token.
	TPOTMean float64
	// E2EMean is the mean end-to-end latency (ms).
	E2EMean float64
	// HitRate is cached prompt tokens / prompt tokens.
	HitRate float64
	// HitBound is the hit rate of a cache that holds every earlier prompt
	// on every rank (Request.HitBound): an upper bound for any routing.
	HitBound float64
	// DecodeHitRate is the decode radix caches' matched tokens / prompt
	// tokens, and DecodeHitBound the same for a decode cache holding every
	// earlier prompt and answer (0 without decode radix caches).
	DecodeHitRate, DecodeHitBound float64
	// PrefillShareImbalance is max/mean of PrefillWork.
	PrefillShareImbalance float64
	// PrefillImbalance and DecodeImbalance are the Result's.
	PrefillImbalance, DecodeImbalance float64
	// OutputPerSecond is output tokens of measured requests per model
	// second of the measured window.
	OutputPerSecond float64
}

// Summarize computes the Summary of the measured requests. A failed or
// unfinished request counts with an infinite TTFT in the percentiles, so
// that failures cannot improve them; means are over served requests.
func (res *Result) Summarize() Summary {
	var s Summary
	var ttft, tpot, e2e []float64
	var prompt, cached, bound, output, decodeCached, decodeBound float64
	for _, q := range res.Requests {
		if !res.measured(q.Arrival) {
			continue
		}
		s.Requests++
		if q.Err != "" {
			s.Failed++
			if q.Refused != "" {
				s.Refused++
			}
			ttft = append(ttft, math.Inf(1))
			continue
		}
		s.Served++
		ttft = append(ttft, ms(q.TTFT))
		e2e = append(e2e, ms(q.E2E))
		if q.OutputTokens > 1 {
			tpot = append(tpot, ms(q.TPOT))
		}
		prompt += float64(q.PromptTokens)
		cached += float64(q.CachedTokens)
		bound += float64(q.HitBound)
		output += float64(q.OutputTokens)
		decodeCached += float64(q.DecodeCached)
		decodeBound += float64(q.DecodeBound)
	}
	slices.Sort(ttft)
	finite := ttft[:len(ttft)-s.Failed]
	s.TTFTMean = mean(finite)
	s.TTFTP50 = percentile(ttft, 50)
	s.TTFTP99 = percentile(ttft, 99)
	s.TPOTMean = mean(tpot)
	s.E2EMean = mean(e2e)
	if prompt > 0 {
		s.HitRate = cached / prompt
		s.HitBound = bound / prompt
		s.DecodeHitRate = decodeCached / prompt
		s.DecodeHitBound = decodeBound / prompt
	}
	if v, ok := maxOverMean(res.PrefillWork); ok {
		s.PrefillShareImbalance = v
	}
	s.PrefillImbalance, s.DecodeImbalance = res.PrefillImbalance, res.DecodeImbalance
	if d := (res.Window - res.Warmup).Seconds(); d > 0 {
		s.OutputPerSecond = output / d
	}
	return s
}

// ms converts to model milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile is the nearest-rank percentile p of sorted xs; 0 when empty.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}
