package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/duet-router/duet/cmd/duet/internal/auth"
	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/cmd/duet/internal/replicas"
	"github.com/duet-router/duet/cmd/duet/internal/status"
	"github.com/duet-router/duet/cmd/duet/internal/tracing"
	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/legs"
	"github.com/duet-router/duet/extproc/legtrace"
	"github.com/duet-router/duet/extproc/routed"
	"github.com/duet-router/duet/scheduler"
)

// shutdownGrace bounds how long in-flight streams may finish after SIGTERM.
const shutdownGrace = 10 * time.Second

// admissionCloseMargin is how long before shutdownGrace ends duet refuses
// the requests its admission queues still hold, so that their answers
// reach Envoy before the streams are cut.
const admissionCloseMargin = time.Second

// maxOrphans bounds the access-log entries a replica keeps while their
// request's route has not arrived from its peers (routed.Options.Orphans).
const maxOrphans = 1 << 16

// abortTimeout bounds one POST /abort_request to an engine.
const abortTimeout = 2 * time.Second

// tracingFlush bounds how long duet waits, when it stops, for the
// collector to take the spans still queued.
const tracingFlush = 5 * time.Second

// serve runs duet with cfg, read from the file at path, until ctx is
// cancelled. On SIGHUP it reads the file again and applies its endpoint
// lists (see reloader).
func serve(ctx context.Context, cfg *config.Config, path string) error {
	// Before anything else: SIGHUP's default action ends the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	log, err := newLogger(cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tracer, stopTracing, err := startTracing(ctx, cfg.OTLP, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	tracker := legs.New(legs.Options{
		Aborter:    &legs.HTTPAborter{Timeout: abortTimeout},
		Logger:     log.Named("legs"),
		Registerer: reg,
	})
	var scfg scheduler.Config // what every pool's scheduler shares
	// The replicas' link (sync) starts after the scheduler it applies to;
	// picks made before it is up are not shared.
	var peers atomic.Pointer[replicas.Replicas]
	if cfg.Sync != nil {
		scfg.OnPicked = func(p scheduler.Picked) {
			if r := peers.Load(); r != nil {
				r.Picked(p)
			}
		}
	}
	scfg.OnEject = func(e scheduler.Ejection) {
		if abortsPartners(e.Role, e.Reason) {
			tracker.Ejected(ctx, e.Role, e.URL, e.Rank)
		}
	}
	pools, err := newPools(cfg, scfg, log.Named("scheduler"), reg)
	if err != nil {
		return err
	}
	runDiscovery, err := newDiscovery(cfg, pools.setters(), osEnv, log.Named("kubernetes"), reg)
	if err != nil {
		return err
	}
	bookOpts := routed.Options{Logger: log.Named("feedback"), Registerer: reg}
	if cfg.Sync != nil {
		// Among replicas an entry can come before its request's route.
		bookOpts.Orphans = maxOrphans
	}
	book := routed.New(bookOpts)
	// What the scheduler and the legs tracker learn from believed feedback.
	apply := fanout{tracker, pools}
	var routes extproc.RouteRecorder = book
	// Believed entries of traced requests get their leg's span.
	var feedbackSink accesslog.Sink = book.Gate(legtrace.New(tracer, apply))
	if cfg.Sync != nil {
		r, err := startReplicas(cfg.Sync, replicaApplier{pools: pools, book: book, apply: apply}, log.Named("replicas"), reg)
		if err != nil {
			return err
		}
		defer r.Close()
		peers.Store(r)
		pools.shareQueues(r)
		// Every route and every entry Envoy sends is shared; each replica
		// checks the entries against its own record of routes.
		routes = recorders{book, r}
		feedbackSink = fanout{feedbackSink, r}
	}
	proc, err := extproc.NewServer(extproc.Options{
		Routes:       routes,
		Pools:        pools.extproc(),
		MaxBodyBytes: cfg.Request.MaxBodyBytes,
		Logger:       log.Named("extproc"),
		Metrics:      extproc.NewMetrics(reg),
		Legs:         tracker,
		Tracer:       tracer,
		// For Envoys whose streams do not say theirs (a bootstrap duet
		// did not render).
		MessageTimeout: cfg.Envoy.MessageTimeout,
	})
	if err != nil {
		return err
	}

	grpcLis, err := net.Listen("tcp", cfg.Listen.GRPC)
	if err != nil {
		return fmt.Errorf("listen.grpc: %w", err)
	}
	adminLis, err := net.Listen("tcp", cfg.Listen.Admin)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("listen.admin: %w", err)
	}

	refusals := auth.NewRefusals(log.Named("auth"), reg)
	guard, err := auth.NewGuard(auth.Options{TLS: tlsFiles(cfg.Auth.TLS), TokenFile: cfg.Auth.TokenFile, Refusals: refusals})
	if err != nil {
		grpcLis.Close()
		adminLis.Close()
		return err
	}
	adminGuard, err := auth.NewAdmin(config.Loopback(cfg.Listen.Admin), cfg.Auth.AdminTokenFile, refusals)
	if err != nil {
		grpcLis.Close()
		adminLis.Close()
		return err
	}
	if guard.Mode() == "none" && !cfg.Auth.Unauthenticated {
		log.Warn("the gRPC port authenticates no caller: any process on this host can feed duet access-log entries and open ext_proc streams; set auth.tls or auth.token_file (docs/security.md)",
			zap.String("grpc", cfg.Listen.GRPC))
	}
	gs := grpc.NewServer(append(extproc.ServerOptions(cfg.Request.MaxBodyBytes), guard.ServerOptions()...)...)
	extprocv3.RegisterExternalProcessorServer(gs, proc)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	// The tracker sees each entry before the scheduler, whose health
	// accounting may eject an engine and call tracker.Ejected for it.
	// Only entries about requests duet routed, naming the hosts and ranks it
	// chose, reach either (package routed).
	feedback := registerFeedback(ctx, gs, feedbackSink, feedbackClusters(cfg), log.Named("feedback"), reg)

	var stopping atomic.Bool
	mux := adminMux(reg, pools, &stopping)
	if cfg.Listen.Pprof {
		servePprof(mux)
	}
	statusOpts := status.Options{Version: version}
	if r := peers.Load(); r != nil {
		statusOpts.Sync = func() *status.Sync { return syncStatus(r) }
	}
	status.New(pools.status(), statusOpts).Register(mux) // GET /status, /status.json
	admin := &http.Server{Handler: adminGuard.Handler(withFeedbackDebug(mux, feedback)), ReadHeaderTimeout: 5 * time.Second}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	pools.run(runCtx)
	go tracker.Run(runCtx)
	go book.Run(runCtx)
	var discovering sync.WaitGroup // joined on return: client-go's goroutines end with serve
	defer func() { cancel(); discovering.Wait() }()
	discovering.Go(func() { runDiscovery(runCtx) })
	reloads := newReloader(path, cfg, pools.setters(), log.Named("reload"), reg)
	var reloading sync.WaitGroup
	defer func() { cancel(); reloading.Wait() }()
	reloading.Go(func() {
		check := time.NewTicker(credentialCheck)
		defer check.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-hup:
				log.Info("SIGHUP: reloading the configuration and credentials", zap.String("config", path))
				reloads.reload(runCtx)
				reloadCredentials(log.Named("auth"), guard, adminGuard)
			case <-check.C:
				reloadCredentials(log.Named("auth"), guard, adminGuard)
			}
		}
	})

	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(grpcLis) }()
	go func() { errc <- admin.Serve(adminLis) }()
	// gRPC health (what Envoy's health checks of duet read) follows
	// /readyz: a replica that starts or restarts gets no stream before it
	// knows its engines.
	go followReadiness(runCtx, hs, pools, readinessPoll)
	log.Info("duet started",
		zap.String("grpc", grpcLis.Addr().String()), zap.String("admin", adminLis.Addr().String()),
		zap.Strings("pools", pools.names()),
		zap.String("version", version), zap.String("grpc_auth", guard.Mode()))

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case serveErr = <-errc:
		log.Error("server stopped", zap.Error(serveErr))
	}
	stopping.Store(true)
	hs.Shutdown()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(shutdownGrace - admissionCloseMargin):
		// Requests still queued get a clear 503 before their streams are
		// cut.
		pools.closeAdmission()
		select {
		case <-done:
		case <-time.After(admissionCloseMargin):
			gs.Stop()
		}
	}
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancelShutdown()
	if err := admin.Shutdown(shutdownCtx); err != nil {
		log.Warn("admin shutdown", zap.Error(err))
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return serveErr
	}
	return nil
}

// startTracing builds the tracer provider of the otlp section, when there
// is one, and returns its tracer and the function that flushes it (within
// tracingFlush) and shuts it down. Without the section the tracer is nil:
// nothing is traced and nothing on the request path changes.
func startTracing(ctx context.Context, cfg *config.OTLP, log *zap.Logger) (trace.Tracer, func(), error) {
	if cfg == nil {
		return nil, func() {}, nil
	}
	tp, err := tracing.New(ctx, cfg, version)
	if err != nil {
		return nil, nil, err
	}
	log.Info("tracing: duet's spans join the traces Envoy samples", zap.String("otlp_endpoint", cfg.Endpoint),
		zap.String("service_name", cfg.ServiceName), zap.Float64("envoy_sampling_percent", cfg.Sampling()))
	stop := func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlush)
		defer cancel()
		if err := tp.Shutdown(fctx); err != nil {
			log.Warn("tracing: spans not flushed", zap.String("otlp_endpoint", cfg.Endpoint), zap.Error(err))
		}
	}
	return tp.Tracer(), stop, nil
}

// tlsFiles converts the configuration's auth.tls.
func tlsFiles(t *config.AuthTLS) *auth.TLSFiles {
	if t == nil {
		return nil
	}
	return &auth.TLSFiles{CertFile: t.CertFile, KeyFile: t.KeyFile, ClientCAFile: t.ClientCAFile, ClientNames: t.ClientNames}
}

// credentialCheck is how often duet looks for changed credential files:
// Kubernetes updates a mounted Secret in place (cert-manager renewals,
// rotated tokens) without signalling the process.
const credentialCheck = 30 * time.Second

// credentialReloader is a guard whose files duet reads again on SIGHUP and
// every credentialCheck.
type credentialReloader interface {
	Reload() (changed bool, err error)
}

// reloadCredentials reads the certificates and tokens again and applies
// those that changed, so that they rotate without a restart; a file that
// fails to load leaves the previous credentials in use.
func reloadCredentials(log *zap.Logger, guards ...credentialReloader) {
	for _, g := range guards {
		changed, err := g.Reload()
		if err != nil {
			log.Error("credentials not reloaded; the previous ones stay in use", zap.Error(err))
			continue
		}
		if changed {
			log.Info("credentials reloaded: changed files are in use for new connections and streams")
		}
	}
}

// readinessPoll is how often gRPC health is brought in line with the
// scheduler's readiness.
const readinessPoll = 100 * time.Millisecond

// followReadiness sets hs to SERVING while sched is ready and NOT_SERVING
// while it is not, checking every poll until ctx ends.
func followReadiness(ctx context.Context, hs *health.Server, sched readiness, poll time.Duration) {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	last := healthpb.HealthCheckResponse_UNKNOWN
	for {
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if sched.Ready() {
			want = healthpb.HealthCheckResponse_SERVING
		}
		if want != last {
			hs.SetServingStatus("", want)
			last = want
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// readiness is what /readyz needs to know.
type readiness interface {
	Ready() bool
	// Why says why duet is not ready, naming the roles and engines it
	// waits for ("" when it is ready), and lists the engines that are
	// not scheduled, each as scheduler.Endpoint.NotReadyReason says.
	Why() (reason string, notScheduled []string)
}

func adminMux(reg *prometheus.Registry, sched readiness, stopping *atomic.Bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case stopping.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case !sched.Ready():
			// Ejections never make duet unready: a fully ejected pool
			// answers fast 503s, which is better than Envoy failing closed.
			reason, _ := sched.Why()
			if reason == "" {
				reason = "no ready endpoint"
			}
			http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
			_, excluded := sched.Why()
			for _, e := range excluded {
				fmt.Fprintln(w, "not scheduled: "+e)
			}
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// servePprof adds Go's profiling handlers (net/http/pprof) under
// /debug/pprof/ on mux.
func servePprof(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// endpointSpecs converts configured endpoints to the scheduler's specs.
func endpointSpecs(eps []config.Endpoint) []scheduler.EndpointSpec {
	out := make([]scheduler.EndpointSpec, len(eps))
	for i, ep := range eps {
		out[i] = scheduler.EndpointSpec{URL: ep.URL, BootstrapPort: ep.BootstrapPort, DPSize: ep.DPSize}
	}
	return out
}

// schedulerConfig is the configuration of pool p's scheduler: its engines
// and policies, and the settings of cfg that every pool shares.
func schedulerConfig(cfg *config.Config, p config.Pool) scheduler.Config {
	return scheduler.Config{
		Prefill:           endpointSpecs(p.Prefill),
		Decode:            endpointSpecs(p.Decode),
		EmptyPools:        p.Kubernetes != nil, // discovery fills the lists
		PD:                p.Kubernetes != nil && p.Kubernetes.Prefill != nil,
		PrefillPolicy:     policySpec(p.Policy.Prefill),
		DecodePolicy:      policySpec(p.Policy.Decode),
		DiscoveryInterval: cfg.Discovery.Interval,
		DiscoveryTimeout:  cfg.Discovery.Timeout,
		EngineRanks:       cfg.EngineRanks,
		KVEvents: scheduler.KVEvents{
			Port: cfg.KVEvents.Port, ReplayPort: cfg.KVEvents.ReplayPort, Topic: cfg.KVEvents.Topic,
		},
		Load: scheduler.LoadConfig{
			Interval:       cfg.Load.Interval,
			Timeout:        cfg.Load.Timeout,
			Concurrency:    cfg.Load.Concurrency,
			StaleAfter:     cfg.Load.StaleAfter,
			CoverDelay:     cfg.Load.CoverDelay,
			ReservationTTL: cfg.Load.ReservationTTL,
			PrefillCovered: cfg.Load.PrefillAccounting == config.PrefillCovered,
		},
		Prefix: scheduler.PrefixConfig{
			BlockBytes:         cfg.Prefix.BlockBytes,
			BlockTokens:        blockTokens(cfg, p),
			MaxBlocksPerTarget: cfg.Prefix.MaxBlocksPerTarget,
		},
		Tokens: scheduler.TokenConfig{
			CharsPerToken:    cfg.Tokens.CharsPerToken,
			DefaultMaxTokens: cfg.Tokens.DefaultMaxTokens,
		},
		Health: scheduler.HealthConfig{
			Interval:           cfg.Health.Interval,
			Timeout:            cfg.Health.Timeout,
			Path:               cfg.Health.Path,
			UnreachableToEject: cfg.Health.UnreachableToEject,
			FailuresToEject:    cfg.Health.FailuresToEject,
			ProbeFailures:      cfg.Health.ProbeFailures,
			BaseEjection:       cfg.Health.BaseEjection,
			MaxEjection:        cfg.Health.MaxEjection,
		},
	}
}

// blockTokens is pool p's token block size: with a tokenizer, a multiple
// of its engines' page size.
func blockTokens(cfg *config.Config, p config.Pool) int {
	if p.Tokenizer != nil {
		return p.Tokenizer.BlockTokens(cfg.Prefix.BlockTokens)
	}
	return cfg.Prefix.BlockTokens
}

func policySpec(p config.PolicySpec) scheduler.PolicySpec {
	return scheduler.PolicySpec{
		Name:              p.Name,
		CacheThreshold:    p.CacheThreshold,
		BalanceAbsTokens:  p.BalanceAbsTokens,
		BalanceRel:        p.BalanceRel,
		LoadFactor:        p.LoadFactor,
		Weights:           p.Weights,
		Seed:              p.Seed,
		IgnoreDecodeCache: p.IgnoreDecodeCache,
	}
}

// newLogger returns duet's JSON logger at level, with opts applied last.
// Only DPanic and above carry a stack trace: an error-level line reports
// an operational event (a rejected reload, an unreachable engine), whose
// cause is its message and error field, never a fault of duet's code.
func newLogger(level string, opts ...zap.Option) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log_level: %w", err)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil
	log, err := zc.Build(append([]zap.Option{zap.AddStacktrace(zapcore.DPanicLevel)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return log, nil
}
