package bench

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// SLO is the per-request service level that goodput counts against, in
// model time. A request meets it when it was served (not refused, failed
// or cut off) and, streamed, its first token came within TTFTms and its
// mean time per output token after the first was within TPOTms; a request
// sent without streaming meets it when its whole response came within
// TTFTms + TPOTms × (tokens − 1), which both bounds together imply.
type SLO struct {
	TTFTms float64 `json:"ttft_ms"`
	TPOTms float64 `json:"tpot_ms"`
}

// DefaultSLO is the simulator's admission comparison's SLO (make bench-sim
// -admission: -slo-ttft-p99 2s and -slo-tpot-mean 50ms, held by each
// request).
func DefaultSLO() SLO { return SLO{TTFTms: 2000, TPOTms: 50} }

// String describes the SLO.
func (s SLO) String() string {
	return fmt.Sprintf("TTFT ≤ %s ms and TPOT ≤ %s ms", num(s.TTFTms), num(s.TPOTms))
}

// Met reports whether o meets the SLO; scale converts o's wall-clock
// times into model time.
func (s SLO) Met(o Outcome, scale float64) bool {
	if !o.OK() {
		return false
	}
	model := func(d time.Duration) float64 { return float64(d) * scale / float64(time.Millisecond) }
	tokens := o.Tokens()
	if !o.Stream {
		return model(o.Done.Sub(o.Sent)) <= s.TTFTms+s.TPOTms*float64(max(tokens-1, 0))
	}
	if o.First.IsZero() || model(o.First.Sub(o.Sent)) > s.TTFTms {
		return false
	}
	return tokens <= 1 || model(o.Last.Sub(o.First))/float64(tokens-1) <= s.TPOTms
}

// ClassStats is one priority class's share of a case.
type ClassStats struct {
	Class string `json:"class"`
	// Requests were sent in the measured window: Completed, Refused (429),
	// Errors and Unfinished as in Summary.
	Requests   int `json:"requests"`
	Completed  int `json:"completed"`
	Refused    int `json:"refused"`
	Errors     int `json:"errors"`
	Unfinished int `json:"unfinished"`
	// TTFTms and TPOTms are as Summary's, over the class's streamed
	// requests (refused ones have no first token and are not among them).
	TTFTms Dist `json:"ttft_ms"`
	TPOTms Dist `json:"tpot_ms"`
	// RefusedMs is how long the refused requests waited for their 429
	// (model ms).
	RefusedMs Dist `json:"refused_ms"`
	// Good counts the requests that met the SLO; Goodput is Good per model
	// second of the measured window.
	Good    int     `json:"good"`
	Goodput float64 `json:"goodput"`
	// Tenants break the class down by tenant, by name.
	Tenants []TenantStats `json:"tenants,omitempty"`
}

// TenantStats is one tenant's requests within a class.
type TenantStats struct {
	Tenant    string `json:"tenant"`
	Requests  int    `json:"requests"`
	Completed int    `json:"completed"`
	Refused   int    `json:"refused"`
	Good      int    `json:"good"`
}

// compareClasses orders class names for reports: the classes the
// benchmark's workloads name, highest priority first, then others by
// name.
func compareClasses(a, b string) int {
	order := []string{ClassInteractive, ClassBatch}
	ia, ib := slices.Index(order, a), slices.Index(order, b)
	switch {
	case ia >= 0 && ib >= 0:
		return cmp.Compare(ia, ib)
	case ia >= 0:
		return -1
	case ib >= 0:
		return 1
	}
	return strings.Compare(a, b)
}

// SummarizeClasses fills s.Classes and s.SLO from the results of one run
// (the arguments as Summarize's) when a request of the window names a
// class; it leaves them nil otherwise.
func (s *Summary) SummarizeClasses(results []Result, w Window, cutoff time.Time, scale float64, slo SLO) {
	type acc struct {
		stats                ClassStats
		ttft, tpot, refusals []float64
		tenants              map[string]*TenantStats
	}
	model := func(d time.Duration) float64 { return float64(d) * scale / float64(time.Millisecond) }
	byClass := map[string]*acc{}
	for _, r := range results {
		if r.Class == "" || r.Offset < w.From || r.Offset > w.To {
			continue
		}
		a := byClass[r.Class]
		if a == nil {
			a = &acc{stats: ClassStats{Class: r.Class}, tenants: map[string]*TenantStats{}}
			byClass[r.Class] = a
		}
		t := a.tenants[r.Tenant]
		if t == nil {
			t = &TenantStats{Tenant: r.Tenant}
			a.tenants[r.Tenant] = t
		}
		o := r.Outcome
		a.stats.Requests++
		t.Requests++
		switch {
		case o.Refused:
			a.stats.Refused++
			t.Refused++
			if !o.Done.IsZero() {
				a.refusals = append(a.refusals, model(o.Done.Sub(o.Sent)))
			}
			continue
		case o.Err != "":
			a.stats.Errors++
			continue
		case o.OK():
			a.stats.Completed++
			t.Completed++
		default:
			a.stats.Unfinished++
		}
		if slo.Met(o, scale) {
			a.stats.Good++
			t.Good++
		}
		if o.Stream {
			a.ttft, a.tpot = appendStreamTimes(a.ttft, a.tpot, o, cutoff, model)
		}
	}
	if len(byClass) == 0 {
		return
	}
	span := (w.To - w.From).Seconds()
	s.SLO = &slo
	s.Classes = nil
	for _, a := range byClass {
		c := a.stats
		c.TTFTms, c.TPOTms, c.RefusedMs = Summarize(a.ttft), Summarize(a.tpot), Summarize(a.refusals)
		if span > 0 {
			c.Goodput = float64(c.Good) / span
		}
		for _, t := range a.tenants {
			c.Tenants = append(c.Tenants, *t)
		}
		slices.SortFunc(c.Tenants, func(x, y TenantStats) int { return strings.Compare(x.Tenant, y.Tenant) })
		s.Classes = append(s.Classes, c)
	}
	slices.SortFunc(s.Classes, func(x, y ClassStats) int { return compareClasses(x.Class, y.Class) })
}

// appendStreamTimes appends a streamed request's TTFT (its wait until the
// cutoff when no token came) and, when it completed with two tokens or
// more, its TPOT, in model ms, as Summarize counts them.
func appendStreamTimes(ttft, tpot []float64, o Outcome, cutoff time.Time, model func(time.Duration) float64) ([]float64, []float64) {
	switch {
	case !o.First.IsZero():
		ttft = append(ttft, model(o.First.Sub(o.Sent)))
	case !o.Sent.IsZero():
		ttft = append(ttft, model(cutoff.Sub(o.Sent)))
	}
	if o.OK() && o.Tokens() > 1 && o.Last.After(o.First) {
		tpot = append(tpot, model(o.Last.Sub(o.First))/float64(o.Tokens()-1))
	}
	return ttft, tpot
}

// line is a progress line's account of the class.
func (c ClassStats) line() string {
	return fmt.Sprintf("%-11s %4d req  served %4d  refused %4d  err %d unf %d  ttft p50 %6.0f p99 %6.0f ms  good %4d (%.2f/s)",
		c.Class, c.Requests, c.Completed, c.Refused, c.Errors, c.Unfinished, c.TTFTms.P50, c.TTFTms.P99, c.Good, c.Goodput)
}
