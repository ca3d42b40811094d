// Command duet-sim runs a simulated SGLang server (prefill, decode or
// aggregated) for duet's end-to-end tests and benchmarks. Without --profile
// it uses the simple latency model (--prefill-ms-per-1k-tokens,
// --decode-ms-per-token); --profile dense-8b-h100 or dsv3-dp8-h100-node
// switches to the calibrated engine model, --time-scale F runs model time F
// times faster than wall time, --flavor vllm imitates vLLM and the
// --fault-* flags inject faults (--fault-hang, --fault-loads,
// --fault-error-rate, --fault-die-after, --fault-slow-scrape-ms and the
// spikes). A decode given --disaggregation-decode-enable-radix-cache
// caches finished requests and asks its prefill for the KV beyond its
// match only; --enable-hierarchical-cache (--hicache-ratio,
// --hicache-load-gbps) adds its host tier, and
// --sim-double-count-cached-tokens reproduces SGLang issue #25972.
// --kv-events-config publishes the engine model's prefix cache changes as
// SGLang's KV events over ZMQ (a PUB socket and a replay ROUTER per DP
// rank); it needs --profile (refused without), and --tokenizer-path keys
// text prompts by the token ids duet computes, so that their events carry
// token ids too (without it only token-id prompts are published, and a
// warning says so at start).
// --enable-priority-scheduling (with --schedule-low-priority-values-first)
// orders the engine model's waiting queues by the requests' priority
// field, and --abort-on-priority-when-disabled aborts requests that carry
// one when it is off, as SGLang does.
//
// Besides SGLang's routes (/generate, /v1/chat/completions,
// /v1/completions, /v1/responses, /abort_request, /health,
// /health_generate, /server_info, /v1/loads, /metrics, /flush_cache) it
// serves a test-inspection API: GET/DELETE /sim/requests (the request
// records), GET/POST /sim/faults (the faults in force; POST changes them
// at runtime, and takes the reset_cache and kv_events_down_ms actions),
// GET /sim/stats (abort counters and the rids in flight) and GET
// /sim/kv_events (the KV event publisher's counters); a prefill's
// bootstrap server also takes POST /sim/kv_prefix (a decode's cached
// prefix of a room).
// See package github.com/duet-router/duet/e2e/sim and its MODEL.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/duet-router/duet/e2e/sim"
)

// shutdownGrace is how long requests in flight may finish after a signal.
const shutdownGrace = 5 * time.Second

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "duet-sim: %v\n", err)
		os.Exit(1)
	}
}

// options holds the parsed command line.
type options struct {
	cfg      sim.Config
	logLevel string
}

// parseFlags parses args into options.
func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("duet-sim", flag.ContinueOnError)
	var (
		o           options
		mode        string
		flavor      string
		prefillMS   float64
		decodeMS    float64
		dpAttention bool
		spikeMS     float64
		scrapeMS    float64
		loadsFault  string
	)
	fs.StringVar(&mode, "mode", string(sim.ModeNull), "disaggregation mode: prefill, decode or null (aggregated)")
	fs.StringVar(&o.cfg.Listen, "listen", sim.DefaultListen, "main HTTP API address")
	fs.IntVar(&o.cfg.DPSize, "dp-size", 1, "number of DP ranks; with --profile, the profile's value unless given")
	fs.IntVar(&o.cfg.BootstrapPort, "bootstrap-port", sim.DefaultBootstrapPort,
		"prefill: bootstrap server port (same IP as --listen); decode: port used when a request's bootstrap_port is null")
	fs.StringVar(&o.cfg.Model, "model", sim.DefaultModel, "served_model_name")
	fs.DurationVar(&o.cfg.KVTimeout, "kv-timeout", sim.DefaultKVTimeout,
		"decode: how long to wait for the prefill's KV (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)")
	fs.DurationVar(&o.cfg.BootstrapTimeout, "bootstrap-timeout", 0,
		"prefill: how long a request waits in the bootstrap queue for its decode to preallocate the KV before it fails "+
			"(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, model time; engine model, and the simple model with --await-transfer; "+
			"default: --kv-timeout)")
	fs.BoolVar(&o.cfg.AwaitTransfer, "await-transfer", false,
		"prefill: answer only once a decode has taken the KV, holding it up to --kv-timeout (SGLang's behaviour)")
	fs.Float64Var(&prefillMS, "prefill-ms-per-1k-tokens", 10, "simulated prefill time per 1000 prompt tokens, in ms (simple model; ignored with --profile)")
	fs.Float64Var(&decodeMS, "decode-ms-per-token", 2, "simulated time per generated token, in ms (simple model; ignored with --profile)")
	fs.IntVar(&o.cfg.MaxTotalTokens, "max-total-tokens", sim.DefaultMaxTotalTokens,
		"KV capacity per rank (max_total_num_tokens); with --profile, the profile's value unless given")
	fs.IntVar(&o.cfg.MaxRunningRequests, "max-running-requests", sim.DefaultMaxRunningRequests,
		"request slots per rank (max_running_requests); with --profile, the profile's value unless given")
	fs.StringVar(&o.cfg.Profile, "profile", "",
		"calibrated engine model: "+strings.Join(sim.ProfileNames(), ", ")+
			" (default: the simple model of --prefill-ms-per-1k-tokens and --decode-ms-per-token)")
	fs.BoolVar(&dpAttention, "dp-attention", false,
		"ranks step in lockstep, a step lasting as long as the slowest rank's (engine model; default: the profile's, true for dsv3-dp8-h100-node)")
	fs.Float64Var(&o.cfg.KVTransferGBps, "kv-transfer-gbps", 0,
		"PD KV transfer bandwidth in GB/s (10^9 bytes/s; engine model; default: the profile's)")
	fs.Float64Var(&o.cfg.TimeScale, "time-scale", 1,
		"model time runs this many times faster than wall time: every modelled duration is divided by it "+
			"(client-visible latencies × F = model time; network, Envoy and duet are not scaled, keep F <= 20)")
	fs.Uint64Var(&o.cfg.Seed, "seed", 0, "seed of every random choice (fault injection)")
	fs.StringVar(&flavor, "flavor", string(sim.FlavorSGLang),
		"engine imitated: sglang, or vllm (aggregated only: X-data-parallel-rank, vllm: metrics, no /v1/loads)")
	fs.Float64Var(&o.cfg.Faults.SpikeProb, "fault-spike-prob", 0, "probability that a request is delayed by --fault-spike-ms")
	fs.Float64Var(&spikeMS, "fault-spike-ms", 0, "latency spike in ms (model time)")
	fs.Float64Var(&o.cfg.Faults.ErrorRate, "fault-error-rate", 0, "probability that a request fails with HTTP 500")
	fs.IntVar(&o.cfg.Faults.DieAfter, "fault-die-after", 0,
		"crash (close the listeners, cut requests in flight, exit 1) on the inference request after the first N; 0 never")
	fs.Float64Var(&scrapeMS, "fault-slow-scrape-ms", 0, "delay of every /v1/loads and /metrics answer in ms (model time)")
	fs.BoolVar(&o.cfg.Faults.Hang, "fault-hang", false,
		"the engine's scheduler is stuck: inference requests never progress, /abort_request does nothing, /v1/loads, /metrics "+
			"and /server_info never answer, /health answers 503 after --health-timeout (switch off at runtime: POST /sim/faults)")
	fs.StringVar(&loadsFault, "fault-loads", string(sim.LoadsOK),
		"how /v1/loads and /metrics answer: ok, garbage (200 with unparsable bytes) or 500")
	fs.DurationVar(&o.cfg.HealthTimeout, "health-timeout", sim.DefaultHealthTimeout,
		"how long /health waits for its one-token generation before answering 503 (SGLANG_HEALTH_CHECK_TIMEOUT, model time)")
	fs.BoolVar(&o.cfg.LegacyServerInfo, "legacy-server-info", false, "serve only /get_server_info (404 on /server_info), like old SGLang")
	fs.IntVar(&o.cfg.StreamInterval, "stream-interval", 1, "streaming chunk every N tokens, like SGLang's --stream-interval (first token at once)")
	fs.IntVar(&o.cfg.MaxRecords, "max-records", sim.DefaultMaxRecords, "request records kept for GET /sim/requests (oldest dropped first)")
	fs.BoolVar(&o.cfg.DecodeRadixCache, "disaggregation-decode-enable-radix-cache", false,
		"decode: keep a radix cache of finished requests (prompt and answer), match new requests at preallocation and ask "+
			"the prefill for the KV beyond the match only (engine model; otherwise only reported in /server_info)")
	fs.BoolVar(&o.cfg.HierarchicalCache, "enable-hierarchical-cache", false,
		"decode with --disaggregation-decode-enable-radix-cache: keep blocks evicted from the GPU in a host tier, loaded back on a hit")
	fs.Float64Var(&o.cfg.HiCacheRatio, "hicache-ratio", sim.DefaultHiCacheRatio, "host tier size as a multiple of the device KV pool")
	fs.Float64Var(&o.cfg.HiCacheLoadGBps, "hicache-load-gbps", sim.DefaultHiCacheLoadGBps,
		"host-to-device load-back bandwidth of the host tier in GB/s (10^9 bytes/s)")
	fs.BoolVar(&o.cfg.DoubleCountCachedTokens, "sim-double-count-cached-tokens", false,
		"decode with the radix cache: report cached_tokens as the prefill's hit plus the decode's match (SGLang issue #25972) "+
			"instead of the larger of the two")
	fs.StringVar(&o.cfg.Tokenizer, "tokenizer-path", "",
		"tokenizer directory (tokenizer.json, tokenizer_config.json): text prompts are keyed by the token ids duet computes "+
			"(engine model), so their KV events carry token ids")
	fs.StringVar(&o.cfg.KVEventsConfig, "kv-events-config", "",
		`SGLang's KV event publisher config, JSON: {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", `+
			`"topic": "", "buffer_steps": 10000}; each DP rank publishes its prefix cache's events on the ports plus its rank. `+
			`Needs --profile (the engine model's cache is what is published; refused without it); text prompts are published `+
			`only with --tokenizer-path, token-id ones (/generate input_ids) always`)
	fs.BoolVar(&o.cfg.EnablePriorityScheduling, "enable-priority-scheduling", false,
		"SGLang's priority scheduling: the body's priority field orders the engine model's waiting queues (larger values first; "+
			"a request without one goes last, FIFO among equals; no preemption of running requests)")
	fs.BoolVar(&o.cfg.ScheduleLowPriorityValuesFirst, "schedule-low-priority-values-first", false,
		"with --enable-priority-scheduling: smaller priority values start first")
	fs.BoolVar(&o.cfg.AbortOnPriorityWhenDisabled, "abort-on-priority-when-disabled", false,
		"without --enable-priority-scheduling: abort a request that carries a priority with SGLang's 503 instead of ignoring the field")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	m, err := sim.ParseMode(mode)
	if err != nil {
		return o, err
	}
	if o.cfg.Flavor, err = sim.ParseFlavor(flavor); err != nil {
		return o, err
	}
	if o.cfg.Faults.Loads, err = sim.ParseLoadsFault(loadsFault); err != nil {
		return o, err
	}
	if prefillMS < 0 || decodeMS < 0 || spikeMS < 0 || scrapeMS < 0 {
		return o, errors.New("latency flags must not be negative")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.cfg.Profile != "" {
		// Zero takes the profile's value.
		for name, v := range map[string]*int{
			"dp-size": &o.cfg.DPSize, "max-total-tokens": &o.cfg.MaxTotalTokens, "max-running-requests": &o.cfg.MaxRunningRequests,
		} {
			if !set[name] {
				*v = 0
			}
		}
	}
	if set["dp-attention"] {
		o.cfg.DPAttention = &dpAttention
	}
	o.cfg.Faults.Spike = time.Duration(spikeMS * float64(time.Millisecond))
	o.cfg.Faults.SlowScrape = time.Duration(scrapeMS * float64(time.Millisecond))
	o.cfg.Mode = m
	o.cfg.ForceQueryPrefillDPRank = envTrue(os.Getenv("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK"))
	o.cfg.PrefillPer1KTokens = time.Duration(prefillMS * float64(time.Millisecond))
	o.cfg.DecodePerToken = time.Duration(decodeMS * float64(time.Millisecond))
	return o, nil
}

// newLogger builds a production zap logger at level.
func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("invalid --log-level: %w", err)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(lvl)
	log, err := zc.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return log, nil
}

// run starts the simulator and blocks until SIGINT/SIGTERM.
func run(args []string) error {
	o, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log, err := newLogger(o.logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv, err := sim.New(o.cfg, log)
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-srv.Errors():
		_ = srv.Close()
		return err
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// envTrue reports whether an environment variable's value means true, as
// SGLang reads its boolean variables ("1", "true", "yes", any case).
func envTrue(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes":
		return true
	}
	return false
}
