// Command overhead measures what duet adds to Envoy (`make
// bench-overhead`, issue 10): in one run it alternates Envoy alone in front
// of a fake engine that answers at once (direct); Envoy with ext_proc to
// processors that decide nothing (the floors: empty answers, the body sent
// back, full-duplex streaming); Envoy + ext_proc to duet without the access
// logs and usage filters (ext_proc only); the bootstraps `duet
// envoy-config` renders for an aggregated and a PD pool; and the
// standalone router users pick instead (SMG), aggregated and PD. Loads are
// fixed-rate open loops and closed-loop saturation runs (vegeta over
// loopback), every body distinct. The servers are pinned to one CPU and the
// load generator to another. It writes docs/benchmarks/overhead.md.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/experimental"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/extproc"
)

// pinnedEnv marks the process that already runs under taskset.
const pinnedEnv = "DUET_OVERHEAD_PINNED"

// options are the command-line flags.
type options struct {
	out, cases, variants, loadCPU, serverCPU, logDir, profile, duetEnv string
	// baseline is a directory with another build's duet (-baseline).
	baseline         string
	duration, warmup time.Duration
	reps, dp         int
	pin, keepLogs    bool
}

// defaultCases are the cases of `make bench-overhead`: chat at 1 and
// 32 KiB at 200, 500 and 1,000 rps and with 20 workers; 256 KiB at 100 and
// 200 rps and with 20 workers (Envoy alone serves 160-260 rps of 256 KiB
// on one core, so 500 and 1,000 rps would only measure queues); and
// /generate and a streamed chat at the headline 32 KiB and 500 rps.
const defaultCases = "1@200,1@500,1@1000,1@c20,32@200,32@500,32@1000,32@c20,256@100,256@200,256@c20,32/generate@500,32/stream@500"

// The floor processors run in this binary: they take duet's gRPC buffers
// (see extproc.BufferPool).
func init() { experimental.SetDefaultBufferPool(extproc.BufferPool()) }

func main() {
	var o options
	var floorAddr, floorMode string
	flag.StringVar(&o.out, "out", "docs/benchmarks/overhead.md", "report to write (relative to the repository root)")
	flag.StringVar(&o.cases, "cases", defaultCases, "cases, comma-separated: KiB[/generate][/stream]@RATE (open loop, requests per second) or @cN (closed loop, N workers)")
	flag.StringVar(&o.variants, "variants", strings.Join(allVariants(), ","), "variants to run, comma-separated")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "measured time of each run")
	flag.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unrecorded load before each run, on the same connections")
	flag.IntVar(&o.reps, "reps", 2, "repetitions; variants alternate within each")
	flag.IntVar(&o.dp, "dp", 2, "DP size of every fake engine")
	flag.BoolVar(&o.pin, "pin", true, "pin the load generator and the servers to separate CPUs with taskset")
	flag.StringVar(&o.loadCPU, "load-cpu", "0", "taskset CPU list of the load generator")
	flag.StringVar(&o.serverCPU, "server-cpu", "1", "taskset CPU list of Envoy, duet and the engines")
	flag.StringVar(&o.logDir, "log-dir", "", "directory for the processes' configs and logs (default: a temporary one, removed unless -keep-logs)")
	flag.BoolVar(&o.keepLogs, "keep-logs", false, "keep the temporary log directory")
	flag.StringVar(&o.baseline, "baseline", "", "directory holding another build's duet binary (e.g. one built from the main branch): every duet variant V also runs as \"V"+baselineSuffix+"\" with it, alternating with V in the same run, so that a change is measured against its base on the same machine at the same time")
	flag.StringVar(&o.duetEnv, "duet-env", "", "extra environment of every duet process, space-separated NAME=VALUE (e.g. GOGC=400)")
	flag.StringVar(&o.profile, "profile", "", "directory for CPU and allocation profiles of duet, taken during every run of a duet variant (listen.pprof on); profiling costs duet a little CPU")
	flag.StringVar(&floorAddr, "serve-floor", "", "internal: serve a floor ext_proc processor on this address and nothing else")
	flag.StringVar(&floorMode, "floor-mode", floorEmpty, "internal: the floor processor's mode")
	flag.Parse()

	if floorAddr != "" {
		if err := serveFloor(floorAddr, floorMode, floorMaxBody); err != nil {
			fmt.Fprintln(os.Stderr, "overhead:", err)
			os.Exit(1)
		}
		return
	}

	if o.pin && os.Getenv(pinnedEnv) == "" {
		if err := reexecPinned(o.loadCPU); err != nil {
			fmt.Fprintln(os.Stderr, "overhead:", err)
			os.Exit(1)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		os.Exit(1)
	}
}

// reexecPinned replaces the process with itself under `taskset -c cpu`,
// so that every thread of the load generator runs there.
func reexecPinned(cpu string) error {
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		return fmt.Errorf("pinning needs taskset (util-linux), or pass -pin=false: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("pin: %w", err)
	}
	argv := append([]string{"taskset", "-c", cpu, self}, os.Args[1:]...)
	env := append(os.Environ(), pinnedEnv+"=1")
	if err := syscall.Exec(taskset, argv, env); err != nil {
		return fmt.Errorf("pin: exec taskset: %w", err)
	}
	return nil
}

// run starts every variant's stack, measures every case in every
// repetition with the variants alternating, and writes the report.
func run(ctx context.Context, o options) (err error) {
	began := time.Now()
	cases, err := parseCases(o.cases)
	if err != nil {
		return err
	}
	variants, err := parseVariants(o.variants)
	if err == nil && o.baseline != "" {
		variants, err = withBaseline(variants, o.baseline)
	}
	if err != nil {
		return err
	}
	tools, err := harness.FindTools()
	if err != nil {
		return fmt.Errorf("find tools: %w", err)
	}
	envoyVersion, err := tools.EnvoyVersion()
	if err != nil {
		return fmt.Errorf("envoy version: %w", err)
	}
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			return fmt.Errorf("profile dir: %w", err)
		}
	}
	dir := o.logDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "duet-overhead-"); err != nil {
			return fmt.Errorf("log dir: %w", err)
		}
		if !o.keepLogs {
			defer os.RemoveAll(dir)
		}
	}
	pin := pinning{}
	loadCPU, serverCPU := "", ""
	if o.pin {
		pin.serverCPU, pin.collectorCPU = o.serverCPU, o.loadCPU
		loadCPU, serverCPU = cpuName(o.loadCPU), cpuName(o.serverCPU)
	}

	stacks := map[string]*stack{}
	defer func() {
		for _, s := range stacks {
			if cerr := s.close(); cerr != nil && err == nil {
				err = fmt.Errorf("stop %s: %w", s.variant, cerr)
			}
		}
	}()
	for i, v := range variants {
		t := tools
		base, isBaseline := strings.CutSuffix(v, baselineSuffix)
		if isBaseline {
			t.Duet = filepath.Join(o.baseline, "duet")
		}
		s, err := startStack(ctx, t, filepath.Join(dir, fmt.Sprintf("%d-%s", i, strings.NewReplacer(" ", "-", "@", "").Replace(v))), base, o.dp, pin, o.profile != "", strings.Fields(o.duetEnv))
		if err != nil {
			return fmt.Errorf("start: %w (logs in %s)", err, dir)
		}
		stacks[v] = s
	}
	fmt.Fprintf(os.Stderr, "overhead: %d variants up (logs in %s); %d cases × %d reps × %s\n",
		len(variants), dir, len(cases), o.reps, o.duration)

	var results []result
	for rep := 1; rep <= o.reps; rep++ {
		for _, c := range cases {
			for _, v := range variants {
				var prof *profiler
				if o.profile != "" && stacks[v].duetAdmin != "" {
					secs := int(math.Ceil((o.warmup + o.duration).Seconds()))
					prof = startProfile(ctx, stacks[v].duetAdmin, secs, o.profile, fmt.Sprintf("%s-%s-rep%d", c, v, rep))
				}
				client := newClient()
				smp, err := measure(ctx, client, stacks[v].url, c, o.warmup, o.duration, loadCPU, serverCPU, stacks[v].pids())
				client.CloseIdleConnections()
				if err != nil {
					return fmt.Errorf("%s, %s, rep %d: %w", v, c, rep, err)
				}
				if prof != nil {
					if err := prof.wait(); err != nil {
						return fmt.Errorf("%s, %s, rep %d: %w", v, c, rep, err)
					}
				}
				st := summarize(smp)
				fmt.Fprintf(os.Stderr, "rep %d  %-34s %-18s p50 %7s p99 %7s  sent %6.0f/s  2xx %6.0f/s  cpu load %s server %s  µs/req %.0f/%.0f/%.0f  errors %d %s\n",
					rep, c, v, msf(st.P50), msf(st.P99), st.Rate, st.Throughput, percent(st.LoadCPU), percent(st.ServerCPU),
					st.CPUPerReq[roleProxy], st.CPUPerReq[roleProcessor], st.CPUPerReq[roleEngines], st.Errors, smp.firstError)
				results = append(results, result{Variant: v, Case: c, Rep: rep, Stats: st})
			}
		}
	}

	m := meta{
		Command:  "make bench-overhead" + flagsSuffix(),
		Date:     began.UTC().Format("2006-01-02 15:04 MST"),
		Duration: time.Since(began).Round(time.Second).String(),
		Machine:  machine(),
		Envoy:    envoyVersion + " (`.venv/bin/envoy`, `--concurrency 1`)",
		Pinning:  pinText(o),
		Load: fmt.Sprintf("vegeta (github.com/tsenart/vegeta/v12 library) over loopback HTTP/1.1 keep-alive, "+
			"POST /v1/chat/completions (or /generate where the case says so), max_tokens 1, non-streaming unless the case says streamed; "+
			"every body distinct (a request number at the start of its prompt, so every prompt is new to duet's and SMG's prefix indexes); "+
			"open loop at fixed rates, closed loop with N workers (concurrency N); "+
			"%s measured after %s of unrecorded warmup per run; variants alternate within each of %d repetitions; "+
			"fake engine: duet-sim --dp-size %d --decode-ms-per-token 0 --prefill-ms-per-1k-tokens 0 (null mode, PD: prefill + decode modes); "+
			"duet with its default policies (prefill %s, decode and aggregated %s); "+
			"duet logs at info, Envoy at warn, SMG at warn%s", o.duration, o.warmup, o.reps, o.dp,
			duetPrefillPolicy, duetDecodePolicy, duetEnvText(o.duetEnv)),
	}
	m.Notes = append(m.Notes,
		"Variants: "+variantsText(variants),
		"Above a variant's capacity an open-loop run queues: its latencies then measure the queue, and 2xx rps is what it served")
	if s := stacks[variantPD]; s != nil {
		if note, err := mirrorNote(ctx, s.envoyAdmin); err == nil {
			m.Notes = append(m.Notes, note)
		} else {
			m.Notes = append(m.Notes, "PD mirror: could not read Envoy's counters: "+err.Error())
		}
	}
	var buf bytes.Buffer
	if err := writeReport(&buf, m, variants, cases, results); err != nil {
		return err
	}
	out := o.out
	if !filepath.IsAbs(out) {
		root, err := repoRoot()
		if err != nil {
			return err
		}
		out = filepath.Join(root, out)
	}
	if o.profile != "" {
		out = filepath.Join(o.profile, "overhead.md") // a profiled run is not the report's
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	fmt.Fprintf(os.Stderr, "overhead: wrote %s in %s\n", out, time.Since(began).Round(time.Second))
	return nil
}

// variantDescriptions say what each variant runs, for the report.
var variantDescriptions = map[string]string{
	variantDirect: "a minimal hand-written bootstrap (one route to the engine, no ext_proc, no access log)",
	variantFloor: "the ext_proc only bootstrap (below) with a processor that decides nothing in duet's place " +
		"(empty answers to the headers and the buffered body; this command's -serve-floor, with duet's gRPC server options, GOMAXPROCS=1): " +
		"what Envoy's ext_proc costs by itself",
	variantFloorBody: "the same, but the body answer sends the body back as a body mutation with its content-length, " +
		"the shape and size of duet's answer",
	variantFloorDuplex: "request_body_mode FULL_DUPLEX_STREAMED (trailers SEND), the processor holding the headers until " +
		"the body has arrived, then streaming it back unchanged",
	variantExtProc: "the aggregated bootstrap of `duet envoy-config` without its access logs (stdout and gRPC, downstream and upstream) " +
		"and without the json_to_metadata, sse_to_metadata and Lua filters; duet's admission queue off (without feedback its reservations never end)",
	variantAgg:   "the bootstrap `duet envoy-config` renders, one engine in the decode pool",
	variantMTLS:  "duet aggregated with mutual TLS between Envoy and duet (auth.tls, `duet certs` credentials: ECDSA P-256, TLS 1.3) on the ext_proc and access-log streams",
	variantToken: "duet aggregated with the bearer token (auth.token_file) on every ext_proc and access-log stream, plaintext",
	variantShared: "duet aggregated sharing its state over NATS (sync) with a second duet replica that only applies the first's events; " +
		"its processor CPU includes the peer replica and nats-server (pinned with the other servers)",
	variantReplicas2: "two duet replicas sharing state over NATS, both listed in Envoy's clusters to duet (envoy.duet_replicas: streams spread over them); processor CPU is both replicas and nats-server",
	variantReplicas3: "three duet replicas, as duet 2 replicas",
	variantPD:        "the rendered bootstrap of one prefill and one decode engine (the mirror), duet's defaults (the admission queue on, never saturated here)",
	variantPDNoQueue: "duet PD with the admission queue off (admission.enabled: false): what the queue costs when nothing is saturated is duet PD less this",
	variantPDTokenizer: "duet PD with Qwen3's tokenizer and chat template (tokenizer section, page_size 16): every prompt new, so each is rendered and tokenized in full " +
		"(the /generate case tokenizes its text)",
	variantPDTraced1: "duet PD with tracing on (duet's otlp section): Envoy samples 1 % of requests at random and traces them, with duet's decision span, " +
		"into a Jaeger v2 (in memory, pinned to the load generator's CPU, so that the backend takes no server CPU, as on a machine of its own)",
	variantPDTraced100: "duet PD traced 1 %, but every request sampled",
	variantSMG:         "the standalone router users pick instead (Shepherd Model Gateway, pip smg==" + smgVersion + ", Rust), no Envoy, cache_aware, in front of the same fake engine, pinned like the servers",
	variantSMGPD:       "SMG in PD mode (cache_aware prefill and decode) in front of a prefill and a decode engine",
}

// baselineSuffix marks a variant run with the -baseline build's duet.
const baselineSuffix = " @baseline"

// withBaseline adds, right after each duet variant, the same variant run
// with the duet binary in dir.
func withBaseline(variants []string, dir string) ([]string, error) {
	if _, err := os.Stat(filepath.Join(dir, "duet")); err != nil {
		return nil, fmt.Errorf("-baseline: %w", err)
	}
	var out []string
	for _, v := range variants {
		out = append(out, v)
		if strings.HasPrefix(v, "duet ") {
			out = append(out, v+baselineSuffix)
		}
	}
	return out, nil
}

// variantsText describes the variants that ran.
func variantsText(variants []string) string {
	parts := make([]string, 0, len(variants))
	for _, v := range variants {
		if base, ok := strings.CutSuffix(v, baselineSuffix); ok {
			parts = append(parts, "**"+v+"**: "+base+" with the -baseline build's duet")
			continue
		}
		parts = append(parts, "**"+v+"**: "+variantDescriptions[v])
	}
	return strings.Join(parts, "; ")
}

// duetEnvText names -duet-env in the report, if given.
func duetEnvText(env string) string {
	if env == "" {
		return ""
	}
	return "; duet ran with " + env
}

// floorMaxBody is the floor processors' body limit: duet's default.
const floorMaxBody = 32 << 20

// parseCases parses the -cases list (see its usage).
func parseCases(spec string) ([]loadCase, error) {
	var cases []loadCase
	for f := range strings.SplitSeq(spec, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		what, load, ok := strings.Cut(f, "@")
		if !ok {
			return nil, fmt.Errorf("-cases: %q has no @RATE or @cN", f)
		}
		parts := strings.Split(what, "/")
		kib, err := parseInts(parts[0])
		if err != nil || len(kib) != 1 {
			return nil, fmt.Errorf("-cases: %q: the body size %q is not a number of KiB", f, parts[0])
		}
		c := loadCase{bodyBytes: kib[0] << 10, api: apiChat}
		for _, p := range parts[1:] {
			switch p {
			case "generate":
				c.api = apiGenerate
			case "stream":
				c.stream = true
			default:
				return nil, fmt.Errorf("-cases: %q: unknown option %q (want generate or stream)", f, p)
			}
		}
		n, err := parseInts(strings.TrimPrefix(load, "c"))
		if err != nil || len(n) != 1 {
			return nil, fmt.Errorf("-cases: %q: %q is not RATE or cN", f, load)
		}
		if strings.HasPrefix(load, "c") {
			c.workers = n[0]
		} else {
			c.rate = n[0]
		}
		cases = append(cases, c)
	}
	if len(cases) == 0 {
		return nil, errors.New("no case to run: give -cases")
	}
	return cases, nil
}

// parseVariants parses the -variants list; direct is always measured
// first, as every other variant is compared with it.
func parseVariants(spec string) ([]string, error) {
	want := map[string]bool{variantDirect: true}
	for f := range strings.SplitSeq(spec, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(allVariants(), f) {
			return nil, fmt.Errorf("-variants: unknown variant %q (known: %s)", f, strings.Join(allVariants(), ", "))
		}
		want[f] = true
	}
	var out []string
	for _, v := range allVariants() {
		if want[v] {
			out = append(out, v)
		}
	}
	return out, nil
}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// flagsSuffix is the OVERHEAD_FLAGS part of the command that ran, if any.
func flagsSuffix() string {
	if len(os.Args) < 2 {
		return ""
	}
	return " OVERHEAD_FLAGS='" + strings.Join(os.Args[1:], " ") + "'"
}

// pinText says how the CPUs were shared.
func pinText(o options) string {
	if !o.pin {
		return fmt.Sprintf("not pinned (%d CPUs shared by everything)", runtime.NumCPU())
	}
	return fmt.Sprintf("`taskset -c %s` for the load generator (this command, GOMAXPROCS %d); `taskset -c %s` for Envoy "+
		"(--concurrency 1), duet (GOMAXPROCS=1) and the fake engines; the same for every variant",
		o.loadCPU, runtime.GOMAXPROCS(0), o.serverCPU)
}

// machine describes the host: CPU model, CPU count, kernel.
func machine() string {
	model := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	cpus := runtime.NumCPU()
	if n, err := exec.Command("nproc", "--all").Output(); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(n))); err == nil {
			cpus = v
		}
	}
	kernel := "unknown kernel"
	if out, err := exec.Command("uname", "-sr").Output(); err == nil {
		kernel = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("%s, %d CPUs, %s, %s/%s, %s", model, cpus, kernel, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// mirrorNote reads the PD Envoy's upstream request counters: the mirror
// sends every request to a prefill engine too, so the backend does twice
// the work of the aggregated variant.
func mirrorNote(ctx context.Context, adminURL string) (string, error) {
	counts, err := harness.EnvoyCounters(ctx, adminURL, "upstream_rq_total$")
	if err != nil {
		return "", err
	}
	decode, prefill := counts["cluster.duet_decode.upstream_rq_total"], counts["cluster.duet_prefill.upstream_rq_total"]
	if decode == 0 {
		return "", errors.New("no decode requests counted")
	}
	return fmt.Sprintf("PD mirror: the PD variant's Envoy sent %d requests to the decode engine and %d to the prefill engine "+
		"(%.2f backend requests per client request): its backend does twice the aggregated variant's work on the same core, "+
		"so part of its added latency is the second engine's, not duet's", decode, prefill, float64(decode+prefill)/float64(decode)), nil
}

// repoRoot walks up from the working directory to the directory with go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("repo root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repo root: go.mod not found above the working directory")
		}
		dir = parent
	}
}
