package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/e2e/bench/ci"
	"github.com/duet-router/duet/e2e/clustersim"
	"github.com/duet-router/duet/e2e/sim"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// Admission output files (-admission).
const (
	admissionReportFile = "admission.md"
	admissionDataFile   = "admission.json"
)

// The admission comparison's queue, as duet configures it by default
// (cmd/duet/internal/config: a 10 s wait limit per class, 128 requests and
// 4 Mi tokens per pool), with the interactive class above the batch one
// and batch the class of requests that name none.
const (
	admissionWaitLimit = 10 * time.Second
	admissionMaxQueued = 128
	admissionMaxTokens = 4 << 20
)

// admissionSettings are what a variant sets beyond the defaults.
type admissionSettings struct {
	// sat are the saturation thresholds (zero fields: the defaults).
	sat scheduler.SaturationConfig
	// wait is every class's wait limit (0: admissionWaitLimit).
	wait time.Duration
	// batchShare is the batch class's saturation share (0: 1).
	batchShare float64
	// enginePriority runs the engines with SGLang's priority scheduling.
	enginePriority bool
}

// admissionConfig is the queue of an admission variant.
func admissionConfig(s admissionSettings) *clustersim.Admission {
	wait := cmp.Or(s.wait, admissionWaitLimit)
	return &clustersim.Admission{
		Queue: admit.Config{
			Classes: []admit.Class{
				{Name: classInteractive, Priority: 1, WaitLimit: wait},
				{Name: classBatch, Priority: 0, WaitLimit: wait, Share: s.batchShare},
			},
			MaxRequests: admissionMaxQueued, MaxTokens: admissionMaxTokens,
		},
		DefaultClass:   classBatch,
		Saturation:     s.sat,
		EnginePriority: s.enginePriority,
	}
}

// variant is one way of running a scenario: admission off or on (with
// thresholds), with one replica or several, on the whole workload or on
// the part left once a class or tenant is dropped (the unloaded
// baseline).
type variant struct {
	name string
	// adm is the admission (nil: off).
	adm *clustersim.Admission
	// replicas run the scenario, sharing their state (Config.Share) as
	// duet replicas do over NATS; 0 is one.
	replicas int
	// drop names the class or tenant left out (the others alone).
	drop string
}

// Variant names: "off"; "on" with the default thresholds, or with
// settings after slashes (on/p=8192/kv=0.85/w=off/wait=2s); a suffix "+r3"
// runs three replicas; "alone-X" is admission off without class or tenant
// X.
const (
	variantOff   = "off"
	variantOn    = "on"
	alonePrefix  = "alone-"
	replicaMark  = "+r"
	thresholdOff = "off"
)

// parseVariant returns the variant called name.
func parseVariant(name string) (variant, error) {
	v := variant{name: name}
	base := name
	if i := strings.LastIndex(base, replicaMark); i >= 0 {
		n, err := strconv.Atoi(base[i+len(replicaMark):])
		if err != nil || n < 1 {
			return v, fmt.Errorf("variant %q: bad replica count", name)
		}
		v.replicas, base = n, base[:i]
	}
	if d, ok := strings.CutPrefix(base, alonePrefix); ok {
		v.drop = d
		return v, nil
	}
	parts := strings.Split(base, "/")
	switch parts[0] {
	case variantOff:
		if len(parts) > 1 {
			return v, fmt.Errorf("variant %q: off takes no settings", name)
		}
		return v, nil
	case variantOn:
	default:
		return v, fmt.Errorf("variant %q: want off, on[/k=v...] or %sX, with an optional %sN", name, alonePrefix, replicaMark)
	}
	var set admissionSettings
	for _, kv := range parts[1:] {
		if err := set.parse(kv); err != nil {
			return v, fmt.Errorf("variant %q: %s: %w", name, kv, err)
		}
	}
	v.adm = admissionConfig(set)
	if err := v.adm.Queue.Validate(); err != nil {
		return v, fmt.Errorf("variant %q: %w", name, err)
	}
	return v, nil
}

// parse applies one setting of a variant name: p=, kv=, w= (thresholds,
// or off), wait= (the classes' wait limit), share= (the batch class's
// saturation share), prio (engines schedule by priority).
func (s *admissionSettings) parse(kv string) error {
	k, val, _ := strings.Cut(kv, "=")
	var err error
	switch k {
	case "p":
		s.sat.PrefillTokens, err = thresholdInt(val)
	case "kv":
		s.sat.KVFraction, err = thresholdFloat(val)
	case "w":
		var n int64
		n, err = thresholdInt(val)
		s.sat.Waiting = int(n)
	case "wait":
		s.wait, err = time.ParseDuration(val)
	case "share":
		s.batchShare, err = strconv.ParseFloat(val, 64)
	case "prio":
		s.enginePriority = true
	default:
		err = errors.New("unknown setting")
	}
	return err
}

// thresholdInt parses a threshold: a number, or "off" (-1).
func thresholdInt(s string) (int64, error) {
	if s == thresholdOff {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// thresholdFloat parses a fractional threshold, or "off" (-1).
func thresholdFloat(s string) (float64, error) {
	if s == thresholdOff {
		return -1, nil
	}
	return strconv.ParseFloat(s, 64)
}

// admMix is a base workload of the admission comparison, the cluster that
// serves it, and the grid its pool's goodput rate is searched on.
type admMix struct {
	name, title string
	cluster     clustersim.Cluster
	profile     string
	build       func(rate float64, window time.Duration, seed uint64) (bench.Workload, error)
	grid        grid
	// unit names the rate ("requests/s", or the trace's speed-up).
	unit string
	// allowance, if set, adds each request's own prefill time on an idle
	// rank to the SLO's TTFT bound (clustersim.SLO.Allowance).
	allowance bool
	// attain is the share of requests whose first token must be in time
	// for a rate to meet the SLO (0: 0.99, the matrix's p99 bound).
	attain float64
}

// slo is the mix's per-request SLO.
func (m *admMix) slo(o options) clustersim.SLO {
	slo := o.admissionSLO()
	if m.allowance {
		prof, _ := sim.LookupProfile(m.profile)
		slo.Allowance = func(tokens int) time.Duration { return idlePrefill(prof, tokens) }
	}
	return slo
}

// idlePrefill is the time the engine model takes to prefill a prompt of
// tokens on an idle rank: one step per chunk, each c0 + c1·T + c2·T·(P +
// T/2) for T new tokens on top of P (sim.Profile).
func idlePrefill(p sim.Profile, tokens int) time.Duration {
	chunk := max(p.ChunkedPrefillSize, 1)
	var d time.Duration
	for done := 0; done < tokens; done += chunk {
		t := min(chunk, tokens-done)
		quad := p.PrefillQuadMS * float64(t) * (float64(done) + float64(t)/2)
		d += p.PrefillBase + time.Duration(t)*p.PrefillPerToken + time.Duration(quad*float64(time.Millisecond))
	}
	return d
}

// admScenario is one scenario of the admission comparison: a mix at a
// load shape relative to its pool's goodput rate, or one of the default
// matrix's scenarios at its own rate.
type admScenario struct {
	name, title string
	mix         *admMix
	shape       loadShape
	// fixed, with rate, is a default matrix scenario instead of a mix.
	fixed *scenario
	rate  float64
	// variants are run on every seed.
	variants []string
	// sweep marks the scenarios of the threshold sweep.
	sweep bool
}

// slo is the scenario's per-request SLO.
func (sc admScenario) slo(o options) clustersim.SLO {
	if sc.mix != nil {
		return sc.mix.slo(o)
	}
	return o.admissionSLO()
}

// admissionMixes are the admission comparison's mixes.
func admissionMixes(tracePath string) map[string]*admMix {
	std := clustersim.Uniform(dsv3, 2, 2, 4)
	big := clustersim.Uniform(dsv3, 4, 4, 8)
	return map[string]*admMix{
		"classes": {name: "classes", title: "20 % interactive (300-1,500 tokens in, 50-300 out), 80 % batch (2k-6k in, 100-800 out)",
			cluster: std, profile: dsv3, build: classesMix, grid: grid{2, 16, 0.5}, unit: "requests/s"},
		"tenants": {name: "tenants", title: "four tenants and a noisy one sending 10× the requests of each (1.5k-4k tokens in, 200-1,500 out)",
			cluster: std, profile: dsv3, build: tenantsMix, grid: grid{2, 16, 0.5}, unit: "requests/s"},
		"trace": {name: "trace", title: "the shared Mooncake trace, time-compressed, a seeded 20 % of its requests interactive",
			cluster: big, profile: dsv3, build: classedTrace(tracePath), grid: grid{0.25, 3, 0.125}, unit: "× the trace's speed",
			allowance: true, attain: 0.9},
	}
}

// Load shapes of the overload scenarios: bursts of 15 s every minute at 2×
// and 3× the pool's goodput rate, half of it between; and a constant 2×.
var (
	burst2x = loadShape{High: 2, Low: 0.5, Period: time.Minute, BurstLen: 15 * time.Second}
	burst3x = loadShape{High: 3, Low: 0.5, Period: time.Minute, BurstLen: 15 * time.Second}
)

// sweepVariants are the threshold sweep's variants: each threshold (and
// the classes' wait limit) moved alone from its default, then a few
// combinations.
var sweepVariants = []string{
	"on/p=2048", "on/p=4096", "on/p=16384", "on/p=32768", "on/p=65536",
	"on/kv=0.7", "on/kv=0.85", "on/kv=0.9", "on/kv=0.95",
	"on/w=2", "on/w=4", "on/w=8", "on/w=off",
	"on/wait=2s", "on/wait=5s",
	"on/share=0.5", "on/share=0.75", "on/prio", "on/prio/share=0.5",
	"on/p=32768/kv=0.9", "on/p=4096/wait=2s",
}

// admissionScenarios returns the admission comparison's scenarios: the
// overload scenarios (with their unloaded baselines), the replicas, then
// the default matrix's scenarios with admission off and on. extra adds
// variants to every scenario (a tuned setting).
func admissionScenarios(tracePath string, extra []string) []admScenario {
	mixes := admissionMixes(tracePath)
	with := func(vs ...string) []string {
		for _, v := range extra {
			if !slices.Contains(vs, v) {
				vs = append(vs, v)
			}
		}
		return vs
	}
	classesAlone := alonePrefix + classBatch
	tenantsAlone := alonePrefix + noisyTenant
	out := []admScenario{
		{name: "burst_2x", title: "Bursts to 2× the pool's goodput rate", mix: mixes["classes"], shape: burst2x,
			variants: with(variantOff, variantOn, classesAlone), sweep: true},
		{name: "burst_3x", title: "Bursts to 3× the pool's goodput rate", mix: mixes["classes"], shape: burst3x,
			variants: with(variantOff, variantOn, classesAlone)},
		{name: "overload_2x", title: "Constant 2× the pool's goodput rate", mix: mixes["classes"], shape: constant(2),
			variants: with(variantOff, variantOn, classesAlone)},
		{name: "steady", title: "The classes mix at 0.8× the pool's goodput rate (no overload)", mix: mixes["classes"], shape: constant(0.8),
			variants: with(variantOff, variantOn), sweep: true},
		{name: "noisy_tenant", title: "A noisy tenant, all tenants together at 2× the pool's goodput rate", mix: mixes["tenants"], shape: constant(2),
			variants: with(append([]string{variantOff, variantOn, tenantsAlone, variantOff + "+r3", variantOn + "+r3", tenantsAlone + "+r3"},
				withReplicaMark(extra, 3)...)...), sweep: true},
		{name: "trace_2x", title: "The trace time-compressed to 2× the pool's goodput speed", mix: mixes["trace"], shape: constant(2),
			variants: with(variantOff, variantOn, classesAlone)},
	}
	for _, sc := range scenarios(tracePath) {
		rate := sc.rate
		if r, ok := headlineRates[sc.name]; ok {
			rate = r
		}
		out = append(out, admScenario{name: "matrix_" + sc.name, title: sc.title, fixed: &sc, rate: rate, variants: with(variantOff, variantOn),
			sweep: sc.name == "variable"})
	}
	return out
}

// withReplicaMark returns variants run on n replicas.
func withReplicaMark(variants []string, n int) []string {
	out := make([]string, len(variants))
	for i, v := range variants {
		out[i] = v + replicaMark + strconv.Itoa(n)
	}
	return out
}

// headlineRates are the rates at which the quality report compares the
// headline scenarios (80 % of the engine default's median goodput in
// docs/benchmarks/quality.md), so that admission runs them without a
// goodput search.
var headlineRates = map[string]float64{"variable": 4.5, "multiturn": 6}

// caseResult is one simulated case.
type caseResult struct {
	Summary   clustersim.Summary   `json:"summary"`
	Breakdown clustersim.Breakdown `json:"breakdown"`
}

// admRunner runs the admission comparison's cases.
type admRunner struct {
	opts options
	sem  chan struct{}
	// matrix prepares the default matrix's workloads.
	matrix *runner
}

// newAdmRunner returns a runner of o.parallel simulations at once.
func newAdmRunner(o options) *admRunner {
	r := newRunner(o)
	return &admRunner{opts: r.opts, sem: make(chan struct{}, r.opts.parallel), matrix: r}
}

// prepare builds and parses a workload for profile.
func prepare(w bench.Workload, profile string) (*clustersim.Prepared, error) {
	prof, err := sim.LookupProfile(profile)
	if err != nil {
		return nil, err
	}
	return clustersim.Prepare(w, "sim-model", prof.BlockSize)
}

// simulate runs one case of a workload on cluster.
func (r *admRunner) simulate(ctx context.Context, cluster clustersim.Cluster, p *clustersim.Prepared, v variant, seed uint64, slo clustersim.SLO, sc *scenario) (caseResult, error) {
	cfg := clustersim.Config{Cluster: cluster, Policy: defaultPolicy, Workload: p, Warmup: r.opts.warmup, Seed: seed,
		Admission: v.adm, Replicas: v.replicas, Share: v.replicas > 1}
	if sc != nil {
		cfg.Preload, cfg.Restarts = sc.preload, sc.restarts
	}
	r.sem <- struct{}{}
	res, err := clustersim.Run(ctx, cfg)
	<-r.sem
	if err != nil {
		return caseResult{}, err
	}
	return caseResult{Summary: res.Summarize(), Breakdown: res.Breakdown(slo)}, nil
}

// meetsSLO reports whether a run meets the matrix's SLO, held per
// request: every measured request served, at least attain of them (0.99:
// with a flat bound, the p99 TTFT bound) with their first token in time,
// and the mean TPOT within its bound.
func (o options) meetsSLO(c caseResult, attain float64) bool {
	all := c.Breakdown.All
	return all.Requests > 0 && all.Served == all.Requests && float64(all.FirstTokenMet) >= attain*float64(all.Requests) &&
		c.Summary.TPOTMean <= float64(o.sloTPOTMean)/float64(time.Millisecond)
}

// goodputRate searches, for one seed, the highest rate of mix's grid at
// which duet's default without admission meets the SLO.
func (r *admRunner) goodputRate(ctx context.Context, mix *admMix, seed uint64) (float64, error) {
	slo := mix.slo(r.opts)
	return highestMeeting(mix.grid.points(), func(rate float64) (bool, error) {
		w, err := mix.build(rate, r.opts.window, seed)
		if err != nil {
			return false, err
		}
		p, err := prepare(w, mix.profile)
		if err != nil {
			return false, err
		}
		c, err := r.simulate(ctx, mix.cluster, p, variant{name: variantOff}, seed, slo, nil)
		if err != nil {
			return false, fmt.Errorf("%s at %g: %w", mix.name, rate, err)
		}
		return r.opts.meetsSLO(c, cmp.Or(mix.attain, 0.99)), nil
	})
}

// mixReport is a mix's pool goodput rate.
type mixReport struct {
	Name    string      `json:"name"`
	Title   string      `json:"title"`
	Cluster string      `json:"cluster"`
	Unit    string      `json:"unit"`
	Grid    string      `json:"grid"`
	PerSeed []float64   `json:"per_seed"`
	Rate    ci.Interval `json:"rate"`
}

// goodputRates searches every mix's goodput rate, per seed, and returns
// the medians.
func (r *admRunner) goodputRates(ctx context.Context, mixes []*admMix) (map[string]*mixReport, error) {
	seeds := r.opts.seedList()
	out := map[string]*mixReport{}
	var mu sync.Mutex
	for _, m := range mixes {
		out[m.name] = &mixReport{Name: m.name, Title: m.title, Cluster: m.cluster.String(), Unit: m.unit,
			Grid: fmt.Sprintf("%g to %g step %g", m.grid.lo, m.grid.hi, m.grid.step), PerSeed: make([]float64, len(seeds))}
	}
	err := forSeeds(ctx, r.opts.parallel, seeds, func(ctx context.Context, seed uint64) error {
		for _, m := range mixes {
			g, err := r.goodputRate(ctx, m, seed)
			if err != nil {
				return err
			}
			mu.Lock()
			out[m.name].PerSeed[seed-1] = g
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, m := range mixes {
		mr := out[m.name]
		iv, err := ci.Median(mr.PerSeed, r.opts.resamples, 1)
		if err != nil {
			return nil, fmt.Errorf("%s goodput rate: %w", m.name, err)
		}
		if iv.Median <= 0 {
			return nil, fmt.Errorf("%s: no rate of %s meets the SLO", m.name, mr.Grid)
		}
		mr.Rate = iv
		fmt.Fprintf(os.Stderr, "simquality: %s goodput rate %s %s\n", m.name, ci.FormatValue(iv, 3), m.unit)
	}
	return out, nil
}

// forSeeds runs f for every seed, parallel at a time, and cancels the rest
// at the first error.
func forSeeds(ctx context.Context, parallel int, seeds []uint64, f func(context.Context, uint64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	errs := make([]error, len(seeds))
	for i, seed := range seeds {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if errs[i] = f(ctx, seed); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// workload builds a scenario's workload for seed: a mix at its shape of
// the mix's goodput rate, or a matrix scenario at its rate.
func (r *admRunner) workload(sc admScenario, rates map[string]*mixReport, seed uint64) (*clustersim.Prepared, bench.Workload, error) {
	if sc.fixed != nil {
		p, err := r.matrix.prepared(*sc.fixed, sc.rate, seed)
		if err != nil {
			return nil, bench.Workload{}, err
		}
		return p, p.Workload, nil
	}
	w, err := shaped(sc.mix.build, rates[sc.mix.name].Rate.Median, sc.shape, r.opts.window, seed)
	if err != nil {
		return nil, w, err
	}
	p, err := prepare(w, sc.mix.profile)
	return p, w, err
}

// scenario runs every variant of sc on every seed; each seed's workload is
// built once for its variants.
func (r *admRunner) scenario(ctx context.Context, sc admScenario, rates map[string]*mixReport) (admScenarioReport, error) {
	rep := admScenarioReport{Name: sc.name, Title: sc.title}
	cluster, profile := clustersim.Cluster{}, ""
	var fixed *scenario
	if sc.fixed != nil {
		cluster, profile, fixed = sc.fixed.cluster, sc.fixed.profile, sc.fixed
		rep.Load = fmt.Sprintf("%g sessions/s (%.1f requests/s)", sc.rate, sc.rate*bench.MeanRequestsPerSession(sc.fixed.workload, bench.Params{}))
	} else {
		cluster, profile = sc.mix.cluster, sc.mix.profile
		mr := rates[sc.mix.name]
		rep.Mix = sc.mix.name
		rep.Load = fmt.Sprintf("%s of %.3g %s (%s)", sc.shape, mr.Rate.Median, sc.mix.unit, sc.mix.title)
	}
	rep.Cluster, rep.Profile = cluster.String(), profile
	vs := make([]variant, len(sc.variants))
	for i, name := range sc.variants {
		v, err := parseVariant(name)
		if err != nil {
			return rep, err
		}
		vs[i] = v
		rep.Variants = append(rep.Variants, variantReport{Name: name, Seeds: make([]caseResult, r.opts.seeds)})
	}
	slo := sc.slo(r.opts)
	var mu sync.Mutex
	err := forSeeds(ctx, r.opts.parallel, r.opts.seedList(), func(ctx context.Context, seed uint64) error {
		defer r.matrix.release(seed)
		p, w, err := r.workload(sc, rates, seed)
		if err != nil {
			return fmt.Errorf("%s seed %d: %w", sc.name, seed, err)
		}
		for i, v := range vs {
			pv := p
			if v.drop != "" {
				if pv, err = prepare(without(w, v.drop), profile); err != nil {
					return err
				}
			}
			c, err := r.simulate(ctx, cluster, pv, v, seed, slo, fixed)
			if err != nil {
				return fmt.Errorf("%s, %s, seed %d: %w", sc.name, v.name, seed, err)
			}
			mu.Lock()
			rep.Variants[i].Seeds[seed-1] = c
			mu.Unlock()
		}
		return nil
	})
	return rep, err
}

// admissionMatrix runs the admission comparison: the mixes' goodput rates,
// then every scenario (names, if any, picks them), with the threshold
// sweep's variants on its scenarios when sweep is set.
func admissionMatrix(ctx context.Context, o options, tracePath string, names, extra []string, sweep bool) (*admReport, error) {
	all := admissionScenarios(tracePath, extra)
	if len(names) > 0 {
		var picked []admScenario
		for _, n := range names {
			i := slices.IndexFunc(all, func(s admScenario) bool { return s.name == n })
			if i < 0 {
				return nil, fmt.Errorf("unknown admission scenario %q", n)
			}
			picked = append(picked, all[i])
		}
		all = picked
	}
	var mixes []*admMix
	for i := range all {
		if sweep && all[i].sweep {
			for _, v := range sweepVariants {
				if !slices.Contains(all[i].variants, v) {
					all[i].variants = append(all[i].variants, v)
				}
			}
		}
		if m := all[i].mix; m != nil && !slices.Contains(mixes, m) {
			mixes = append(mixes, m)
		}
	}
	slices.SortFunc(mixes, func(a, b *admMix) int { return strings.Compare(a.name, b.name) })
	r := newAdmRunner(o)
	rep := &admReport{Options: o.describe(), Sweep: sweep, Extra: extra, Queue: describeQueue(), Defaults: describeSaturation()}
	rates, err := r.goodputRates(ctx, mixes)
	if err != nil {
		return nil, err
	}
	for _, m := range mixes {
		rep.Mixes = append(rep.Mixes, *rates[m.name])
	}
	for _, sc := range all {
		start := time.Now()
		sr, err := r.scenario(ctx, sc, rates)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "simquality: %s in %s\n", sc.name, time.Since(start).Round(time.Second))
		rep.Scenarios = append(rep.Scenarios, sr)
	}
	rep.analyze()
	return rep, nil
}

// describeQueue says how the queue is configured.
func describeQueue() string {
	return fmt.Sprintf("classes %s (priority 1) and %s (priority 0, also requests that name no class), each with a %v wait limit; at most %d requests and %d tokens queued per replica",
		classInteractive, classBatch, admissionWaitLimit, admissionMaxQueued, admissionMaxTokens)
}

// describeSaturation names the default saturation thresholds.
func describeSaturation() string {
	return fmt.Sprintf("prefill_tokens %d, kv_fraction %g, waiting %d", scheduler.DefaultSaturationPrefillTokens,
		scheduler.DefaultSaturationKVFraction, scheduler.DefaultSaturationWaiting)
}

// runAdmission runs the admission comparison (-admission) and writes its
// report in out. only and extra are comma-separated scenario names and
// added variants ("" for none).
func runAdmission(ctx context.Context, o options, tracePath, only, extra string, sweep bool, out string) error {
	var names, variants []string
	if only != "" {
		names = strings.Split(only, ",")
	}
	if extra != "" {
		variants = strings.Split(extra, ",")
		for _, v := range variants {
			if _, err := parseVariant(v); err != nil {
				return err
			}
		}
	}
	start := time.Now()
	rep, err := admissionMatrix(ctx, o, tracePath, names, variants, sweep)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := rep.write(out); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "simquality: admission in %s; wrote %s\n", time.Since(start).Round(time.Second), filepath.Join(out, admissionReportFile))
	return nil
}
