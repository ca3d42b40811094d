// Command simquality is duet's routing-quality benchmark on the
// deterministic cluster simulator (`make bench-sim`): every scenario, every
// routing, many seeds, in virtual time. It writes
// docs/benchmarks/quality.md, quality.json and quality-*.png.
//
// For each headline scenario it searches, per routing and seed, the
// highest arrival rate that meets the SLO (goodput), then compares every
// routing at 80% of the engine default's median goodput. Other scenarios
// are compared at a fixed rate. Each figure is the median over seeds with a
// 95% bootstrap interval; ratios to engine_default are paired by seed.
// Equal flags give byte-identical output.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/e2e/bench/ci"
	"github.com/duet-router/duet/e2e/clustersim"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "simquality:", err)
		os.Exit(1)
	}
}

// run parses args, runs the matrix and writes the report.
func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("simquality", flag.ContinueOnError)
	var o options
	var out, only string
	fs.IntVar(&o.seeds, "seeds", 10, "seeds per case")
	fs.DurationVar(&o.window, "window", 10*time.Minute, "arrival window per run (model time)")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Minute, "arrivals before this are not measured")
	fs.DurationVar(&o.sloTTFTP99, "slo-ttft-p99", 2*time.Second, "SLO: p99 time to first token")
	fs.DurationVar(&o.sloTPOTMean, "slo-tpot-mean", 50*time.Millisecond, "SLO: mean time per output token")
	fs.IntVar(&o.parallel, "parallel", 0, "simulations run at once (0: GOMAXPROCS)")
	fs.IntVar(&o.resamples, "resamples", ci.DefaultResamples, "bootstrap resamples per interval")
	fs.StringVar(&only, "scenarios", "", "comma-separated scenarios to run (default all)")
	fs.StringVar(&out, "out", "docs/benchmarks", "output directory")
	var tracePath string
	fs.StringVar(&tracePath, "trace", "../shared/traces/mooncake-synthetic.jsonl.gz", "Mooncake-format trace (JSONL, optionally gzipped) that the trace scenarios replay; point it at your own to choose a policy")
	var routingList string
	var decodeCache bool
	fs.BoolVar(&decodeCache, "decode-cache", false, "run the decode radix cache comparison (docs/benchmarks/decode-cache.md) instead of the main matrix")
	var kvEvents bool
	fs.BoolVar(&kvEvents, "kv-events", false, "run the KV events comparison (docs/benchmarks/kv-events.md) instead of the main matrix")
	var admission, admissionSweep bool
	var admissionVariants string
	fs.BoolVar(&admission, "admission", false, "run the admission comparison (docs/benchmarks/admission/) instead of the main matrix: overload scenarios and the quality matrix's with queueing off and on")
	fs.BoolVar(&admissionSweep, "admission-sweep", true, "with -admission, also sweep the saturation thresholds on burst_2x and steady")
	fs.StringVar(&admissionVariants, "admission-variants", "", "with -admission, comma-separated variants added to every scenario (e.g. on/p=8192/kv=0.85)")
	fs.Float64Var(&o.rate, "rate", 0, "compare every scenario at this rate (sessions/s) without a goodput search (experiments)")
	fs.StringVar(&routingList, "routings", "", "comma-separated routings to compare in every scenario, engine_default first (default: each scenario's own); a suffix +covered or +inflight sets load.prefill_accounting")
	var cross, crossPolicies string
	var crossWindow time.Duration
	var crossSeed uint64
	fs.StringVar(&cross, "crosscheck", "", "instead of the matrix, simulate one real-path case of make bench-quality (workload:rate, e.g. variable:8) and print its statistics")
	fs.StringVar(&crossPolicies, "crosscheck-policies", "engine_default,least_tokens,cache_aware", "routings of -crosscheck")
	fs.DurationVar(&crossWindow, "crosscheck-window", 40*time.Second, "arrival window of -crosscheck (bench-quality's default)")
	fs.Uint64Var(&crossSeed, "crosscheck-seed", 1, "seed of -crosscheck (bench-quality's -seed)")
	var crossDP, crossSeeds int
	var crossParts bool
	fs.IntVar(&crossDP, "crosscheck-dp", 4, "DP ranks per engine of -crosscheck (bench-quality's -dp)")
	fs.IntVar(&crossSeeds, "crosscheck-seeds", 1, "seeds of -crosscheck: -crosscheck-seed and the ones after it, paired across routings")
	fs.BoolVar(&crossParts, "crosscheck-parts", false, "with -crosscheck, also split each routing's mean TTFT into prefill wait, prefill compute, KV transfer, decode wait and first step, with its cache hits and where each session's next turn went")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cross != "" {
		return crossCheck(ctx, os.Stdout, crossCase{spec: cross, policies: crossPolicies, window: crossWindow,
			seed: crossSeed, seeds: crossSeeds, dp: crossDP, parts: crossParts})
	}
	if routingList != "" {
		o.routings = strings.Split(routingList, ",")
	}
	if o.seeds < 2 || o.window <= o.warmup {
		return errors.New("need -seeds >= 2 and -window > -warmup")
	}
	if admission {
		return runAdmission(ctx, o, tracePath, only, admissionVariants, admissionSweep, out)
	}
	all := scenarios(tracePath)
	if decodeCache {
		all = decodeCacheScenarios(tracePath)
	}
	if kvEvents {
		all = kvEventsScenarios(tracePath)
	}
	if only != "" {
		var picked []scenario
		for _, name := range strings.Split(only, ",") {
			i := slices.IndexFunc(all, func(s scenario) bool { return s.name == name })
			if i < 0 {
				return fmt.Errorf("unknown scenario %q", name)
			}
			picked = append(picked, all[i])
		}
		all = picked
	}
	start := time.Now()
	rep, err := newRunner(o).matrix(ctx, all)
	if err != nil {
		return err
	}
	rep.DecodeCache, rep.KVEvents = decodeCache, kvEvents
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := rep.write(out); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "simquality: %d scenarios in %s; wrote %s\n", len(all), time.Since(start).Round(time.Second), filepath.Join(out, reportFile))
	return nil
}

// Output files.
const (
	reportFile = "quality.md"
	dataFile   = "quality.json"
)

// matrix runs every scenario and returns the report.
func (r *runner) matrix(ctx context.Context, scs []scenario) (*report, error) {
	rep := &report{Options: r.opts.describe()}
	for _, sc := range scs {
		start := time.Now()
		sr, err := r.scenario(ctx, sc)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "simquality: %s in %s\n", sc.name, time.Since(start).Round(time.Second))
		rep.Scenarios = append(rep.Scenarios, sr)
	}
	return rep, nil
}

// seedList is 1..n.
func (o options) seedList() []uint64 {
	out := make([]uint64, o.seeds)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// scenario runs one scenario: the goodput search (headlines), then the
// comparison at one rate.
func (r *runner) scenario(ctx context.Context, sc scenario) (scenarioReport, error) {
	names := sc.routings
	if r.opts.routings != nil {
		names = r.opts.routings
	}
	rts, err := routings(names)
	if err != nil {
		return scenarioReport{}, err
	}
	seeds := r.opts.seedList()
	sr := scenarioReport{Name: sc.name, Title: sc.title, Workload: sc.workload, Cluster: sc.cluster.String(), Profile: sc.profile}
	reqPerSession := bench.MeanRequestsPerSession(sc.workload, bench.Params{})
	rate := sc.rate
	goodput := map[string][]float64{}
	if r.opts.rate > 0 {
		rate = r.opts.rate
	} else if sc.goodput != nil {
		goodput, err = perSeedRouting(ctx, r, seeds, rts, func(ctx context.Context, rt routing, seed uint64) (float64, error) {
			return r.goodput(ctx, sc, rt, seed)
		})
		if err != nil {
			return sr, err
		}
		base, err := ci.Median(goodput[rts[0].name], r.opts.resamples, 1)
		if err != nil {
			return sr, fmt.Errorf("%s: engine default goodput: %w", sc.name, err)
		}
		rate = snap(0.8*base.Median, sc.goodput.step/2)
		sr.SearchGrid = fmt.Sprintf("%g to %g step %g sessions/s", sc.goodput.lo, sc.goodput.hi, sc.goodput.step)
	}
	if rate <= 0 {
		return sr, fmt.Errorf("%s: no rate to compare at (engine default goodput 0)", sc.name)
	}
	sr.Rate, sr.RequestRate = rate, rate*reqPerSession
	summaries, err := perSeedRouting(ctx, r, seeds, rts, func(ctx context.Context, rt routing, seed uint64) (clustersim.Summary, error) {
		return r.summary(ctx, sc, rate, rt, seed)
	})
	if err != nil {
		return sr, err
	}
	for _, rt := range rts {
		rr := routingReport{Name: rt.name, Seeds: summaries[rt.name]}
		if g, ok := goodput[rt.name]; ok {
			rr.GoodputPerSeed = g
		}
		sr.Routings = append(sr.Routings, rr)
	}
	sr.analyze(r.opts.resamples)
	return sr, nil
}

// snap rounds x down to a multiple of step.
func snap(x, step float64) float64 {
	n := float64(int(x/step + 1e-9))
	return float64(int(n*step*1000+0.5)) / 1000
}

// perSeed runs f for every seed, r.opts.parallel seeds at a time, and
// forgets each seed's prepared workloads once its work is done.
func (r *runner) perSeed(ctx context.Context, seeds []uint64, f func(context.Context, uint64) error) error {
	return forSeeds(ctx, r.opts.parallel, seeds, func(ctx context.Context, seed uint64) error {
		defer r.release(seed)
		return f(ctx, seed)
	})
}

// perSeedRouting runs f for every seed (as perSeed does) and every routing
// (concurrently, as forEach does) and returns the results by routing name,
// indexed by seed-1.
func perSeedRouting[T any](ctx context.Context, r *runner, seeds []uint64, rts []routing,
	f func(context.Context, routing, uint64) (T, error)) (map[string][]T, error) {
	out := make(map[string][]T, len(rts))
	for _, rt := range rts {
		out[rt.name] = make([]T, len(seeds))
	}
	err := r.perSeed(ctx, seeds, func(ctx context.Context, seed uint64) error {
		return forEach(ctx, rts, func(ctx context.Context, rt routing) error {
			v, err := f(ctx, rt, seed)
			if err != nil {
				return err
			}
			r.mu.Lock()
			out[rt.name][seed-1] = v
			r.mu.Unlock()
			return nil
		})
	})
	return out, err
}

// forEach runs f for every routing concurrently (the runner bounds the
// simulations actually running).
func forEach(ctx context.Context, rts []routing, f func(context.Context, routing) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(rts))
	for i, rt := range rts {
		wg.Go(func() { errs[i] = f(ctx, rt) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// describe lists the options for the report.
func (o options) describe() optionsReport {
	return optionsReport{
		Seeds: o.seeds, Window: o.window.String(), Warmup: o.warmup.String(),
		SLOTTFTP99: o.sloTTFTP99.String(), SLOTPOTMean: o.sloTPOTMean.String(), Resamples: o.resamples,
	}
}

// finite returns a copy of rep whose infinite p99 TTFTs (runs where a
// measured request failed or did not finish) are -1: JSON has no infinity.
func (rep *report) finite() *report {
	out := *rep
	out.Scenarios = slices.Clone(rep.Scenarios)
	for i := range out.Scenarios {
		sr := &out.Scenarios[i]
		sr.Routings = slices.Clone(sr.Routings)
		for j := range sr.Routings {
			rr := &sr.Routings[j]
			rr.Seeds = slices.Clone(rr.Seeds)
			for k := range rr.Seeds {
				for _, v := range []*float64{&rr.Seeds[k].TTFTP99, &rr.Seeds[k].TTFTP50} {
					if math.IsInf(*v, 0) {
						*v = -1
					}
				}
			}
		}
	}
	return &out
}

// write saves the report's JSON, Markdown and plots in dir.
func (rep *report) write(dir string) error {
	data, err := json.MarshalIndent(rep.finite(), "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, dataFile), append(data, '\n'), 0o644); err != nil {
		return err
	}
	plots, err := rep.plot(dir)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, reportFile), []byte(rep.markdown(plots)), 0o644)
}
