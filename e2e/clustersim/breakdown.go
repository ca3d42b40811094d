package clustersim

import (
	"math"
	"slices"
	"time"
)

// SLO is what one request must see to count toward goodput: served, its
// first token within TTFT (plus Allowance of its prompt's length, if set:
// for workloads whose prompts run to tens of thousands of tokens, whose
// prefill alone takes longer than any flat bound), and its mean time per
// output token within TPOT (a request of one output token has none). A
// refused, failed or unfinished request never meets it.
type SLO struct {
	TTFT, TPOT time.Duration
	Allowance  func(promptTokens int) time.Duration
}

// Met reports whether q met the SLO.
func (o SLO) Met(q Request) bool {
	return o.FirstTokenMet(q) && (q.OutputTokens <= 1 || q.TPOT <= o.TPOT)
}

// FirstTokenMet reports whether q was served with its first token within
// the SLO's bound.
func (o SLO) FirstTokenMet(q Request) bool {
	bound := o.TTFT
	if o.Allowance != nil {
		bound += o.Allowance(q.PromptTokens)
	}
	return q.Err == "" && q.TTFT <= bound
}

// Group is what one set of measured requests (a class, a tenant, all) saw.
type Group struct {
	// Name is the class or tenant ("" for all, or requests without one).
	Name string
	// Requests counts the measured requests; Served those served; Refused
	// those admission refused; FirstTokenMet those served with their first
	// token in time (SLO.FirstTokenMet); Good those that met the SLO.
	Requests, Served, Refused, FirstTokenMet, Good int
	// TTFTP50 and TTFTP99 are in model milliseconds over every request, a
	// request not served counting as infinitely late (so that refusing
	// cannot improve them); ServedTTFTP99 is over the served alone.
	TTFTP50, TTFTP99, ServedTTFTP99 float64
	// Goodput is Good per second of the measured window, and GoodTokens
	// the prompt and output tokens of those requests per second.
	Goodput, GoodTokens float64
}

// Breakdown is a run's measured requests by class and by tenant, against
// an SLO, with what admission did.
type Breakdown struct {
	// All is every measured request.
	All Group
	// Classes and Tenants are by class and by tenant, sorted by name;
	// empty when no request names one.
	Classes, Tenants []Group
	// Refused counts the refused requests by reason (admit.Outcome).
	Refused map[string]int
	// Queued counts the requests that waited in the queue; WaitP50 and
	// WaitP99 (model milliseconds) are over them, whatever their outcome.
	Queued           int
	WaitP50, WaitP99 float64
}

// Breakdown groups the measured requests by class and by tenant and
// measures each group against slo.
func (res *Result) Breakdown(slo SLO) Breakdown {
	var measured []Request
	byClass, byTenant := map[string][]Request{}, map[string][]Request{}
	b := Breakdown{Refused: map[string]int{}}
	var waits []float64
	for _, q := range res.Requests {
		if !res.measured(q.Arrival) {
			continue
		}
		measured = append(measured, q)
		if q.Class != "" {
			byClass[q.Class] = append(byClass[q.Class], q)
		}
		if q.Tenant != "" {
			byTenant[q.Tenant] = append(byTenant[q.Tenant], q)
		}
		if q.Refused != "" {
			b.Refused[q.Refused]++
		}
		if q.Queued {
			b.Queued++
			waits = append(waits, ms(q.Wait))
		}
	}
	seconds := (res.Window - res.Warmup).Seconds()
	b.All = group("", measured, slo, seconds)
	b.Classes = groups(byClass, slo, seconds)
	b.Tenants = groups(byTenant, slo, seconds)
	slices.Sort(waits)
	b.WaitP50, b.WaitP99 = percentile(waits, 50), percentile(waits, 99)
	return b
}

// groups measures each named set of requests, sorted by name.
func groups(by map[string][]Request, slo SLO, seconds float64) []Group {
	var out []Group
	for name, qs := range by {
		out = append(out, group(name, qs, slo, seconds))
	}
	slices.SortFunc(out, func(a, b Group) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// group measures one set of requests against slo over a window of
// seconds.
func group(name string, qs []Request, slo SLO, seconds float64) Group {
	g := Group{Name: name, Requests: len(qs)}
	var ttft, served []float64
	var good float64
	for _, q := range qs {
		if q.Refused != "" {
			g.Refused++
		}
		if q.Err != "" {
			ttft = append(ttft, math.Inf(1))
			continue
		}
		g.Served++
		ttft = append(ttft, ms(q.TTFT))
		served = append(served, ms(q.TTFT))
		if slo.FirstTokenMet(q) {
			g.FirstTokenMet++
		}
		if slo.Met(q) {
			g.Good++
			good += float64(q.PromptTokens + q.OutputTokens)
		}
	}
	slices.Sort(ttft)
	slices.Sort(served)
	g.TTFTP50, g.TTFTP99 = percentile(ttft, 50), percentile(ttft, 99)
	g.ServedTTFTP99 = percentile(served, 99)
	if seconds > 0 {
		g.Goodput = float64(g.Good) / seconds
		g.GoodTokens = good / seconds
	}
	return g
}
