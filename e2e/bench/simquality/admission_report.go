package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/duet-router/duet/e2e/clustersim"
)

// admReport is the admission comparison's outcome (admission.json).
type admReport struct {
	Options optionsReport `json:"options"`
	// Queue and Defaults describe the queue and the default saturation
	// thresholds; Sweep marks a run with the threshold sweep.
	Queue    string `json:"queue"`
	Defaults string `json:"default_thresholds"`
	Sweep    bool   `json:"sweep"`
	// Extra are the variants added to every scenario (-admission-variants).
	Extra     []string            `json:"extra_variants,omitempty"`
	Mixes     []mixReport         `json:"mixes"`
	Scenarios []admScenarioReport `json:"scenarios"`
	Aims      []aimResult         `json:"aims"`
}

// admScenarioReport is one scenario's outcome.
type admScenarioReport struct {
	Name     string          `json:"name"`
	Title    string          `json:"title"`
	Mix      string          `json:"mix,omitempty"`
	Load     string          `json:"load"`
	Cluster  string          `json:"cluster"`
	Profile  string          `json:"profile"`
	Variants []variantReport `json:"variants"`
}

// variantReport is one variant's outcome: its per-seed results and their
// estimates (means over seeds with 95 % intervals; ratios paired by seed
// with admission off on the same replicas).
type variantReport struct {
	Name  string       `json:"name"`
	Seeds []caseResult `json:"-"`
	// Records are the seeds' results, condensed for the JSON.
	Records []seedRecord `json:"seeds"`

	All     groupEstimate   `json:"-"`
	Classes []groupEstimate `json:"-"`
	Tenants []groupEstimate `json:"-"`
	// TTFTMean and its ratio are over served requests (Summary's).
	TTFTMean, TTFTMeanRatio estimate `json:"-"`
	// Refused are the mean refusals per run by reason; Queued the share of
	// requests that waited; WaitP50 and WaitP99 their wait (ms).
	Refused          map[string]estimate `json:"-"`
	Queued           estimate            `json:"-"`
	WaitP50, WaitP99 estimate            `json:"-"`
}

// seedRecord is one seed's result as admission.json keeps it; a p99 that
// is infinite (more than 1 % not served) is -1.
type seedRecord struct {
	Requests  int            `json:"requests"`
	Served    int            `json:"served"`
	RefusedBy map[string]int `json:"refused,omitempty"`
	Queued    int            `json:"queued"`
	Goodput   float64        `json:"goodput"`
	TTFTMean  float64        `json:"ttft_mean_ms"`
	TTFTP50   float64        `json:"ttft_p50_ms"`
	TTFTP99   float64        `json:"ttft_p99_ms"`
	TPOTMean  float64        `json:"tpot_mean_ms"`
	WaitP50   float64        `json:"wait_p50_ms"`
	WaitP99   float64        `json:"wait_p99_ms"`
	Groups    []groupRecord  `json:"groups,omitempty"`
}

// groupRecord is one class's or tenant's part of a seedRecord.
type groupRecord struct {
	Kind     string  `json:"kind"`
	Name     string  `json:"name"`
	Requests int     `json:"requests"`
	Refused  int     `json:"refused"`
	Goodput  float64 `json:"goodput"`
	TTFTP99  float64 `json:"ttft_p99_ms"`
}

// record condenses a case for the JSON.
func record(c caseResult) seedRecord {
	b := c.Breakdown
	rec := seedRecord{Requests: b.All.Requests, Served: b.All.Served, Queued: b.Queued, Goodput: round(b.All.Goodput, 4),
		TTFTMean: round(c.Summary.TTFTMean, 1), TTFTP50: round(finiteOr(b.All.TTFTP50), 1), TTFTP99: round(finiteOr(b.All.TTFTP99), 1),
		TPOTMean: round(c.Summary.TPOTMean, 2), WaitP50: round(b.WaitP50, 1), WaitP99: round(b.WaitP99, 1)}
	if len(b.Refused) > 0 {
		rec.RefusedBy = b.Refused
	}
	for _, k := range []struct {
		kind string
		gs   []clustersim.Group
	}{{"class", b.Classes}, {"tenant", b.Tenants}} {
		for _, g := range k.gs {
			if k.kind == "tenant" && slices.ContainsFunc(b.Classes, func(c clustersim.Group) bool { return c.Name == g.Name }) {
				continue // the classes mix names each class's one tenant after it
			}
			rec.Groups = append(rec.Groups, groupRecord{Kind: k.kind, Name: g.Name, Requests: g.Requests, Refused: g.Refused,
				Goodput: round(g.Goodput, 4), TTFTP99: round(finiteOr(g.TTFTP99), 1)})
		}
	}
	return rec
}

// round rounds x to digits decimals (the JSON keeps what the report
// shows, and stays small).
func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// finiteOr is x, or -1 where x is not finite (JSON has no infinity).
func finiteOr(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return -1
	}
	return x
}

// groupEstimate is a class's, a tenant's or every request's estimates.
type groupEstimate struct {
	Name string `json:"name,omitempty"`
	// Goodput is requests per second that met the SLO; GoodputRatio it
	// paired with admission off, GoodputOfAlone with the unloaded
	// baseline (the group without the others); Share the group's part of
	// all goodput.
	Goodput, GoodputRatio, GoodputOfAlone, Share estimate
	// TTFTP50 and TTFTP99 (ms) count a request not served as infinitely
	// late; ServedP99 is over the served alone; P99Ratio and P99OfAlone
	// pair TTFTP99 with admission off and with the unloaded baseline.
	TTFTP50, TTFTP99, ServedP99, P99Ratio, P99OfAlone estimate
	// Refused is the share of the group's requests refused; ServedShare
	// the group's part of all requests served (met the SLO or not: what
	// the engines spent on it).
	Refused, ServedShare estimate
}

// aimResult is one aim of issue 27 checked on one scenario and variant.
type aimResult struct {
	Aim      string   `json:"aim"`
	Scenario string   `json:"scenario"`
	Variant  string   `json:"variant"`
	Measure  string   `json:"measure"`
	Value    estimate `json:"value"`
	Target   string   `json:"target"`
	Verdict  string   `json:"verdict"`
	// Note adds what the value alone does not say.
	Note string `json:"note,omitempty"`
}

// Verdicts of an aim.
const (
	aimMet          = "met"
	aimNotMet       = "not met"
	aimInconclusive = "inconclusive"
)

// sweepOnly reports whether a variant is the threshold sweep's alone: its
// scenarios' tables and the aims leave it to the sweep's table.
func (rep *admReport) sweepOnly(name string) bool {
	return slices.Contains(sweepVariants, name) && !slices.Contains(rep.Extra, name)
}

// analyze computes every estimate and checks the aims.
func (rep *admReport) analyze() {
	for i := range rep.Scenarios {
		rep.Scenarios[i].analyze()
	}
	rep.Aims = rep.checkAims()
}

// variant returns the scenario's variant called name, or nil.
func (sr *admScenarioReport) variant(name string) *variantReport {
	for i := range sr.Variants {
		if sr.Variants[i].Name == name {
			return &sr.Variants[i]
		}
	}
	return nil
}

// replicaSuffixOf is the "+rN" ending of a variant name, or "".
func replicaSuffixOf(name string) string {
	if i := strings.LastIndex(name, replicaMark); i >= 0 {
		return name[i:]
	}
	return ""
}

// aloneOf is the unloaded baseline of a variant: the scenario's alone
// variant with the same replicas, or nil.
func (sr *admScenarioReport) aloneOf(name string) *variantReport {
	suffix := replicaSuffixOf(name)
	for i := range sr.Variants {
		v := &sr.Variants[i]
		if strings.HasPrefix(v.Name, alonePrefix) && replicaSuffixOf(v.Name) == suffix {
			return v
		}
	}
	return nil
}

// analyze computes the estimates of every variant.
func (sr *admScenarioReport) analyze() {
	for i := range sr.Variants {
		v := &sr.Variants[i]
		base := sr.variant(variantOff + replicaSuffixOf(v.Name))
		alone := sr.aloneOf(v.Name)
		v.analyze(base, alone)
	}
}

// analyze computes v's estimates against base (admission off) and alone
// (the unloaded baseline); either may be nil.
func (v *variantReport) analyze(base, alone *variantReport) {
	all := func(c caseResult) clustersim.Group { return c.Breakdown.All }
	v.All = groupEstimates(v, base, alone, all, all)
	served := func(c caseResult) float64 { return c.Summary.TTFTMean }
	v.TTFTMean = meanOf(caseValues(v.Seeds, served))
	if base != nil {
		v.TTFTMeanRatio = ratioOf(caseValues(v.Seeds, served), caseValues(base.Seeds, served))
	}
	v.Classes = v.groups(base, alone, func(b clustersim.Breakdown) []clustersim.Group { return b.Classes })
	v.Tenants = v.groups(base, alone, func(b clustersim.Breakdown) []clustersim.Group { return b.Tenants })
	reasons := map[string]bool{}
	for _, c := range v.Seeds {
		for r := range c.Breakdown.Refused {
			reasons[r] = true
		}
	}
	if len(reasons) > 0 {
		v.Refused = map[string]estimate{}
		for _, r := range slices.Sorted(maps.Keys(reasons)) {
			v.Refused[r] = meanOf(caseValues(v.Seeds, func(c caseResult) float64 { return float64(c.Breakdown.Refused[r]) }))
		}
	}
	v.Queued = meanOf(caseValues(v.Seeds, func(c caseResult) float64 {
		return float64(c.Breakdown.Queued) / math.Max(float64(c.Breakdown.All.Requests), 1)
	}))
	v.WaitP50 = meanOf(caseValues(v.Seeds, func(c caseResult) float64 { return c.Breakdown.WaitP50 }))
	v.WaitP99 = meanOf(caseValues(v.Seeds, func(c caseResult) float64 { return c.Breakdown.WaitP99 }))
}

// groups estimates each class (or tenant) that pick lists.
func (v *variantReport) groups(base, alone *variantReport, pick func(clustersim.Breakdown) []clustersim.Group) []groupEstimate {
	names := map[string]bool{}
	for _, c := range v.Seeds {
		for _, g := range pick(c.Breakdown) {
			names[g.Name] = true
		}
	}
	var out []groupEstimate
	for _, name := range slices.Sorted(maps.Keys(names)) {
		get := func(c caseResult) clustersim.Group {
			for _, g := range pick(c.Breakdown) {
				if g.Name == name {
					return g
				}
			}
			return clustersim.Group{Name: name}
		}
		ge := groupEstimates(v, base, alone, get, func(c caseResult) clustersim.Group { return c.Breakdown.All })
		ge.Name = name
		out = append(out, ge)
	}
	return out
}

// groupEstimates estimates one group of v (get picks it from a case),
// with its share of all's goodput and its ratios to base and alone.
func groupEstimates(v, base, alone *variantReport, get, all func(caseResult) clustersim.Group) groupEstimate {
	f := func(vr *variantReport, m func(clustersim.Group) float64) []float64 {
		return caseValues(vr.Seeds, func(c caseResult) float64 { return m(get(c)) })
	}
	goodput := func(g clustersim.Group) float64 { return g.Goodput }
	p99 := func(g clustersim.Group) float64 { return g.TTFTP99 }
	ge := groupEstimate{
		Goodput:   meanOf(f(v, goodput)),
		TTFTP50:   meanOf(f(v, func(g clustersim.Group) float64 { return g.TTFTP50 })),
		TTFTP99:   meanOf(f(v, p99)),
		ServedP99: meanOf(f(v, func(g clustersim.Group) float64 { return g.ServedTTFTP99 })),
		Refused: meanOf(f(v, func(g clustersim.Group) float64 {
			return float64(g.Refused) / math.Max(float64(g.Requests), 1)
		})),
		Share: meanOf(caseValues(v.Seeds, func(c caseResult) float64 {
			return get(c).Goodput / math.Max(all(c).Goodput, 1e-12)
		})),
		ServedShare: meanOf(caseValues(v.Seeds, func(c caseResult) float64 {
			return float64(get(c).Served) / math.Max(float64(all(c).Served), 1)
		})),
	}
	if base != nil {
		ge.GoodputRatio = ratioOf(f(v, goodput), f(base, goodput))
		ge.P99Ratio = ratioOf(f(v, p99), f(base, p99))
	}
	if alone != nil {
		ge.GoodputOfAlone = ratioOf(f(v, goodput), f(alone, goodput))
		ge.P99OfAlone = ratioOf(f(v, p99), f(alone, p99))
	}
	return ge
}

// caseValues returns f of each case.
func caseValues(cs []caseResult, f func(caseResult) float64) []float64 {
	out := make([]float64, len(cs))
	for i, c := range cs {
		out[i] = f(c)
	}
	return out
}

// The aims of issue 27.
const (
	aimHighClass = "high class p99 TTFT within 1.5× of its unloaded p99"
	aimTenants   = "well-behaved tenants keep ≥ 90 % of their unloaded goodput"
	aimGoodput   = "goodput at SLO higher than without queueing"
	aimNoHarm    = "no non-overload scenario worse beyond its interval"
)

// overloadScenarios are the scenarios whose load exceeds the pool's
// goodput rate.
var overloadScenarios = []string{"burst_2x", "burst_3x", "overload_2x", "noisy_tenant", "trace_2x"}

// checkAims checks each aim on the scenarios it concerns, for every
// variant with admission on.
func (rep *admReport) checkAims() []aimResult {
	var out []aimResult
	for i := range rep.Scenarios {
		sr := &rep.Scenarios[i]
		for j := range sr.Variants {
			v := &sr.Variants[j]
			if !strings.HasPrefix(v.Name, variantOn) || rep.sweepOnly(v.Name) {
				continue
			}
			out = append(out, sr.aims(v)...)
			if a, ok := rep.highClassAtSteady(sr, v); ok {
				out = append(out, a)
			}
		}
	}
	return append(out, rep.noHarm()...)
}

// highClassAtSteady checks the high-class aim of a classes-mix overload
// scenario's variant v against the same mix at 0.8× the goodput rate
// (steady, admission off): the pool loaded but not overloaded, paired by
// seed index (the arrivals differ).
func (rep *admReport) highClassAtSteady(sr *admScenarioReport, v *variantReport) (aimResult, bool) {
	i := slices.IndexFunc(rep.Scenarios, func(s admScenarioReport) bool { return s.Name == "steady" })
	if i < 0 || sr.Mix != rep.Scenarios[i].Mix || !slices.Contains(overloadScenarios, sr.Name) {
		return aimResult{}, false
	}
	steady := rep.Scenarios[i].variant(variantOff)
	if steady == nil {
		return aimResult{}, false
	}
	p99 := func(c caseResult) float64 {
		for _, g := range c.Breakdown.Classes {
			if g.Name == classInteractive {
				return g.TTFTP99
			}
		}
		return math.Inf(1)
	}
	e := ratioOf(caseValues(v.Seeds, p99), caseValues(steady.Seeds, p99))
	return aimResult{Aim: aimHighClass, Scenario: sr.Name, Variant: v.Name, Measure: "interactive p99 TTFT ÷ interactive at 0.8× the goodput rate (steady, off)",
		Value: e, Target: "≤ 1.5×", Verdict: atMost(e, 1.5)}, true
}

// aims checks the aims that concern scenario sr on its variant v.
func (sr *admScenarioReport) aims(v *variantReport) []aimResult {
	var out []aimResult
	add := func(aim, measure, target string, e estimate, verdict string) {
		out = append(out, aimResult{Aim: aim, Scenario: sr.Name, Variant: v.Name, Measure: measure, Value: e, Target: target, Verdict: verdict})
	}
	overload := slices.Contains(overloadScenarios, sr.Name)
	if overload && sr.aloneOf(v.Name) != nil && sr.Name != "noisy_tenant" {
		for _, g := range v.Classes {
			if g.Name == classInteractive {
				add(aimHighClass, "interactive p99 TTFT ÷ interactive alone", "≤ 1.5×", g.P99OfAlone, atMost(g.P99OfAlone, 1.5))
			}
		}
	}
	if sr.Name == "noisy_tenant" {
		add(aimTenants, "four tenants' goodput ÷ theirs alone", "≥ 0.9×", sr.normalTenants(v), atLeast(sr.normalTenants(v), 0.9))
	}
	if base := sr.variant(variantOff + replicaSuffixOf(v.Name)); overload && base != nil {
		good := func(c caseResult) float64 { return c.Breakdown.All.Goodput }
		x, b := caseValues(v.Seeds, good), caseValues(base.Seeds, good)
		diff := make([]float64, len(x))
		for i := range x {
			diff[i] = x[i] - b[i]
		}
		d := meanOf(diff)
		add(aimGoodput, "goodput ÷ admission off", "> 1×", v.All.GoodputRatio, above(d, 0))
		out[len(out)-1].Note = fmt.Sprintf("%s against %s requests/s, difference %s", v.All.Goodput.format(2), base.All.Goodput.format(2), d.format(2))
	}
	return out
}

// worse lists how v is worse than admission off beyond the intervals:
// mean TTFT, p99 TTFT, goodput; nil when it is not.
func (v *variantReport) worse() []string {
	var out []string
	for _, m := range []struct {
		name  string
		e     estimate
		lower bool
	}{{"TTFT mean", v.TTFTMeanRatio, true}, {"TTFT p99", v.All.P99Ratio, true}, {"goodput", v.All.GoodputRatio, false}} {
		if m.e.compare(1, m.lower) == "worse" {
			out = append(out, m.name+" "+m.e.formatRatio(2))
		}
	}
	return out
}

// noHarm checks, for each variant with admission on, that no scenario
// without overload is worse with it than without.
func (rep *admReport) noHarm() []aimResult {
	var names []string
	byVariant := map[string][]string{}
	counted := map[string]int{}
	for i := range rep.Scenarios {
		sr := &rep.Scenarios[i]
		if slices.Contains(overloadScenarios, sr.Name) {
			continue
		}
		for j := range sr.Variants {
			v := &sr.Variants[j]
			if !strings.HasPrefix(v.Name, variantOn) || rep.sweepOnly(v.Name) {
				continue
			}
			if counted[v.Name] == 0 {
				names = append(names, v.Name)
			}
			counted[v.Name]++
			if w := v.worse(); w != nil {
				byVariant[v.Name] = append(byVariant[v.Name], sr.Name+" ("+strings.Join(w, ", ")+")")
			}
		}
	}
	var out []aimResult
	for _, n := range names {
		a := aimResult{Aim: aimNoHarm, Scenario: fmt.Sprintf("%d scenarios without overload", counted[n]), Variant: n,
			Measure: "TTFT mean, TTFT p99, goodput ÷ admission off", Target: "none worse", Verdict: aimMet, Note: "none worse"}
		if w := byVariant[n]; w != nil {
			a.Verdict, a.Note = aimNotMet, "worse: "+strings.Join(w, "; ")
		}
		out = append(out, a)
	}
	return out
}

// normalTenants is the well-behaved tenants' goodput over theirs alone,
// paired by seed (their goodputs summed).
func (sr *admScenarioReport) normalTenants(v *variantReport) estimate {
	alone := sr.aloneOf(v.Name)
	if alone == nil {
		return estimate{}
	}
	sum := func(vr *variantReport) []float64 {
		return caseValues(vr.Seeds, func(c caseResult) float64 {
			s := 0.0
			for _, g := range c.Breakdown.Tenants {
				if g.Name != noisyTenant {
					s += g.Goodput
				}
			}
			return s
		})
	}
	return ratioOf(sum(v), sum(alone))
}

// atMost, atLeast and above read an estimate against a target: met when
// the whole interval is on the right side, not met when it is wholly on
// the other, else inconclusive.
func atMost(e estimate, x float64) string {
	switch {
	case e.N == 0:
		return "no data"
	case e.Hi <= x:
		return aimMet
	case e.Lo > x:
		return aimNotMet
	}
	return aimInconclusive
}

func atLeast(e estimate, x float64) string {
	switch {
	case e.N == 0:
		return "no data"
	case e.Lo >= x:
		return aimMet
	case e.Hi < x:
		return aimNotMet
	}
	return aimInconclusive
}

func above(e estimate, x float64) string {
	switch {
	case e.N == 0:
		return "no data"
	case e.Lo > x:
		return aimMet
	case e.Hi <= x:
		return aimNotMet
	}
	return aimInconclusive
}

// write saves the report's JSON and Markdown in dir.
func (rep *admReport) write(dir string) error {
	for i := range rep.Scenarios {
		for j := range rep.Scenarios[i].Variants {
			v := &rep.Scenarios[i].Variants[j]
			v.Records = make([]seedRecord, len(v.Seeds))
			for k, c := range v.Seeds {
				v.Records[k] = record(c)
			}
		}
	}
	data, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("admission report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, admissionDataFile), append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, admissionReportFile), []byte(rep.markdown()), 0o644)
}
