// Command quality is duet's routing-quality benchmark (`make
// bench-quality`). It drives open-loop Poisson load through a real Envoy +
// duet into simulated SGLang engines (2 prefill × dp 4 and 2 decode × dp 4
// by default), compares the engine default with duet's policies on the
// same arrivals, and writes docs/benchmarks/quality-envoy.md, quality-envoy.json and
// PNG plots. See docs/benchmarks/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/duet-router/duet/e2e/bench"
)

// options are the command-line flags.
type options struct {
	out, profile, workloads, policies, simArgs, logDir string
	// prefillSimArgs and decodeSimArgs are duet-sim flags for one role.
	prefillSimArgs, decodeSimArgs string
	// trace, if set, is a Mooncake-format trace to replay as the workload
	// "trace", at each of traceSpeedups (comma-separated).
	trace, traceSpeedups                        string
	traceOffset                                 time.Duration
	traceMaxPrompt                              int
	rates                                       map[string]*string
	scale, chunkBudget                          float64
	window, drain, loadInterval, sampleInterval time.Duration
	seed                                        uint64
	prefill, decode, dp                         int
	quick, keepLogs                             bool
	// tokenizer is a tokenizer family (a directory under
	// DUET_TOKENIZERS_DIR or .tools/tokenizers) or a directory: every
	// engine then tokenizes with it and publishes KV events, and the
	// policies' +tokens and +events variants configure duet with it.
	tokenizer string
	// repeat runs every policy this many times, interleaved.
	repeat int
	// warmup is the start of the window left out of the statistics (0:
	// 10% of it).
	warmup time.Duration
	// sloTTFT and sloTPOT are the per-request SLO of the goodput of a
	// workload with priority classes (model time).
	sloTTFT, sloTPOT time.Duration
	// set holds the flags given on the command line.
	set map[string]bool
}

// Default rates (sessions per model second), from light to overload of
// the engine default, for the calibrated profile and for the simple model.
var (
	profileRates = map[string]string{
		bench.WorkloadVariable:  "4,8",
		bench.WorkloadMultiTurn: "4,8",
		bench.WorkloadBursty:    "4",
		// About 12 requests per session of 20k-60k tokens: 0.2 sessions/s
		// is about 2.5 requests/s, some 100k prompt tokens/s, twice the
		// prefill ranks' cold capacity (8 × 6.3k tokens/s) and a small
		// share of it when each session keeps its prefix cache.
		bench.WorkloadAgentic: "0.2",
		// The simulated multi-tenant scenario's rate (make bench-sim
		// -kv-events) on the same cluster.
		bench.WorkloadMultiTenant: "10",
		// The default cluster's goodput rate (the highest at which duet
		// without its queue serves 99 % within the SLO, measured by a
		// sweep: docs/benchmarks/admission-envoy) and twice it.
		bench.WorkloadPriorityMix: "9,18",
	}
	simpleRates = map[string]string{
		bench.WorkloadVariable:    "4,8,16,32",
		bench.WorkloadMultiTurn:   "1,2,4,8",
		bench.WorkloadBursty:      "2,4,8,16",
		bench.WorkloadAgentic:     "0.2",
		bench.WorkloadMultiTenant: "10",
		// The simple model has no contention: nothing saturates.
		bench.WorkloadPriorityMix: "4",
	}
)

// defaultProfile is the calibrated engine model used when the simulator
// has one: DP attention with lockstep ranks, where rank balance matters.
const defaultProfile = "dsv3-dp8-h100-node"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench-quality:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line.
func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("quality", flag.ContinueOnError)
	fs.StringVar(&o.out, "out", "docs/benchmarks", "output directory (quality-envoy.md, quality-envoy.json, PNG plots; with -quick a temporary directory)")
	fs.StringVar(&o.profile, "profile", "auto", `duet-sim --profile ("auto": `+defaultProfile+` when the simulator has profiles; "none": the simple model)`)
	fs.Float64Var(&o.scale, "time-scale", 0, "duet-sim --time-scale F (0: 5 with a profile, else 1)")
	fs.Float64Var(&o.chunkBudget, "chunk-budget", 6000,
		"streamed chunks per wall second a case may expect; sessions beyond it are sent without streaming (0: stream all)")
	fs.StringVar(&o.workloads, "workloads", strings.Join(bench.Workloads[:3], ","), "workloads to run (the others are simulated only: make bench-sim)")
	fs.StringVar(&o.policies, "policies", "", "policies to compare (default all: engine_default, round_robin, least_tokens, cache_aware, weighted, least_cost; "+
		"also "+bench.PolicyDecodeByLoad+", and SMG's binary (smg=="+bench.SMGVersion+", make .venv/.bench-installed) in place of Envoy + duet: "+
		bench.PolicySMGCacheAware+" (alias "+bench.PolicySMG+": cache_aware, --dp-aware), "+bench.PolicySMGCacheAwareDPMin+" (the same and --dp-minimum-tokens-scheduler), "+
		bench.PolicySMGLeastLoadDPMin+" (least_load, --dp-aware, --dp-minimum-tokens-scheduler), "+bench.PolicySMGEngineRanks+" (cache_aware, engines pick ranks); "+
		"under the --dp-aware ones the prefill engines run with "+bench.ForceQueryPrefillDPRankEnv+"; "+
		"a duet policy with the suffix "+suffixTokens+" runs duet with -tokenizer and kv_events off, with "+suffixEvents+" with -tokenizer and the engines' KV events, e.g. least_cost"+suffixEvents+"; "+
		"one with the suffix "+suffixNoQueue+" (last) runs duet with its admission queue off, e.g. least_cost"+suffixNoQueue+")")
	fs.StringVar(&o.tokenizer, "tokenizer", "", "tokenizer family (qwen3, llama3_1, deepseek_v3: a directory under $DUET_TOKENIZERS_DIR or .tools/tokenizers, make tokenizers) "+
		"or directory: every engine runs --tokenizer-path with it and publishes KV events (--kv-events-config), in every case; needed by the "+suffixTokens+" and "+suffixEvents+" policies")
	fs.IntVar(&o.repeat, "repeat", 1, "runs of every policy on the same arrivals, interleaved (run k > 1 is named POLICY#k), for the run-to-run spread")
	o.rates = map[string]*string{}
	for _, w := range bench.AllWorkloads() {
		o.rates[w] = fs.String("rates-"+w, "", "session arrival rates per model second for "+w+" (default depends on the model)")
	}
	fs.DurationVar(&o.window, "window", 0, "arrival window per case, model time (default 40s; 10s without a time scale; 4s with -quick)")
	fs.DurationVar(&o.warmup, "warmup", 0, "start of the arrival window left out of the statistics, model time (default 10% of the window)")
	fs.DurationVar(&o.drain, "drain", 0, "how long requests may run after the arrival window before they are cancelled, model time (default 60s with a time scale, else the window)")
	fs.DurationVar(&o.loadInterval, "load-interval", 500*time.Millisecond, "duet's load.interval, model time")
	fs.DurationVar(&o.sampleInterval, "sample-interval", 500*time.Millisecond, "load sampling period, model time")
	fs.Uint64Var(&o.seed, "seed", 1, "workload and simulator seed")
	fs.DurationVar(&o.sloTTFT, "slo-ttft", time.Duration(bench.DefaultSLO().TTFTms*float64(time.Millisecond)),
		"goodput SLO of a workload with priority classes ("+bench.WorkloadPriorityMix+"): each request's time to first token, model time")
	fs.DurationVar(&o.sloTPOT, "slo-tpot", time.Duration(bench.DefaultSLO().TPOTms*float64(time.Millisecond)),
		"goodput SLO: each request's mean time per output token after the first, model time")
	fs.IntVar(&o.prefill, "prefill", 2, "prefill engines")
	fs.IntVar(&o.decode, "decode", 2, "decode engines")
	fs.IntVar(&o.dp, "dp", 4, "DP ranks per engine")
	fs.StringVar(&o.simArgs, "sim-args", "", "extra duet-sim flags, space-separated")
	fs.StringVar(&o.prefillSimArgs, "prefill-sim-args", "", "extra duet-sim flags for the prefill engines only, space-separated (e.g. \"--kv-transfer-gbps 4\")")
	fs.StringVar(&o.decodeSimArgs, "decode-sim-args", "", "extra duet-sim flags for the decode engines only, space-separated (e.g. --disaggregation-decode-enable-radix-cache)")
	fs.StringVar(&o.logDir, "log-dir", "", "directory for per-case logs (default a temporary directory)")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the logs of successful cases")
	fs.StringVar(&o.trace, "trace", "", "Mooncake-format trace (JSONL, optionally gzipped; e.g. ../shared/traces/mooncake-synthetic.jsonl.gz) to replay as the workload \"trace\" (alone, unless -workloads is given too)")
	fs.StringVar(&o.traceSpeedups, "trace-speedups", "1", "time compressions of -trace, one case each (its \"rates\")")
	fs.DurationVar(&o.traceOffset, "trace-offset", 0, "start -trace this far into it (trace time)")
	fs.IntVar(&o.traceMaxPrompt, "trace-max-prompt", 120000, "cap on a -trace prompt, in tokens (a rank of the default profile holds 150k; 0: none)")
	fs.BoolVar(&o.quick, "quick", false, "a tiny smoke configuration: 1 prefill and 1 decode engine × dp 2, one load, two policies, short outputs")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	return o, nil
}

// run executes the benchmark.
func run(ctx context.Context, args []string) error {
	o, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	begin := time.Now()
	plan, err := buildPlan(o)
	if err != nil {
		return err
	}
	fmt.Println("bench-quality:", strings.Join(plan.Setup, "; "))
	rep, runErr := bench.RunPlan(ctx, plan)
	wall := time.Since(begin)
	if plan.OutDir != "" && ctx.Err() == nil {
		fmt.Printf("bench-quality: wrote %s/%s (%d cases) in %s wall time\n", plan.OutDir, bench.ReportFile, len(rep.Summaries), wall.Round(time.Second))
	}
	return runErr
}

// buildPlan turns options into a plan, probing the simulator's features.
func buildPlan(o options) (bench.Plan, error) {
	simPath, err := bench.SimPath()
	if err != nil {
		return bench.Plan{}, err
	}
	feat, err := bench.DetectSim(simPath)
	if err != nil {
		return bench.Plan{}, err
	}
	profile := o.profile
	switch profile {
	case "auto":
		profile = ""
		if feat.Profile {
			profile = defaultProfile
		}
	case "none":
		profile = ""
	default:
		if !feat.Profile {
			return bench.Plan{}, fmt.Errorf("duet-sim has no --profile flag; use -profile none")
		}
	}
	scale := o.scale
	if scale == 0 {
		scale = 1
		if profile != "" && feat.TimeScale {
			scale = 5
		}
	}
	if scale != 1 && !feat.TimeScale {
		return bench.Plan{}, fmt.Errorf("duet-sim has no --time-scale flag; use -time-scale 1")
	}

	plan := bench.Plan{
		ChunkBudget: o.chunkBudget,
		Seed:        o.seed,
		OutDir:      o.out,
		Window:      o.window,
		Rates:       map[string][]float64{},
		Config: bench.Config{
			Scale:          scale,
			PrefillEngines: o.prefill, DecodeEngines: o.decode, DPSize: o.dp,
			LoadInterval:   o.loadInterval,
			Drain:          o.drain,
			Warmup:         o.warmup,
			SampleInterval: o.sampleInterval,
			Dir:            o.logDir,
			KeepLogs:       o.keepLogs,
			Log:            os.Stdout,
			SLO:            bench.SLO{TTFTms: ms(o.sloTTFT), TPOTms: ms(o.sloTPOT)},
		},
	}
	var simArgs []string
	if profile != "" {
		simArgs = append(simArgs, "--profile", profile)
	}
	if feat.TimeScale {
		simArgs = append(simArgs, "--time-scale", strconv.FormatFloat(scale, 'g', -1, 64))
	}
	if feat.Seed {
		simArgs = append(simArgs, "--seed", strconv.FormatUint(o.seed, 10))
	}
	if feat.StreamInterval && scale > 1 {
		// One chunk per F tokens keeps the wall-clock chunk rate at the
		// model's token rate.
		plan.StreamInterval = int(math.Round(scale))
		simArgs = append(simArgs, "--stream-interval", strconv.Itoa(plan.StreamInterval))
	}
	if feat.MaxRecords {
		simArgs = append(simArgs, "--max-records", "100") // records hold whole bodies
	}
	simArgs = append(simArgs, strings.Fields(o.simArgs)...)
	plan.Config.SimArgs = simArgs
	plan.Config.PrefillSimArgs = strings.Fields(o.prefillSimArgs)
	plan.Config.DecodeSimArgs = strings.Fields(o.decodeSimArgs)

	defaults := profileRates
	if profile == "" {
		defaults = simpleRates
	}
	plan.Workloads = splitList(o.workloads)
	if o.trace != "" {
		if err := addTrace(&plan, o); err != nil {
			return plan, err
		}
	}
	tok, err := resolveTokenizer(o.tokenizer)
	if err != nil {
		return plan, err
	}
	if tok != "" {
		if !feat.KVEvents || !feat.Tokenizer {
			return plan, errors.New("-tokenizer: duet-sim has no --kv-events-config or --tokenizer-path flag (make build)")
		}
		plan.Config.KVEvents, plan.Config.SimTokenizer = true, tok
	}
	pageSize := 1 // the simple model's page size
	if profile != "" {
		pageSize = 16 // the engine model's cache block
	}
	if plan.Policies, err = selectPolicies(splitList(o.policies), tok, pageSize); err != nil {
		return plan, err
	}
	if o.quick {
		applyQuick(&plan, o)
		defaults = map[string]string{bench.WorkloadVariable: "4", bench.WorkloadMultiTurn: "1", bench.WorkloadBursty: "2", bench.WorkloadAgentic: "1",
			bench.WorkloadMultiTenant: "4", bench.WorkloadPriorityMix: "4"}
	}
	if o.repeat < 1 {
		return plan, fmt.Errorf("-repeat %d: want 1 or more", o.repeat)
	}
	plan.Policies = repeatPolicies(plan.Policies, o.repeat)
	if plan.Window == 0 {
		// 40 s of arrivals is 2 s of wall time at F = 20; the simple model
		// runs in real time and has no contention, so a short window shows
		// all it can.
		plan.Window = 40 * time.Second
		if scale == 1 {
			plan.Window = 10 * time.Second
		}
	}
	if plan.Config.Drain == 0 && scale > 1 {
		// Long enough for a 1,500-token answer at overload's step times.
		plan.Config.Drain = 60 * time.Second
	}
	for _, w := range plan.Workloads {
		if w == traceWorkload {
			continue // addTrace set its speedups
		}
		flagged, ok := o.rates[w]
		if !ok {
			return plan, fmt.Errorf("unknown workload %q (want %s)", w, strings.Join(bench.AllWorkloads(), ", "))
		}
		spec := *flagged
		if spec == "" {
			spec = defaults[w]
		}
		rates, err := parseRates(spec)
		if err != nil {
			return plan, fmt.Errorf("-rates-%s: %w", w, err)
		}
		plan.Rates[w] = rates
	}

	model := "simple model (no contention: --prefill-ms-per-1k-tokens 10, --decode-ms-per-token 2; latency does not depend on load)"
	if profile != "" {
		model = "profile `" + profile + "`"
	}
	c := plan.Config
	routers := "real Envoy + duet"
	if smg := smgPolicies(plan.Policies); len(smg) > 0 {
		if _, err := bench.SMGBin(); err != nil {
			return plan, err
		}
		routers += fmt.Sprintf("; %s: SMG's real binary (smg==%s, PD mode, every prefill with its bootstrap port and every decode) in place of Envoy + duet, "+
			"launched with SMG's defaults but for the flags their labels name; under --dp-aware the prefill engines run with %s "+
			"(SMG pins a prefill rank that its random bootstrap_room does not imply)", strings.Join(smg, ", "), bench.SMGVersion, bench.ForceQueryPrefillDPRankEnv)
	}
	plan.Setup = append([]string{
		fmt.Sprintf("simulator: %s; time scale F = %g (model time runs %g× faster than wall time)", model, scale, scale),
		fmt.Sprintf("cluster: %d prefill × dp %d, %d decode × dp %d (duet-sim), %s", c.PrefillEngines, c.DPSize, c.DecodeEngines, c.DPSize, routers),
		fmt.Sprintf("arrival window %s per case (%s excluded), then up to %s of drain; duet load.interval %s, load sampled every %s (model time)",
			plan.Window, warmupOf(plan), drainOf(plan), o.loadInterval, o.sampleInterval),
		fmt.Sprintf("seed %d: every policy replays the same arrivals and prompts", o.seed),
		streamLine(plan),
		fmt.Sprintf("duet-sim flags: `%s`", strings.Join(simArgs, " ")),
	}, plan.Setup...)
	if len(c.PrefillSimArgs) > 0 {
		plan.Setup = append(plan.Setup, fmt.Sprintf("prefill engines also: `%s`", strings.Join(c.PrefillSimArgs, " ")))
	}
	if len(c.DecodeSimArgs) > 0 {
		plan.Setup = append(plan.Setup, fmt.Sprintf("decode engines also: `%s`", strings.Join(c.DecodeSimArgs, " ")))
	}
	if tok != "" {
		plan.Setup = append(plan.Setup, tokenizerLines(o.tokenizer, pageSize)...)
	}
	if o.repeat > 1 {
		plan.Setup = append(plan.Setup, fmt.Sprintf("every policy ran %d times on the same arrivals, interleaved (all policies, then all again); run k > 1 is named POLICY#k", o.repeat))
	}
	addAdmission(&plan, scale)
	return plan, nil
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// smgPolicies returns the names of the policies that run SMG.
func smgPolicies(ps []bench.Policy) []string {
	var out []string
	for _, p := range ps {
		if p.Router == bench.RouterSMG {
			out = append(out, p.Name)
		}
	}
	return out
}

// traceWorkload is the name of a replayed -trace in the plan and report.
const traceWorkload = "trace"

// addTrace adds -trace to the plan as the workload "trace", replayed at
// each -trace-speedups (its rates), wrapping at the trace's end; without an
// explicit -workloads it is the only workload.
func addTrace(plan *bench.Plan, o options) error {
	recs, err := bench.LoadTrace(o.trace)
	if err != nil {
		return err
	}
	speedups, err := parseRates(o.traceSpeedups)
	if err != nil {
		return fmt.Errorf("-trace-speedups: %w", err)
	}
	if !o.set["workloads"] {
		plan.Workloads = nil
	}
	plan.Workloads = append(plan.Workloads, traceWorkload)
	plan.Rates[traceWorkload] = speedups
	plan.Build = func(name string, rate float64, window time.Duration, seed uint64, p bench.Params) (bench.Workload, error) {
		if name != traceWorkload {
			return bench.Generate(name, rate, window, seed, p)
		}
		return bench.TraceWorkload(traceWorkload, recs, bench.TraceOptions{
			Speedup: rate, Offset: o.traceOffset, Window: window, MaxPromptTokens: o.traceMaxPrompt, Wrap: true,
		})
	}
	plan.Setup = append(plan.Setup, fmt.Sprintf("trace `%s` (%d requests), speedups %s, offset %s, prompts capped at %d tokens",
		o.trace, len(recs), o.traceSpeedups, o.traceOffset, o.traceMaxPrompt))
	return nil
}

// warmupOf describes the start of the window a plan leaves out.
func warmupOf(plan bench.Plan) string {
	if w := plan.Config.Warmup; w > 0 {
		return "first " + min(w, plan.Window).String()
	}
	return "first 10%"
}

// drainOf is the drain a plan uses.
func drainOf(plan bench.Plan) time.Duration {
	if plan.Config.Drain > 0 {
		return plan.Config.Drain
	}
	return plan.Window
}

// streamLine describes which requests stream.
func streamLine(plan bench.Plan) string {
	chunk := "one chunk per token"
	if plan.StreamInterval > 1 {
		chunk = fmt.Sprintf("one chunk per %d tokens (--stream-interval)", plan.StreamInterval)
	}
	if plan.ChunkBudget <= 0 {
		return "every request streams, " + chunk
	}
	return fmt.Sprintf("streaming: %s; each case streams the share of its sessions (drawn by seed, the same for every policy) "+
		"that keeps the expected stream below %.0f chunks per wall second, the others are sent without streaming; "+
		"TTFT and TPOT come from the streamed requests (their count is the TTFT n column), everything else from all", chunk, plan.ChunkBudget)
}

// applyQuick shrinks the plan to a smoke test that runs in well under a
// minute.
func applyQuick(plan *bench.Plan, o options) {
	plan.Config.PrefillEngines, plan.Config.DecodeEngines, plan.Config.DPSize = 1, 1, 2
	if !o.set["window"] {
		plan.Window = 4 * time.Second
	}
	if !o.set["out"] {
		plan.OutDir = filepath.Join(os.TempDir(), "duet-bench-quick")
	}
	if !o.set["policies"] {
		plan.Policies, _ = bench.SelectPolicies([]string{bench.PolicyEngineDefault, "least_tokens"})
	}
	if !o.set["workloads"] && o.trace == "" {
		plan.Workloads = []string{bench.WorkloadVariable}
	}
	plan.Params = bench.QuickParams()
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// parseRates parses a comma-separated list of positive rates.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, part := range splitList(s) {
		v, err := strconv.ParseFloat(part, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("invalid rate %q", part)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("no rates")
	}
	return out, nil
}
