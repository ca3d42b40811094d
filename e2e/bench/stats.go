package bench

import (
	"math"
	"slices"
	"time"
)

// Dist summarizes a sample: mean, median and 99th percentile.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
}

// Summarize returns the distribution of xs (zero Dist for no values).
func Summarize(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Dist{N: len(s), Mean: sum / float64(len(s)), P50: Percentile(s, 50), P99: Percentile(s, 99)}
}

// Percentile returns the p-th percentile of sorted values, interpolating
// linearly between closest ranks.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	frac := pos - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}

// Imbalance returns the time average of max/mean over the ranks of role,
// over the polls taken in [from, to], skipping polls where the mean is zero
// (an idle pool is not imbalanced). It returns 0 when no poll counts.
func Imbalance(polls []Poll, role string, from, to time.Duration) float64 {
	sum, n := 0.0, 0
	for _, p := range polls {
		if p.At < from || p.At > to {
			continue
		}
		v := p.Tokens[role]
		if len(v) == 0 {
			continue
		}
		total, peak := 0.0, 0.0
		for _, x := range v {
			total += x
			peak = math.Max(peak, x)
		}
		mean := total / float64(len(v))
		if mean <= 0 {
			continue
		}
		sum += peak / mean
		n++
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// LoadShareImbalance returns max/mean over the ranks of role of each rank's
// load averaged over the polls in [from, to]: how unevenly the run's work
// was spread, free of the granularity that makes instantaneous max/mean
// (Imbalance) large when few requests are in flight. It returns 0 when no
// poll counts.
func LoadShareImbalance(polls []Poll, role string, from, to time.Duration) float64 {
	var sums []float64
	for _, p := range polls {
		if p.At < from || p.At > to || len(p.Tokens[role]) == 0 {
			continue
		}
		v := p.Tokens[role]
		if sums == nil {
			sums = make([]float64, len(v))
		}
		for i := range min(len(v), len(sums)) {
			sums[i] += v[i]
		}
	}
	total, peak := 0.0, 0.0
	for _, x := range sums {
		total += x
		peak = math.Max(peak, x)
	}
	if total <= 0 {
		return 0
	}
	return peak / (total / float64(len(sums)))
}

// ActiveHitRate returns the mean of the cache_hit_rate gauge of role's
// ranks over the polls in [from, to], counting a rank only while it holds
// tokens: the gauge describes a rank's last admitted batch, so an idle
// rank's value is stale. It returns -1 when no (poll, rank) counts.
func ActiveHitRate(polls []Poll, role string, from, to time.Duration) float64 {
	sum, n := 0.0, 0
	for _, p := range polls {
		if p.At < from || p.At > to {
			continue
		}
		tokens := p.Tokens[role]
		for i, x := range p.CacheHitRate[role] {
			if i < len(tokens) && tokens[i] > 0 {
				sum += x
				n++
			}
		}
	}
	if n == 0 {
		return -1
	}
	return sum / float64(n)
}

// Result is one request of a run.
type Result struct {
	// Session and Turn identify the request in its workload.
	Session, Turn int
	// Offset is the model time at which it was sent, since the run start.
	Offset time.Duration
	// Outcome is what the client saw (wall-clock times).
	Outcome Outcome
	// Class and Tenant are the session's (Session.Class and Tenant).
	Class, Tenant string
}

// Summary is the outcome of one case.
type Summary struct {
	Workload string  `json:"workload"`
	Policy   string  `json:"policy"`
	Rate     float64 `json:"rate"`
	// RequestRate is the offered request rate (sessions × mean turns).
	RequestRate float64 `json:"request_rate"`
	// Requests were sent in the measured window; Completed finished,
	// Errors failed, Unfinished were still running at the cutoff, and
	// Refused were answered 429 by the router (admission shed them).
	Requests   int `json:"requests"`
	Completed  int `json:"completed"`
	Errors     int `json:"errors"`
	Unfinished int `json:"unfinished"`
	Refused    int `json:"refused,omitempty"`
	// TTFTms and TPOTms are in model milliseconds, over the streamed
	// requests (TTFTms.N of them). TTFT includes streamed requests still
	// waiting for their first token at the cutoff, with their wait so far
	// (a lower bound).
	TTFTms Dist `json:"ttft_ms"`
	TPOTms Dist `json:"tpot_ms"`
	// E2Ems is the latency of every completed request, in model ms.
	E2Ems Dist `json:"e2e_ms"`
	// StreamFraction is the share of sessions that streamed.
	StreamFraction float64 `json:"stream_fraction"`
	// Throughput is generated tokens delivered per model second during
	// the measured window.
	Throughput float64 `json:"throughput_tok_s"`
	// ImbalancePrefill and ImbalanceDecode are the time-averaged max/mean
	// of per-rank tokens (1 is perfect balance).
	ImbalancePrefill float64 `json:"imbalance_prefill"`
	ImbalanceDecode  float64 `json:"imbalance_decode"`
	// ShareImbalancePrefill and ShareImbalanceDecode are max/mean of the
	// ranks' run-averaged load (LoadShareImbalance).
	ShareImbalancePrefill float64 `json:"share_imbalance_prefill"`
	ShareImbalanceDecode  float64 `json:"share_imbalance_decode"`
	// HitRate is the prefix cache hit rate (0-1), -1 when unknown;
	// HitSource says where it came from (see setHitRate).
	HitRate   float64 `json:"hit_rate"`
	HitSource string  `json:"hit_source"`
	// FirstError is one error message, for the report.
	FirstError string `json:"first_error,omitempty"`
	// Failed is set when the case could not run at all.
	Failed string `json:"failed,omitempty"`
	// WallSeconds is the case's wall time, stack start to stop.
	WallSeconds float64 `json:"wall_seconds"`
	// Duet is what duet's process and metrics say of the case; nil when
	// another router ran.
	Duet *DuetStats `json:"duet,omitempty"`
	// Classes break the case down by priority class, for a workload whose
	// sessions name classes (SummarizeClasses); nil otherwise.
	Classes []ClassStats `json:"classes,omitempty"`
	// SLO is what Classes' goodput counts against; nil without Classes.
	SLO *SLO `json:"slo,omitempty"`
	// Stages are the mean time requests spent in each stage on the
	// prefill and decode engines (their sglang:per_stage_req_latency_seconds
	// from the window's start until the replay ended); nil when the
	// engines export no such histogram.
	Stages []StageLatency `json:"stages,omitempty"`
}

// Window is the measured part of a run, in model time since its start.
type Window struct{ From, To time.Duration }

// Summarize fills s's request and load metrics from the results, polls and
// prefill counters (nil when the engines have none) of one run. t0 is the
// run's wall-clock origin, scale the time scale, and cutoff the wall time
// at which unfinished requests were cancelled.
func (s *Summary) Summarize(results []Result, polls []Poll, counters *CounterDelta, w Window, t0, cutoff time.Time, scale float64) {
	model := func(d time.Duration) float64 { return float64(d) * scale / float64(time.Millisecond) }
	var ttft, tpot, e2e []float64
	var prompt, cached int
	reported := false
	var tokens float64
	winFrom, winTo := t0.Add(time.Duration(float64(w.From)/scale)), t0.Add(time.Duration(float64(w.To)/scale))
	for _, r := range results {
		o := r.Outcome
		tokens += tokensWithin(o, winFrom, winTo)
		if r.Offset < w.From || r.Offset > w.To {
			continue
		}
		s.Requests++
		switch {
		case o.Refused:
			s.Refused++
			continue
		case o.Err != "":
			s.Errors++
			if s.FirstError == "" {
				s.FirstError = o.Err
			}
			continue
		case o.OK():
			s.Completed++
		default:
			s.Unfinished++
		}
		if o.OK() {
			e2e = append(e2e, model(o.Done.Sub(o.Sent)))
		}
		if o.Stream {
			ttft, tpot = appendStreamTimes(ttft, tpot, o, cutoff, model)
		}
		if o.OK() && o.Usage != nil {
			prompt += o.Usage.PromptTokens
			cached += o.Usage.CachedTokens
			reported = reported || o.Usage.HasCached
		}
	}
	s.TTFTms, s.TPOTms, s.E2Ems = Summarize(ttft), Summarize(tpot), Summarize(e2e)
	if span := (w.To - w.From).Seconds(); span > 0 {
		s.Throughput = tokens / span
	}
	s.ImbalancePrefill = Imbalance(polls, RolePrefill, w.From, w.To)
	s.ImbalanceDecode = Imbalance(polls, RoleDecode, w.From, w.To)
	s.ShareImbalancePrefill = LoadShareImbalance(polls, RolePrefill, w.From, w.To)
	s.ShareImbalanceDecode = LoadShareImbalance(polls, RoleDecode, w.From, w.To)
	s.setHitRate(prompt, cached, reported, counters, polls, w)
}

// setHitRate picks the best prefix-hit evidence: the prefill engines'
// cached/prompt token counters over the window; else the cached tokens the
// responses report (with PD these come from the decode leg, which may not
// see the prefill's cache); else the prefill engines' cache_hit_rate
// gauge, averaged over polls and ranks.
func (s *Summary) setHitRate(prompt, cached int, reported bool, counters *CounterDelta, polls []Poll, w Window) {
	gauge := ActiveHitRate(polls, RolePrefill, w.From, w.To)
	switch {
	case counters != nil && counters.Prompt > 0:
		s.HitRate, s.HitSource = counters.Cached/counters.Prompt, "prefill counters"
	case reported && cached > 0 && prompt > 0:
		s.HitRate, s.HitSource = float64(cached)/float64(prompt), "usage"
	case gauge > 0:
		s.HitRate, s.HitSource = gauge, "prefill gauge"
	case reported && prompt > 0:
		s.HitRate, s.HitSource = 0, "usage"
	default:
		s.HitRate, s.HitSource = -1, "not reported"
	}
}

// CounterDelta is the growth of the prefill engines' prompt and cached
// token counters over a window.
type CounterDelta struct{ Prompt, Cached float64 }

// tokensWithin estimates how many of o's generated tokens were produced in
// [from, to], spreading them evenly between the first and last chunk (for a
// request that was not streamed, between sending and the response).
func tokensWithin(o Outcome, from, to time.Time) float64 {
	n := float64(o.Tokens())
	first, last := o.First, o.Last
	if !o.Stream {
		first, last = o.Sent, o.Done
	}
	if n == 0 || first.IsZero() || last.IsZero() {
		return 0
	}
	if !last.After(first) {
		if first.Before(from) || first.After(to) {
			return 0
		}
		return n
	}
	lo, hi := maxTime(first, from), minTime(last, to)
	if !hi.After(lo) {
		return 0
	}
	return n * float64(hi.Sub(lo)) / float64(last.Sub(first))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
