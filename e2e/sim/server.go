package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/duet-router/duet/extproc/tokenize"
)

// Server is one simulated SGLang server (one HTTP API, DPSize ranks, and
// on prefill a bootstrap server).
type Server struct {
	cfg     Config
	log     *zap.Logger
	load    *loadTracker
	rooms   *roomStore
	kv      *kvClient
	records *recordStore
	rr      atomic.Uint64 // round-robin counter
	totals  tokenTotals   // SGLang's tokenizer-level token counters
	// stageHist is sglang:per_stage_req_latency_seconds (observed by the
	// engine model only).
	stageHist *stageHistogram
	started   time.Time
	clk       clock
	faults    *faultState
	// faultsMu serializes UpdateFaults.
	faultsMu sync.Mutex
	// inflight holds the items in flight by rid.
	inflight *inflightSet
	// prefixes routes the decodes' transfer metadata (bootstrap and
	// decode_prefix_len) to prefill items (prefill only).
	prefixes *prefixBoard
	// bootstrapFailed counts, per rank, the prefill items that failed in
	// the bootstrap queue (sglang:num_bootstrap_failed_reqs_total).
	bootstrapFailed []atomic.Int64
	// draining is set once Shutdown (or Close) started.
	draining atomic.Bool
	// deadCtx is cancelled by a simulated crash.
	deadCtx context.Context
	kill    context.CancelFunc
	// prof and eng are set with a profile (the engine model).
	prof *Profile
	eng  *engineLoop
	// kvpub publishes the KV events (nil without a "zmq" publisher).
	kvpub *kvPublisher
	// tok keys text prompts by token ids (Config.Tokenizer; nil without).
	tok *tokenize.Model

	handler   http.Handler
	bootstrap http.Handler

	serverName atomic.Value // string: X-Sim-Server

	mu         sync.Mutex
	apiSrv     *http.Server
	bootSrv    *http.Server
	apiAddr    net.Addr
	bootAddr   net.Addr
	cancelBase context.CancelFunc
	serveErrs  chan error
}

// New validates cfg, fills defaults and builds a server. It does not
// listen; use Handler and BootstrapHandler with your own listeners (e.g.
// httptest), or Start.
func New(cfg Config, log *zap.Logger) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sim config: %w", err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{
		cfg:             cfg,
		log:             log.With(zap.String("mode", string(cfg.Mode)), zap.String("listen", cfg.Listen)),
		load:            newLoadTracker(cfg.DPSize),
		rooms:           newRoomStore(),
		kv:              newKVClient(cfg.KVPollInterval),
		records:         newRecordStore(cfg.MaxRecords),
		inflight:        newInflightSet(),
		prefixes:        newPrefixBoard(),
		started:         time.Now(),
		bootstrapFailed: make([]atomic.Int64, cfg.DPSize),
		clk:             newScaledClock(cfg.TimeScale),
	}
	s.stageHist = newStageHistogram(cfg)
	s.deadCtx, s.kill = context.WithCancel(context.Background())
	s.faults = newFaultState(cfg.Faults, cfg.Seed, s.crash)
	s.serverName.Store(cfg.Listen)
	handler, err := s.apiHandler()
	if err != nil {
		return nil, fmt.Errorf("sim handler: %w", err)
	}
	if cfg.Tokenizer != "" {
		tok, err := loadTokenizer(cfg.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("sim config: %w", err)
		}
		s.tok = tok
	}
	if set, ok, _ := ParseKVEventsConfig(cfg.KVEventsConfig, false); ok && set.Publishes() {
		s.kvpub = newKVPublisher(set, cfg.DPSize, s.log)
		if cfg.Tokenizer == "" {
			s.kvpub.warnWithoutTokenizer()
		}
	}
	if cfg.Profile != "" {
		p := modelParams(cfg)
		s.prof = &p.prof
		s.eng = newEngineLoop(p, s.clk)
		if s.kvpub != nil {
			s.eng.setSink(s.kvpub.publish)
		}
		s.eng.setStageSink(s.stageHist.observe)
	}
	s.handler = handler
	if cfg.Mode == ModePrefill {
		s.bootstrap = s.bootstrapHandler()
	}
	return s, nil
}

// bootstrapFailures is how many prefill items of rank failed in the
// bootstrap queue so far.
func (s *Server) bootstrapFailures(rank int) int64 {
	if rank < 0 || rank >= len(s.bootstrapFailed) {
		return 0
	}
	return s.bootstrapFailed[rank].Load()
}

// Config returns the effective (defaulted) configuration.
func (s *Server) Config() Config { return s.cfg }

// Handler returns the main HTTP API.
func (s *Server) Handler() http.Handler { return s.handler }

// BootstrapHandler returns the prefill bootstrap server's handler, or nil
// when the server is not a prefill.
func (s *Server) BootstrapHandler() http.Handler { return s.bootstrap }

// Stats returns the abort counters and the items in flight (GET
// /sim/stats).
func (s *Server) Stats() Stats { return s.inflight.stats() }

// Records returns the requests recorded so far, oldest first.
func (s *Server) Records() []Record { return s.records.list() }

// ClearRecords forgets the recorded requests.
func (s *Server) ClearRecords() { s.records.clear() }

// SetServerName overrides the X-Sim-Server value (by default the listen
// address; Start sets it to the bound address).
func (s *Server) SetServerName(name string) { s.serverName.Store(name) }

// name returns the X-Sim-Server value.
func (s *Server) name() string { return s.serverName.Load().(string) }

// Start listens on the configured addresses and serves in the background
// until Shutdown or Close. With port 0 in Listen (or BootstrapPort 0 on a
// prefill) a free port is chosen; see Addr and BootstrapAddr.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apiSrv != nil {
		return errors.New("sim: already started")
	}
	if s.kvpub != nil {
		if err := s.kvpub.start(); err != nil {
			return fmt.Errorf("start the KV event publisher: %w", err)
		}
	}
	var lc net.ListenConfig
	apiLn, err := lc.Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		s.pauseKVEvents()
		return fmt.Errorf("listen on %s: %w", s.cfg.Listen, err)
	}
	var bootLn net.Listener
	if s.cfg.Mode == ModePrefill {
		host, _, _ := net.SplitHostPort(s.cfg.Listen)
		addr := net.JoinHostPort(host, strconv.Itoa(s.cfg.BootstrapPort))
		bootLn, err = lc.Listen(ctx, "tcp", addr)
		if err != nil {
			_ = apiLn.Close()
			s.pauseKVEvents()
			return fmt.Errorf("listen on bootstrap address %s: %w", addr, err)
		}
		if p := bootLn.Addr().(*net.TCPAddr).Port; s.cfg.BootstrapPort == 0 {
			// Report the bound port in /server_info and /route users.
			s.cfg.BootstrapPort = p
		}
	}
	baseCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancelBase = cancel
	s.apiAddr = apiLn.Addr()
	s.serverName.Store(s.apiAddr.String())
	s.serveErrs = make(chan error, 2)
	s.apiSrv = s.newHTTPServer(baseCtx, s.handler)
	go s.serve(s.apiSrv, apiLn)
	if bootLn != nil {
		s.bootAddr = bootLn.Addr()
		s.bootSrv = s.newHTTPServer(baseCtx, s.bootstrap)
		go s.serve(s.bootSrv, bootLn)
	}
	s.log.Info("duet-sim serving",
		zap.Stringer("addr", s.apiAddr),
		zap.Int("dp_size", s.cfg.DPSize),
		zap.Int("bootstrap_port", s.cfg.BootstrapPort),
		zap.String("flavor", string(s.cfg.Flavor)),
		zap.String("profile", s.cfg.Profile),
		zap.Bool("dp_attention", *s.cfg.DPAttention),
		zap.Float64("time_scale", s.cfg.TimeScale))
	return nil
}

// newHTTPServer returns an http.Server whose request contexts derive from
// base, so Close aborts requests in flight.
func (s *Server) newHTTPServer(base context.Context, h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          zap.NewStdLog(s.log),
	}
}

// serve runs srv on ln and reports an unexpected exit.
func (s *Server) serve(srv *http.Server, ln net.Listener) {
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error("http server stopped", zap.Error(err))
		s.serveErrs <- fmt.Errorf("serve %s: %w", ln.Addr(), err)
	}
}

// Errors delivers unexpected serving errors after Start.
func (s *Server) Errors() <-chan error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serveErrs
}

// Addr is the bound main API address after Start, else nil.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apiAddr
}

// BootstrapAddr is the bound bootstrap address after Start on a prefill,
// else nil.
func (s *Server) BootstrapAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bootAddr
}

// Shutdown stops accepting connections and waits for requests in flight
// until ctx is done; then it aborts the remaining ones. From its start
// /health answers 503, as SGLang's does while it exits gracefully.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.mu.Lock()
	srvs := []*http.Server{s.apiSrv, s.bootSrv}
	cancel := s.cancelBase
	s.mu.Unlock()
	var errs []error
	for _, srv := range srvs {
		if srv == nil {
			continue
		}
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown: %w", err))
		}
	}
	if cancel != nil {
		cancel()
	}
	s.kv.http.CloseIdleConnections()
	for _, srv := range srvs {
		if srv != nil {
			_ = srv.Close()
		}
	}
	if s.eng != nil {
		s.eng.stop()
	}
	s.stopKVEvents()
	return errors.Join(errs...)
}

// pauseKVEvents closes the KV event publisher's sockets (Start failed).
func (s *Server) pauseKVEvents() {
	if s.kvpub != nil {
		s.kvpub.stop()
	}
}

// stopKVEvents closes the KV event publisher for good.
func (s *Server) stopKVEvents() {
	if s.kvpub != nil {
		s.kvpub.shutdown()
	}
}

// Close aborts requests in flight and closes the listeners.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Shutdown(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// snapshot returns the live per-rank load of whichever model runs.
// Throughput is per model second.
func (s *Server) snapshot() []rankSnapshot {
	if s.eng != nil {
		return s.eng.snapshot()
	}
	snaps := s.load.snapshot()
	if s.cfg.TimeScale != 1 {
		for i := range snaps {
			snaps[i].genThroughput /= s.cfg.TimeScale
		}
	}
	return snaps
}

// zapRecord returns log fields for a finished request.
func zapRecord(r *Record) []zap.Field {
	f := []zap.Field{
		zap.String("path", r.Path),
		zap.Int("status", r.Status),
		zap.Float64("duration_ms", r.DurationMS),
		zap.Ints("dp_ranks", r.DPRanks),
	}
	if r.PrefillDPRank != nil {
		f = append(f, zap.Int("prefill_dp_rank", *r.PrefillDPRank))
	}
	if r.Error != "" {
		f = append(f, zap.String("error", r.Error))
	}
	if r.TraceParent != "" {
		f = append(f, zap.String("traceparent", r.TraceParent))
	}
	return f
}
