package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// hasClasses reports whether a case of workload w has priority classes.
func (r Report) hasClasses(w string) bool {
	return slices.ContainsFunc(r.Summaries, func(s Summary) bool { return s.Workload == w && len(s.Classes) > 0 })
}

// writeClasses writes w's per-class and per-tenant tables, and each
// policy's runs pooled, when its cases have priority classes.
func (r Report) writeClasses(b *strings.Builder, w string) {
	if !r.hasClasses(w) {
		return
	}
	slo := DefaultSLO()
	for _, s := range r.Summaries {
		if s.Workload == w && s.SLO != nil {
			slo = *s.SLO
			break
		}
	}
	fmt.Fprintf(b, "**Per priority class.** Served: completed; refused: answered 429 by duet's admission (not errors: "+
		"they count as missing the SLO); unfinished: still running at the cutoff. TTFT over the class's streamed requests "+
		"that were not refused or failed (unfinished ones with their wait so far; TTFT n of them). Goodput: requests per "+
		"model second served within the SLO, %s (a request sent without streaming: its whole response within "+
		"%s ms + %s ms per token after the first), and its share of the class's requests. 429 after: how long a refused "+
		"request waited for its answer (p50, model ms).\n\n", slo, num(slo.TTFTms), num(slo.TPOTms))
	b.WriteString("| load (req/s) | policy | class | requests | served | refused (429) | errors | unfinished | TTFT p50 | TTFT p99 | TTFT n | goodput (req/s) | good | 429 after |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	r.eachClass(w, func(s Summary, c ClassStats) {
		fmt.Fprintf(b, "| %s | %s | %s | %d | %d | %d | %d | %d | %s | %s | %d | %s | %s | %s |\n", num(s.RequestRate), PolicyLabel(s.Policy),
			c.Class, c.Requests, c.Completed, c.Refused, c.Errors, c.Unfinished, ms(c.TTFTms.P50), ms(c.TTFTms.P99), c.TTFTms.N,
			num(c.Goodput), fraction(c.Good, c.Requests), refusedAfter(c))
	})
	b.WriteString("\n**Per tenant, within each class.** Offered: the tenant's share of the class's requests; served: its share " +
		"of the class's served requests (the same as offered when nothing is refused or lost).\n\n")
	b.WriteString("| load (req/s) | policy | class | tenant | requests | offered | served | served share | refused (429) | good |\n")
	b.WriteString("|---|---|---|---|---:|---:|---:|---:|---:|---:|\n")
	r.eachClass(w, func(s Summary, c ClassStats) {
		for _, t := range c.Tenants {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %d | %s | %d | %s | %d | %s |\n", num(s.RequestRate), PolicyLabel(s.Policy), c.Class,
				t.Tenant, t.Requests, fraction(t.Requests, c.Requests), t.Completed, fraction(t.Completed, c.Completed), t.Refused,
				fraction(t.Good, t.Requests))
		}
	})
	b.WriteString("\n")
	r.writeAdmissionCounters(b, w)
	r.writePooledClasses(b, w)
}

// writeAdmissionCounters writes what duet's admission counted in w's
// cases (DuetStats.Admission), when any did.
func (r Report) writeAdmissionCounters(b *strings.Builder, w string) {
	if !slices.ContainsFunc(r.Summaries, func(s Summary) bool { return s.Workload == w && s.Duet != nil && len(s.Duet.Admission) > 0 }) {
		return
	}
	b.WriteString("**duet's admission counters** (`duet_admission_requests_total`, the whole case, warm-up included): " +
		"by class and outcome (admitted at once, queued_admitted after waiting, wait_limit and queue_full refused, shed for a " +
		"higher class, left by their client), and by class and tenant; none with the queue off.\n\n")
	b.WriteString("| load (req/s) | policy | class/outcome | class/tenant |\n|---|---|---|---|\n")
	for _, rate := range r.rates(w) {
		for _, p := range r.policies() {
			s, ok := r.find(w, rate, p)
			if !ok || s.Duet == nil {
				continue
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", num(s.RequestRate), PolicyLabel(p), orDash(formatCounts(s.Duet.Admission)),
				orDash(formatCounts(s.Duet.AdmissionTenants)))
		}
	}
	b.WriteString("\n")
}

// eachClass calls f for every class of every case of w that ran, by load
// then policy.
func (r Report) eachClass(w string, f func(Summary, ClassStats)) {
	for _, rate := range r.rates(w) {
		for _, p := range r.policies() {
			s, ok := r.find(w, rate, p)
			if !ok || s.Failed != "" {
				continue
			}
			for _, c := range s.Classes {
				f(s, c)
			}
		}
	}
}

// writePooledClasses writes, when a policy ran more than once (-repeat:
// POLICY#k), each class's figures over its runs: the mean and, in
// brackets, the lowest and highest run.
func (r Report) writePooledClasses(b *strings.Builder, w string) {
	pooled := r.pooledPolicies()
	if !slices.ContainsFunc(pooled, func(p pooledPolicy) bool { return len(p.runs) > 1 }) {
		return
	}
	b.WriteString("**Runs pooled.** Each policy's runs on the same arrivals (POLICY, POLICY#2, ...): the mean over runs, " +
		"and in brackets the lowest and the highest run.\n\n")
	b.WriteString("| load (req/s) | policy | runs | class | TTFT p50 | TTFT p99 | goodput (req/s) | good | refused (429) |\n")
	b.WriteString("|---|---|---:|---|---:|---:|---:|---:|---:|\n")
	for _, rate := range r.rates(w) {
		for _, p := range pooled {
			var cases []Summary
			for _, name := range p.runs {
				if s, ok := r.find(w, rate, name); ok && s.Failed == "" {
					cases = append(cases, s)
				}
			}
			if len(cases) == 0 {
				continue
			}
			for _, class := range classesOf(cases) {
				cs := classAcross(cases, class)
				fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", num(cases[0].RequestRate), PolicyLabel(p.name), len(cs), class,
					spread(cs, func(c ClassStats) float64 { return c.TTFTms.P50 }, ms),
					spread(cs, func(c ClassStats) float64 { return c.TTFTms.P99 }, ms),
					spread(cs, func(c ClassStats) float64 { return c.Goodput }, num),
					spread(cs, func(c ClassStats) float64 { return ratioOf(c.Good, c.Requests) }, percent),
					spread(cs, func(c ClassStats) float64 { return float64(c.Refused) }, ms))
			}
		}
	}
	b.WriteString("\n")
}

// pooledPolicy is a policy and the names of its runs.
type pooledPolicy struct {
	name string
	runs []string
}

// pooledPolicies groups the policies present by their name without the
// run suffix #k, in first-seen order.
func (r Report) pooledPolicies() []pooledPolicy {
	var out []pooledPolicy
	for _, p := range r.policies() {
		base := RunBase(p)
		i := slices.IndexFunc(out, func(q pooledPolicy) bool { return q.name == base })
		if i < 0 {
			out = append(out, pooledPolicy{name: base})
			i = len(out) - 1
		}
		out[i].runs = append(out[i].runs, p)
	}
	return out
}

// RunBase is a policy's name without the suffix #k that numbers its run
// k > 1 (-repeat).
func RunBase(policy string) string {
	i := strings.LastIndexByte(policy, '#')
	if i <= 0 {
		return policy
	}
	if _, err := strconv.Atoi(policy[i+1:]); err != nil {
		return policy
	}
	return policy[:i]
}

// classesOf lists the classes of cases, in report order.
func classesOf(cases []Summary) []string {
	var out []string
	for _, s := range cases {
		for _, c := range s.Classes {
			if !slices.Contains(out, c.Class) {
				out = append(out, c.Class)
			}
		}
	}
	slices.SortFunc(out, compareClasses)
	return out
}

// classAcross returns class's figures in each case that has it.
func classAcross(cases []Summary, class string) []ClassStats {
	var out []ClassStats
	for _, s := range cases {
		for _, c := range s.Classes {
			if c.Class == class {
				out = append(out, c)
			}
		}
	}
	return out
}

// spread formats the mean of f over cs and, with more than one, the
// lowest and highest: "120 [110, 130]".
func spread(cs []ClassStats, f func(ClassStats) float64, format func(float64) string) string {
	if len(cs) == 0 {
		return "n/a"
	}
	lo, hi, sum := f(cs[0]), f(cs[0]), 0.0
	for _, c := range cs {
		v := f(c)
		lo, hi, sum = min(lo, v), max(hi, v), sum+v
	}
	out := format(sum / float64(len(cs)))
	if len(cs) > 1 {
		out += fmt.Sprintf(" [%s, %s]", format(lo), format(hi))
	}
	return out
}

// ratioOf is n/d, 0 when d is 0.
func ratioOf(n, d int) float64 {
	if d == 0 {
		return 0
	}
	return float64(n) / float64(d)
}

// percent formats a 0-1 share as a whole percentage.
func percent(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }

// fraction formats n/d as a percentage, n/a when d is 0.
func fraction(n, d int) string {
	if d == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(d))
}

// refusedAfter formats how long the class's refused requests waited for
// their 429 (p50, model ms), "-" when none was refused.
func refusedAfter(c ClassStats) string {
	if c.RefusedMs.N == 0 {
		return "-"
	}
	return ms(c.RefusedMs.P50)
}
