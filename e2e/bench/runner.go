package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// Config is how cases run. Durations named "model" are model time; the
// stack runs Scale times faster.
type Config struct {
	// Scale is the time scale F: model time runs F times faster than wall
	// time. It must match the simulator's --time-scale (1 without it).
	Scale float64
	// PrefillEngines, DecodeEngines and DPSize shape the cluster (default
	// 2, 2 and 4).
	PrefillEngines, DecodeEngines, DPSize int
	// SimArgs are extra duet-sim flags for every engine (profile, time
	// scale, seed, ...).
	SimArgs []string
	// PrefillSimArgs and DecodeSimArgs are extra duet-sim flags for the
	// prefill or the decode engines alone, after SimArgs (e.g.
	// --kv-transfer-gbps for prefills, --disaggregation-decode-enable-radix-cache
	// for decodes).
	PrefillSimArgs, DecodeSimArgs []string
	// DecodeMsPerToken is the simple model's decode pace (wall ms; used
	// only without a profile; 0 takes the harness default, 2).
	DecodeMsPerToken int
	// LoadInterval is duet's load.interval in model time (default 500ms).
	LoadInterval time.Duration
	// SampleInterval is the load sampler's period in model time (default
	// 500ms).
	SampleInterval time.Duration
	// Warmup is the model-time start of the arrival window excluded from
	// the statistics (default 10% of the window).
	Warmup time.Duration
	// Drain is how long, in model time, requests may run after the arrival
	// window before they are cancelled (default the window length).
	Drain time.Duration
	// MaxInFlight bounds concurrent requests; arrivals beyond it fail as
	// "client overloaded" (default 2000).
	MaxInFlight int
	// KVTimeout is the decode engines' wait for KV (--kv-timeout; default
	// 300s, SGLang's). The simulator scales it like every model duration.
	KVTimeout time.Duration
	// Model is the model name sent (default "sim-model").
	Model string
	// KVEvents makes every engine publish SGLang's KV events on ports of
	// its own (harness.Options.KVEvents), whatever the policy: duet follows
	// them where its configuration says (Policy.DuetYAML).
	KVEvents bool
	// SimTokenizer is a tokenizer directory every engine keys text prompts
	// by (duet-sim --tokenizer-path; harness.Options.SimTokenizer).
	SimTokenizer string
	// SLO is what a workload with priority classes counts its goodput
	// against (Summary.SummarizeClasses; zero: DefaultSLO).
	SLO SLO
	// Dir receives each case's logs; a case's directory is removed after it
	// succeeds unless KeepLogs is set.
	Dir      string
	KeepLogs bool
	// Log receives progress lines (nil: none).
	Log io.Writer
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.Scale <= 0 {
		c.Scale = 1
	}
	if c.PrefillEngines == 0 {
		c.PrefillEngines = 2
	}
	if c.DecodeEngines == 0 {
		c.DecodeEngines = 2
	}
	if c.DPSize == 0 {
		c.DPSize = 4
	}
	if c.LoadInterval == 0 {
		c.LoadInterval = 500 * time.Millisecond
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = 500 * time.Millisecond
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 2000
	}
	if c.KVTimeout == 0 {
		c.KVTimeout = 300 * time.Second
	}
	if c.Model == "" {
		c.Model = "sim-model"
	}
	if c.SLO == (SLO{}) {
		c.SLO = DefaultSLO()
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// wall converts a model duration into wall time.
func (c Config) wall(d time.Duration) time.Duration { return time.Duration(float64(d) / c.Scale) }

// Case is one workload at one load under one policy.
type Case struct {
	Workload Workload
	Policy   Policy
	// RequestsPerSession converts the session rate into a request rate for
	// the report.
	RequestsPerSession float64
}

// CaseResult is the outcome of one case.
type CaseResult struct {
	Summary Summary
	// Polls are the load samples; Labels names their ranks by role.
	Polls  []Poll
	Labels map[string][]string
	// Window is the measured window (model time).
	Window Window
	// Decode is the decode radix cache's evidence, nil when no decode
	// engine runs that cache.
	Decode *DecodeCache
	// RouterArgv is the command line of the router that ran in place of
	// Envoy + duet (Policy.Router), nil for duet.
	RouterArgv []string
}

// RunCase starts a fresh stack for c, replays its workload and stops the
// stack. A failure to run at all is returned as an error (and recorded in
// Summary.Failed); request failures are counted in the summary.
func RunCase(ctx context.Context, cfg Config, c Case) (res CaseResult, err error) {
	cfg = cfg.withDefaults()
	w := c.Workload
	res.Summary = Summary{Workload: w.Name, Policy: c.Policy.Name, Rate: w.Rate, RequestRate: w.Rate * max(c.RequestsPerSession, 1),
		StreamFraction: w.StreamFraction}
	begin := time.Now()
	defer func() {
		res.Summary.WallSeconds = time.Since(begin).Seconds()
		if err != nil {
			res.Summary.Failed = err.Error()
		}
	}()

	dir, err := caseDir(cfg.Dir, fmt.Sprintf("%s-%g-%s", w.Name, w.Rate, c.Policy.Name))
	if err != nil {
		return res, err
	}
	if r := c.Policy.Router; r != "" && r != RouterSMG {
		return res, fmt.Errorf("policy %s: unknown router %q (want %q or none)", c.Policy.Name, r, RouterSMG)
	}
	stack, err := harness.Start(ctx, cfg.stackOptions(c.Policy, dir))
	if err != nil {
		return res, fmt.Errorf("start stack: %w (logs in %s)", err, dir)
	}
	defer func() {
		if cerr := stack.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("stop stack: %w", cerr)
		}
		if err != nil {
			err = fmt.Errorf("%w (logs in %s)", err, dir)
		} else if !cfg.KeepLogs {
			_ = os.RemoveAll(dir)
		}
	}()

	base, logs := stack.EnvoyURL, stack.Logs
	if c.Policy.Router == RouterSMG {
		proc, smgURL, argv, serr := startSMG(ctx, dir, stack, c.Policy)
		res.RouterArgv = argv
		if serr != nil {
			return res, serr
		}
		fmt.Fprintf(cfg.Log, "  smg: %s\n", strings.Join(argv, " "))
		defer func() {
			// SMG drains in-flight requests on SIGTERM; none are left.
			if serr := proc.Stop(2 * time.Second); serr != nil && err == nil {
				err = fmt.Errorf("stop smg: %w", serr)
			}
		}()
		base = smgURL
		logs = func() string {
			return stack.Logs() + fmt.Sprintf("----- %s (%s)\n%s\n", proc.Name, proc.LogPath, proc.Tail(3000))
		}
	}
	var decodeURLs []string
	for _, sim := range stack.Decode {
		decodeURLs = append(decodeURLs, sim.URL)
	}
	radix, err := decodeRadixCache(ctx, decodeURLs)
	if err != nil {
		return res, err
	}

	client := NewHTTPClient()
	defer client.CloseIdleConnections()
	url := base + "/v1/chat/completions"
	if err := warmUp(ctx, cfg, client, url, c.Policy.Router == "", logs); err != nil {
		return res, err
	}

	engines := stackEngines(stack)
	sampler := NewSampler(engines, cfg.wall(cfg.SampleInterval), cfg.Scale)
	res.Labels = map[string][]string{RolePrefill: sampler.Labels(RolePrefill), RoleDecode: sampler.Labels(RoleDecode)}

	t0 := time.Now()
	cutoff := t0.Add(cfg.wall(w.Window + cfg.drain(w)))
	runCtx, cancel := context.WithDeadline(ctx, cutoff)
	defer cancel()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		sampler.Run(sampleCtx, t0)
	}()

	res.Window = Window{From: cfg.warmup(w), To: w.Window}
	var prefillURLs []string
	for _, sim := range stack.Prefill {
		prefillURLs = append(prefillURLs, sim.URL)
	}
	before := readCountersAt(runCtx, prefillURLs, t0.Add(cfg.wall(res.Window.From)))
	after := readCountersAt(runCtx, prefillURLs, t0.Add(cfg.wall(res.Window.To)))
	var cpuBefore, cpuAfter <-chan time.Duration
	if c.Policy.Router == "" {
		cpuBefore = readCPUAt(runCtx, stack.Duet, t0.Add(cfg.wall(res.Window.From)))
		cpuAfter = readCPUAt(runCtx, stack.Duet, t0.Add(cfg.wall(res.Window.To)))
	}
	stagesBefore := readStagesAt(runCtx, engines, t0.Add(cfg.wall(res.Window.From)))
	var decodeBefore, decodeAfter <-chan *CounterDelta
	if radix {
		decodeBefore = readCountersAt(runCtx, decodeURLs, t0.Add(cfg.wall(res.Window.From)))
		decodeAfter = readCountersAt(runCtx, decodeURLs, t0.Add(cfg.wall(res.Window.To)))
	}

	results := replay(runCtx, cfg, client, url, w, t0)
	end := minTime(time.Now(), cutoff)
	stopSampling()
	sampling.Wait()
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	counters := counterDelta(before, after)
	// The stages are read once the replay ended, so that the requests of
	// the window's end count too.
	res.Summary.Stages = stageLatencies(<-stagesBefore, readStages(ctx, engines))

	res.Polls = sampler.Polls()
	res.Summary.Summarize(results, res.Polls, counters, res.Window, t0, end, cfg.Scale)
	res.Summary.SummarizeClasses(results, res.Window, end, cfg.Scale, cfg.SLO)
	if c.Policy.Router == "" {
		res.Summary.Duet = readDuetStats(ctx, stack, cfg.wall(res.Window.To-res.Window.From), cpuBefore, cpuAfter)
	}
	decodeHit := ""
	if radix {
		res.Decode = &DecodeCache{Workload: w.Name, Rate: w.Rate, Policy: c.Policy.Name,
			GaugeHitRate:    ActiveHitRate(res.Polls, RoleDecode, res.Window.From, res.Window.To),
			ReportedHitRate: hitRatio(counterDelta(decodeBefore, decodeAfter))}
		decodeHit = fmt.Sprintf("  decode hit %s (reported %s)", formatHit(res.Decode.GaugeHitRate), formatHit(res.Decode.ReportedHitRate))
	}
	fmt.Fprintf(cfg.Log, "  %-9s %6.2f/s %-14s %4d req  ttft mean %7.0f p99 %7.0f ms  tpot %5.1f ms  imb P %.2f D %.2f  hit %s%s  err %d unf %d  (%.1fs)\n",
		w.Name, w.Rate, c.Policy.Name, res.Summary.Requests, res.Summary.TTFTms.Mean, res.Summary.TTFTms.P99,
		res.Summary.TPOTms.Mean, res.Summary.ImbalancePrefill, res.Summary.ImbalanceDecode,
		formatHit(res.Summary.HitRate), decodeHit, res.Summary.Errors, res.Summary.Unfinished, time.Since(begin).Seconds())
	if d := res.Summary.Duet; d != nil {
		fmt.Fprintf(cfg.Log, "    duet: %s\n", d.line(res.Summary.Requests))
	}
	if len(res.Summary.Stages) > 0 {
		fmt.Fprintf(cfg.Log, "    stages: %s\n", stagesLine(res.Summary.Stages))
	}
	for _, cl := range res.Summary.Classes {
		fmt.Fprintf(cfg.Log, "    %s\n", cl.line())
	}
	if res.Summary.FirstError != "" {
		fmt.Fprintf(cfg.Log, "    first error: %s\n", oneLine(res.Summary.FirstError))
	}
	return res, nil
}

// counterDelta waits for the counters read before and after a window and
// returns their difference; nil when either read yielded nothing.
func counterDelta(before, after <-chan *CounterDelta) *CounterDelta {
	b, a := <-before, <-after
	if b == nil || a == nil {
		return nil
	}
	d := a.Sub(*b)
	return &d
}

// readCountersAt reads the prefix-cache counters of urls at wall time at;
// the channel yields nil when the engines have none or ctx ended first.
func readCountersAt(ctx context.Context, urls []string, at time.Time) <-chan *CounterDelta {
	return readAt(ctx, at, nil, func() *CounterDelta {
		c, ok, err := ReadCounters(ctx, &http.Client{Timeout: time.Second}, urls)
		if !ok || err != nil {
			return nil
		}
		return &c
	})
}

// readAt yields read's result at wall time at, or zero when ctx ended
// first: the window's ends are read while the replay runs.
func readAt[T any](ctx context.Context, at time.Time, zero T, read func() T) <-chan T {
	ch := make(chan T, 1)
	go func() {
		if !sleepUntil(ctx, at) {
			ch <- zero
			return
		}
		ch <- read()
	}()
	return ch
}

// drain returns the model time requests may run after the window.
func (c Config) drain(w Workload) time.Duration {
	if c.Drain > 0 {
		return c.Drain
	}
	return w.Window
}

// warmup returns the excluded start of the window.
func (c Config) warmup(w Workload) time.Duration {
	if c.Warmup > 0 {
		return min(c.Warmup, w.Window)
	}
	return w.Window / 10
}

// caseDir creates a fresh log directory for a case under base (a new
// temporary directory when base is empty).
func caseDir(base, name string) (string, error) {
	if base == "" {
		return os.MkdirTemp("", "duet-bench-")
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(base, name+"-")
}

// stackOptions returns the harness options of a case: Envoy + duet under
// p, or the engines alone when another router (p.Router) takes their
// place; the prefill engines run with p's environment (PrefillSimEnv).
func (c Config) stackOptions(p Policy, dir string) harness.Options {
	prefill := harness.SimSpec{DPSize: c.DPSize, Args: slices.Concat(c.SimArgs, c.PrefillSimArgs), Env: p.PrefillSimEnv()}
	decode := harness.SimSpec{DPSize: c.DPSize, Args: slices.Concat(c.SimArgs, c.DecodeSimArgs)}
	opts := harness.Options{
		EnginesOnly:      p.Router != "",
		KVTimeout:        c.KVTimeout,
		DecodeMsPerToken: c.DecodeMsPerToken,
		LogLevel:         "warn",
		PrefillPolicy:    p.Prefill,
		DecodePolicy:     p.Decode,
		EngineRanks:      p.EngineRanks,
		LoadInterval:     max(c.wall(c.LoadInterval), 10*time.Millisecond),
		// duet's default 100ms covering delay is wall time; keep it 100ms of
		// model time, like every other duration here.
		CoverDelay:   max(c.wall(100*time.Millisecond), time.Millisecond),
		Dir:          dir,
		DuetYAML:     p.DuetYAML,
		KVEvents:     c.KVEvents,
		SimTokenizer: c.SimTokenizer,
	}
	for range c.PrefillEngines {
		opts.Prefill = append(opts.Prefill, prefill)
	}
	for range c.DecodeEngines {
		opts.Decode = append(opts.Decode, decode)
	}
	return opts
}

// stackEngines lists the engines of a stack for the sampler.
func stackEngines(s *harness.Stack) []Engine {
	var out []Engine
	for _, sim := range s.Prefill {
		out = append(out, Engine{Role: RolePrefill, Name: sim.Name, URL: sim.URL, DPSize: sim.DPSize})
	}
	for _, sim := range s.Decode {
		out = append(out, Engine{Role: RoleDecode, Name: sim.Name, URL: sim.URL, DPSize: sim.DPSize})
	}
	return out
}

// warmUp waits for duet's first load scrapes, then sends one tiny request
// per decode rank to url (Envoy, or the router in its place). Through
// duet (strict) each must succeed; through another router failures are
// only logged: they recur in the measured run, which counts them. logs
// returns the processes' logs for an error.
func warmUp(ctx context.Context, cfg Config, client *http.Client, url string, strict bool, logs func() string) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2*cfg.wall(cfg.LoadInterval) + 100*time.Millisecond):
	}
	n := cfg.DecodeEngines * cfg.DPSize
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := Send(ctx, client, url, ChatRequest{Model: cfg.Model, MaxTokens: 2, Stream: true,
				Messages: []Message{{Role: "user", Content: fmt.Sprintf("warm up %d", i)}}})
			if !o.OK() {
				errs[i] = fmt.Errorf("warm-up request %d: %s", i, o.Err)
			}
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		return nil
	}
	if strict {
		return fmt.Errorf("%w\n%s", err, logs())
	}
	failed := 0
	for _, e := range errs {
		if e != nil {
			failed++
		}
	}
	fmt.Fprintf(cfg.Log, "  warm-up: %d of %d requests failed, the first: %s\n", failed, n, oneLine(err.Error()))
	return nil
}

// replay runs every session of w against url from t0 until ctx ends and
// returns one Result per request sent (or refused by the in-flight bound).
func replay(ctx context.Context, cfg Config, client *http.Client, url string, w Workload, t0 time.Time) []Result {
	var (
		mu      sync.Mutex
		results []Result
		wg      sync.WaitGroup
	)
	slots := make(chan struct{}, cfg.MaxInFlight)
	record := func(r Result) {
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
	}
	windowEnd := t0.Add(cfg.wall(w.Window))
	for _, s := range w.Sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepUntil(ctx, t0.Add(cfg.wall(s.Start))) {
				return
			}
			var history []Message
			if s.System != "" {
				history = append(history, Message{Role: "system", Content: s.System})
			}
			for k, turn := range s.Turns {
				now := time.Now()
				if now.After(windowEnd) || ctx.Err() != nil {
					return
				}
				msgs := append(history, Message{Role: "user", Content: turn.User})
				r := Result{Session: s.ID, Turn: k, Offset: time.Duration(float64(now.Sub(t0)) * cfg.Scale), Class: s.Class, Tenant: s.Tenant}
				select {
				case slots <- struct{}{}:
				default:
					r.Outcome = Outcome{Sent: now, Err: "client overloaded: in-flight limit reached"}
					record(r)
					return
				}
				r.Outcome = Send(ctx, client, url, ChatRequest{Model: cfg.Model, Messages: msgs, MaxTokens: turn.OutputTokens, Stream: s.Stream, Seed: turn.Seed,
					Class: s.Class, Tenant: s.Tenant})
				<-slots
				record(r)
				if !r.Outcome.OK() {
					return // a failed or refused turn ends its conversation
				}
				history = append(msgs[:len(msgs):len(msgs)], Message{Role: "assistant", Content: turn.Assistant})
				if !sleepUntil(ctx, time.Now().Add(cfg.wall(turn.Think))) {
					return
				}
			}
		}()
	}
	wg.Wait()
	return results
}

// sleepUntil waits until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// SimFeatures are the optional duet-sim flags a binary supports.
type SimFeatures struct {
	Profile, TimeScale, Seed, StreamInterval, MaxRecords bool
	// KVEvents and Tokenizer are --kv-events-config and --tokenizer-path.
	KVEvents, Tokenizer bool
}

// DetectSim reads `duet-sim -h` to learn which optional flags it has.
func DetectSim(simPath string) (SimFeatures, error) {
	var out bytes.Buffer
	cmd := exec.Command(simPath, "-h")
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // -h exits 0 or 2 depending on the flag package's mode
	help := out.String()
	if !strings.Contains(help, "-dp-size") {
		return SimFeatures{}, fmt.Errorf("%s -h: unexpected output:\n%s", simPath, help)
	}
	has := func(flag string) bool {
		return strings.Contains(help, "-"+flag+" ") || strings.Contains(help, "-"+flag+"\n")
	}
	return SimFeatures{
		Profile:        has("profile"),
		TimeScale:      has("time-scale"),
		Seed:           has("seed"),
		StreamInterval: has("stream-interval"),
		MaxRecords:     has("max-records"),
		KVEvents:       has("kv-events-config"),
		Tokenizer:      has("tokenizer-path"),
	}, nil
}

// SimPath returns the duet-sim binary the harness uses.
func SimPath() (string, error) {
	t, err := harness.FindTools()
	if err != nil {
		return "", err
	}
	return filepath.Clean(t.Sim), nil
}

// formatHit renders a hit rate for progress lines.
func formatHit(h float64) string {
	if h < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", h*100)
}
