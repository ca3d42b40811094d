// Command duet-sim runs a simulated SGLang server (prefill, decode or
// aggregated) for duet's end-to-end tests. See package
// github.com/duet-router/duet/e2e/sim.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
		o         options
		mode      string
		prefillMS float64
		decodeMS  float64
	)
	fs.StringVar(&mode, "mode", string(sim.ModeNull), "disaggregation mode: prefill, decode or null (aggregated)")
	fs.StringVar(&o.cfg.Listen, "listen", sim.DefaultListen, "main HTTP API address")
	fs.IntVar(&o.cfg.DPSize, "dp-size", 1, "number of DP ranks")
	fs.IntVar(&o.cfg.BootstrapPort, "bootstrap-port", sim.DefaultBootstrapPort,
		"prefill: bootstrap server port (same IP as --listen); decode: port used when a request's bootstrap_port is null")
	fs.StringVar(&o.cfg.Model, "model", sim.DefaultModel, "served_model_name")
	fs.DurationVar(&o.cfg.KVTimeout, "kv-timeout", sim.DefaultKVTimeout,
		"decode: how long to wait for the prefill's KV (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)")
	fs.Float64Var(&prefillMS, "prefill-ms-per-1k-tokens", 10, "simulated prefill time per 1000 prompt tokens, in ms")
	fs.Float64Var(&decodeMS, "decode-ms-per-token", 2, "simulated time per generated token, in ms")
	fs.IntVar(&o.cfg.MaxTotalTokens, "max-total-tokens", sim.DefaultMaxTotalTokens, "KV capacity per rank (max_total_num_tokens)")
	fs.BoolVar(&o.cfg.LegacyServerInfo, "legacy-server-info", false, "serve only /get_server_info (404 on /server_info), like old SGLang")
	fs.IntVar(&o.cfg.MaxRecords, "max-records", sim.DefaultMaxRecords, "request records kept for GET /sim/requests (oldest dropped first)")
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
	if prefillMS < 0 || decodeMS < 0 {
		return o, errors.New("latency flags must not be negative")
	}
	o.cfg.Mode = m
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
