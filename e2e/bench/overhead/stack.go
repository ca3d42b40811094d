package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/scheduler"
)

// The variants, in the order they alternate and appear in the report.
const (
	variantDirect      = "direct"
	variantFloor       = "ext_proc floor"
	variantFloorBody   = "floor + body"
	variantFloorDuplex = "floor full-duplex"
	variantExtProc     = "ext_proc only"
	variantAgg         = "duet aggregated"
	variantMTLS        = "duet mTLS"
	variantToken       = "duet token"
	variantPDTokenizer = "duet PD tokenizer"
	variantShared      = "duet shared"
	variantReplicas2   = "duet 2 replicas"
	variantReplicas3   = "duet 3 replicas"
	variantPD          = "duet PD"
	variantPDNoQueue   = "duet PD no queue"
	variantPDTraced1   = "duet PD traced 1%"
	variantPDTraced100 = "duet PD traced 100%"
	variantSMG         = "SMG aggregated"
	variantSMGPD       = "SMG PD"
)

// allVariants lists every variant.
func allVariants() []string {
	return []string{variantDirect, variantFloor, variantFloorBody, variantFloorDuplex, variantExtProc,
		variantAgg, variantMTLS, variantToken, variantShared, variantReplicas2, variantReplicas3, variantPD, variantPDNoQueue, variantPDTokenizer, variantPDTraced1, variantPDTraced100, variantSMG, variantSMGPD}
}

// floorModes maps each floor variant to its processor's mode.
var floorModes = map[string]string{
	variantFloor:       floorEmpty,
	variantFloorBody:   floorEcho,
	variantFloorDuplex: floorDuplex,
}

// authModes maps the variants that authenticate Envoy to duet to their
// mode; every other variant runs without auth (duet on loopback).
var authModes = map[string]harness.Auth{variantMTLS: harness.AuthMTLS, variantToken: harness.AuthToken}

// sharedReplicas maps the variants that run several duet replicas sharing
// state over NATS to how many extra replicas they run and whether Envoy
// lists them (else they only apply the first replica's events).
var sharedReplicas = map[string]struct {
	extra  int
	listed bool
}{variantShared: {1, false}, variantReplicas2: {1, true}, variantReplicas3: {2, true}}

// isPD reports whether a variant runs a prefill and a decode engine.
func isPD(variant string) bool {
	return variant == variantPD || variant == variantPDNoQueue || variant == variantPDTokenizer || variant == variantSMGPD ||
		tracedVariants[variant] > 0
}

// tracedVariants maps the variants that trace (duet's otlp section, into
// a Jaeger of their own) to their sampling percentage.
var tracedVariants = map[string]float64{variantPDTraced1: 1, variantPDTraced100: 100}

// tokenizerYAML is duet's tokenizer section of the tokenizer variant:
// Qwen3's files from the fixtures `make tokenizers` installs.
func tokenizerYAML() (string, error) {
	root := os.Getenv("DUET_TOKENIZERS_DIR")
	if root == "" {
		return "", fmt.Errorf("%s needs DUET_TOKENIZERS_DIR (make bench-overhead sets it)", variantPDTokenizer)
	}
	dir := filepath.Join(root, "qwen3")
	return fmt.Sprintf("tokenizer:\n  file: %s\n  config: %s\n  page_size: 16\n",
		filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json")), nil
}

// isSMG reports whether a variant is the standalone router, without Envoy.
func isSMG(variant string) bool { return variant == variantSMG || variant == variantSMGPD }

// pinning says on which CPUs the servers run.
type pinning struct {
	// serverCPU is taskset's CPU list for Envoy, duet and the sims; empty:
	// not pinned.
	serverCPU string
	// collectorCPU is taskset's CPU list for the trace backend of the
	// traced variants (the load generator's: a collector takes no server
	// CPU, as on a machine of its own); empty: not pinned.
	collectorCPU string
}

// argv prefixes argv with taskset when servers are pinned, and runs it with
// the extra environment env (e.g. GOMAXPROCS=1).
func (p pinning) argv(env []string, argv ...string) []string {
	var out []string
	if p.serverCPU != "" {
		out = append(out, "taskset", "-c", p.serverCPU)
	}
	if len(env) > 0 {
		out = append(append(out, "env"), env...)
	}
	return append(out, argv...)
}

// stack is one variant's running processes: Envoy in front of fast fake
// engines, and duet unless the variant is direct.
type stack struct {
	variant string
	// url is Envoy's listener, e.g. http://127.0.0.1:41234.
	url string
	// envoyAdmin is Envoy's admin base URL.
	envoyAdmin string
	// duetAdmin is duet's admin base URL (duet variants only).
	duetAdmin string
	procs     []*harness.Process
}

// fastSim are the duet-sim flags of a fake engine that answers at once.
func fastSim() []string {
	return []string{"--decode-ms-per-token", "0", "--prefill-ms-per-1k-tokens", "0", "--log-level", "warn"}
}

// startStack starts variant's processes in dir (a directory of its own),
// pinned as pin says, duet with the extra environment duetEnv and serving
// pprof if asked, and waits until Envoy (or SMG) is ready.
func startStack(ctx context.Context, tools harness.Tools, dir, variant string, dp int, pin pinning, pprof bool, duetEnv []string) (_ *stack, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%s: %w", variant, err)
	}
	s := &stack{variant: variant}
	defer func() {
		if err != nil {
			s.close()
			err = fmt.Errorf("%s: %w", variant, err)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	ports, err := harness.FreePorts(13)
	if err != nil {
		return nil, err
	}
	next := func() int { p := ports[0]; ports = ports[1:]; return p }
	addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }

	// duet's default policies (docs/configuration.md), as users run it; the
	// harness's own default, round_robin, reads no prefix index.
	opts := harness.Options{LogLevel: "info", LoadInterval: time.Second, Pprof: pprof, Auth: harness.AuthNone,
		PrefillPolicy: duetPrefillPolicy, DecodePolicy: duetDecodePolicy}
	spec := harness.SimSpec{DPSize: dp, Args: fastSim()}
	startSim := func(name, mode string) (string, error) {
		listen, boot := addr(next()), next()
		argv := pin.argv(nil, append([]string{tools.Sim}, harness.SimArgs(mode, spec, listen, boot, opts)...)...)
		p, err := s.start(dir, name, argv)
		if err != nil {
			return "", err
		}
		url := "http://" + listen
		return url, harness.WaitHTTP(ctx, p, url+"/health")
	}
	addrs := harness.Addresses{
		DuetGRPC: addr(next()), DuetAdmin: addr(next()),
		EnvoyListen: addr(next()), EnvoyAdmin: addr(next()),
	}
	if mode, ok := authModes[variant]; ok {
		opts.Auth = mode
		if addrs.Credentials, err = harness.MakeCredentials(ctx, tools.Duet, filepath.Join(dir, "credentials")); err != nil {
			return nil, err
		}
	}
	// The extra replicas' own gRPC and admin addresses (sharedReplicas).
	var peers []harness.Addresses
	if shared, ok := sharedReplicas[variant]; ok {
		natsURL, err := s.startNATS(ctx, dir, next(), pin)
		if err != nil {
			return nil, err
		}
		opts.DuetYAML = "sync:\n  nats:\n    url: " + natsURL + "\n"
		for range shared.extra {
			peers = append(peers, harness.Addresses{DuetGRPC: addr(next()), DuetAdmin: addr(next())})
		}
		if shared.listed {
			addrs.EnvoyDuetReplicas = []string{addrs.DuetGRPC}
			for _, p := range peers {
				addrs.EnvoyDuetReplicas = append(addrs.EnvoyDuetReplicas, p.DuetGRPC)
			}
		}
	}
	if pct, ok := tracedVariants[variant]; ok {
		j, err := harness.StartJaeger(ctx, dir, harness.JaegerOptions{Taskset: pin.collectorCPU})
		if j != nil {
			s.procs = append(s.procs, j.Process)
		}
		if err != nil {
			return nil, err
		}
		opts.DuetYAML = fmt.Sprintf("otlp:\n  endpoint: %q\n  sampling_percent: %v\n", j.OTLPAddr, pct)
	}
	if variant == variantPDTokenizer {
		if opts.DuetYAML, err = tokenizerYAML(); err != nil {
			return nil, err
		}
	}
	// Without the access logs (ext_proc only) no completion ever reaches
	// duet: its reservations would never end, and its admission queue
	// would hold every request once the engines looked saturated.
	if variant == variantPDNoQueue || variant == variantExtProc {
		opts.DuetYAML = "admission:\n  enabled: false\n"
	}
	decodeMode := "null"
	prefillBoot := 0
	if isPD(variant) {
		decodeMode = "decode"
		prefillBoot = ports[1] // startSim takes the listen port, then this one
		u, err := startSim("prefill", "prefill")
		if err != nil {
			return nil, err
		}
		addrs.Prefill = []string{u}
	}
	u, err := startSim("decode", decodeMode)
	if err != nil {
		return nil, err
	}
	addrs.Decode = []string{u}

	if isSMG(variant) {
		return s, s.startSMG(ctx, tools, dir, addrs, prefillBoot, pin)
	}
	var bootstrap []byte
	if variant == variantDirect {
		bootstrap = []byte(directBootstrap(addrs.EnvoyListen, addrs.EnvoyAdmin, addrs.Decode[0]))
	} else {
		cfg := filepath.Join(dir, "duet.yaml")
		if err := os.WriteFile(cfg, []byte(harness.DuetConfig(opts, addrs)), 0o644); err != nil {
			return nil, err
		}
		if bootstrap, err = exec.CommandContext(ctx, tools.Duet, "envoy-config", "-config", cfg).Output(); err != nil {
			return nil, fmt.Errorf("duet envoy-config: %w", err)
		}
		if mode, ok := floorModes[variant]; ok {
			// The floor processor listens where duet would: the rendered
			// bootstrap's ext_proc cluster.
			self, err := os.Executable()
			if err != nil {
				return nil, err
			}
			floor, err := s.start(dir, "floor", pin.argv([]string{"GOMAXPROCS=1"}, self, "-serve-floor", addrs.DuetGRPC, "-floor-mode", mode))
			if err != nil {
				return nil, err
			}
			if err := waitTCP(ctx, floor, addrs.DuetGRPC); err != nil {
				return nil, err
			}
		} else {
			duet, err := s.start(dir, "duet", pin.argv(append([]string{"GOMAXPROCS=1"}, duetEnv...), tools.Duet, "serve", "-config", cfg))
			if err != nil {
				return nil, err
			}
			if err := harness.WaitHTTP(ctx, duet, "http://"+addrs.DuetAdmin+"/readyz"); err != nil {
				return nil, err
			}
			s.duetAdmin = "http://" + addrs.DuetAdmin
			for i, p := range peers {
				peer := addrs
				peer.DuetGRPC, peer.DuetAdmin = p.DuetGRPC, p.DuetAdmin
				if err := s.startPeer(ctx, tools, dir, i+1, opts, peer, pin, duetEnv); err != nil {
					return nil, err
				}
			}
		}
		switch variant {
		case variantExtProc, variantFloor, variantFloorBody:
			if bootstrap, err = stripFeedback(bootstrap); err != nil {
				return nil, err
			}
		case variantFloorDuplex:
			if bootstrap, err = stripFeedback(bootstrap); err != nil {
				return nil, err
			}
			if bootstrap, err = fullDuplex(bootstrap); err != nil {
				return nil, err
			}
		}
	}
	envoyCfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(envoyCfg, bootstrap, 0o644); err != nil {
		return nil, err
	}
	// As harness.EnvoyArgs (one worker thread), logging warnings only: its
	// info log is not what is measured.
	envoyArgs := []string{tools.Envoy, "-c", envoyCfg, "--disable-hot-restart", "--concurrency", "1", "--log-level", "warn"}
	envoy, err := s.start(dir, "envoy", pin.argv(nil, envoyArgs...))
	if err != nil {
		return nil, err
	}
	s.envoyAdmin = "http://" + addrs.EnvoyAdmin
	if err := harness.WaitHTTP(ctx, envoy, s.envoyAdmin+"/ready"); err != nil {
		return nil, err
	}
	s.url = "http://" + addrs.EnvoyListen
	return s, nil
}

// duet's default policies, as users run it (least_cost on both roles since
// issue 16; reports written before name cache_aware and least_tokens).
const (
	duetPrefillPolicy = scheduler.DefaultPrefillPolicy
	duetDecodePolicy  = scheduler.DefaultDecodePolicy
)

// smgVersion is the standalone router the SMG variants run (pip package
// smg, installed into .venv by `make bench-overhead`).
const smgVersion = "1.13.0"

// startSMG starts the standalone router in front of the engines in addrs:
// one worker (aggregated) or a prefill with its bootstrap port and a
// decode (PD), with its cache-aware policies, as its users run it.
func (s *stack) startSMG(ctx context.Context, tools harness.Tools, dir string, addrs harness.Addresses, prefillBoot int, pin pinning) error {
	smg := filepath.Join(filepath.Dir(tools.Python), "smg")
	if _, err := os.Stat(smg); err != nil {
		return fmt.Errorf("the SMG variants need smg==%s in .venv (make bench-overhead installs it): %w", smgVersion, err)
	}
	ports, err := harness.FreePorts(2)
	if err != nil {
		return err
	}
	listen := "127.0.0.1:" + strconv.Itoa(ports[0])
	host, port := splitHostPort(listen)
	argv := []string{smg, "launch", "--host", host, "--port", port, "--log-level", "warn",
		"--prometheus-host", "127.0.0.1", "--prometheus-port", strconv.Itoa(ports[1])}
	if len(addrs.Prefill) > 0 {
		argv = append(argv, "--pd-disaggregation", "--prefill", addrs.Prefill[0], strconv.Itoa(prefillBoot),
			"--decode", addrs.Decode[0], "--prefill-policy", "cache_aware", "--decode-policy", "cache_aware")
	} else {
		argv = append(argv, "--worker-urls", addrs.Decode[0], "--policy", "cache_aware")
	}
	p, err := s.start(dir, "smg", pin.argv(nil, argv...))
	if err != nil {
		return err
	}
	s.url = "http://" + listen
	// /readiness answers 200 once every worker passed its health check.
	return harness.WaitHTTP(ctx, p, s.url+"/readiness")
}

// waitTCP waits until addr accepts connections, or p exits, or ctx ends.
func waitTCP(ctx context.Context, p *harness.Process, addr string) error {
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return conn.Close()
		}
		if p.Exited() {
			return fmt.Errorf("%s exited before listening on %s (log: %s)", p.Name, addr, p.LogPath)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s on %s: %w", p.Name, addr, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startNATS runs nats-server on port, pinned with the servers, and returns
// its URL.
func (s *stack) startNATS(ctx context.Context, dir string, port int, pin pinning) (string, error) {
	bin, err := harness.FindNATSServer()
	if err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := s.start(dir, "nats", pin.argv(nil, bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port)))
	if err != nil {
		return "", err
	}
	return "nats://" + addr, waitTCP(ctx, p, addr)
}

// startPeer runs duet replica number i (from 1) sharing state with the
// first through NATS: in duet shared no ext_proc stream reaches it and it
// only applies the first's events; in duet N replicas Envoy lists it too.
func (s *stack) startPeer(ctx context.Context, tools harness.Tools, dir string, i int, opts harness.Options, addrs harness.Addresses, pin pinning, duetEnv []string) error {
	cfg := filepath.Join(dir, fmt.Sprintf("duet-peer-%d.yaml", i))
	if err := os.WriteFile(cfg, []byte(harness.DuetConfig(opts, addrs)), 0o644); err != nil {
		return err
	}
	peer, err := s.start(dir, fmt.Sprintf("duet-peer-%d", i), pin.argv(append([]string{"GOMAXPROCS=1"}, duetEnv...), tools.Duet, "serve", "-config", cfg))
	if err != nil {
		return err
	}
	return harness.WaitHTTP(ctx, peer, "http://"+addrs.DuetAdmin+"/readyz")
}

// start runs argv as the process name, logging into dir.
func (s *stack) start(dir, name string, argv []string) (*harness.Process, error) {
	p, err := harness.StartProcess(dir, name, argv...)
	if err != nil {
		return nil, err
	}
	s.procs = append(s.procs, p)
	return p, nil
}

// processRoles maps the names stack.start gives its processes to their
// roles.
var processRoles = map[string]string{
	"envoy": roleProxy, "smg": roleProxy,
	"duet": roleProcessor, "floor": roleProcessor,
	// The replicas sharing state with duet (duet-peer-N count as duet),
	// and NATS.
	"nats":    roleProcessor,
	"prefill": roleEngines, "decode": roleEngines,
}

// pids lists the stack's process ids by role.
func (s *stack) pids() map[string][]int {
	out := map[string][]int{}
	for _, p := range s.procs {
		name := p.Name
		if strings.HasPrefix(name, "duet-peer-") { // a replica sharing duet's state
			name = "duet"
		}
		if role, ok := processRoles[name]; ok {
			out[role] = append(out[role], p.Pid())
		}
	}
	return out
}

// close stops every process, Envoy first.
func (s *stack) close() error {
	var errs []error
	for i := len(s.procs) - 1; i >= 0; i-- {
		errs = append(errs, s.procs[i].Stop(5*time.Second))
	}
	return errors.Join(errs...)
}

// directBootstrap is a minimal Envoy bootstrap: one listener routing every
// request to the engine at engineURL (http://host:port), no ext_proc, no
// access log.
func directBootstrap(listen, admin, engineURL string) string {
	host, port := splitHostPort(listen)
	ahost, aport := splitHostPort(admin)
	ehost, eport := splitHostPort(strings.TrimPrefix(engineURL, "http://"))
	return fmt.Sprintf(`admin:
  address: {socket_address: {address: %q, port_value: %s}}
static_resources:
  listeners:
  - name: direct
    address: {socket_address: {address: %q, port_value: %s}}
    per_connection_buffer_limit_bytes: 33554432
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: direct
          stream_idle_timeout: 900s
          request_timeout: 0s
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              suppress_envoy_headers: true
          route_config:
            virtual_hosts:
            - name: direct
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: engine, timeout: 0s}
  clusters:
  - name: engine
    type: STATIC
    connect_timeout: 2s
    per_connection_buffer_limit_bytes: 33554432
    load_assignment:
      cluster_name: engine
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: %q, port_value: %s}}}
    circuit_breakers:
      thresholds:
      - {max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}
`, ahost, aport, host, port, ehost, eport)
}

// splitHostPort splits "host:port"; a malformed address gives its whole
// text as the host (the addresses here are the harness's own).
func splitHostPort(hp string) (host, port string) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return hp, ""
	}
	return host, port
}
