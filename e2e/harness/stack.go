package harness

import (
	"cmp"
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
)

// SimSpec describes one simulated engine.
type SimSpec struct {
	// DPSize is the engine's data-parallel size (default 1).
	DPSize int
	// Args are extra duet-sim flags.
	Args []string
	// Env is added to the engine's inherited environment ("KEY=VALUE"),
	// e.g. SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1, which
	// duet-sim reads as SGLang does.
	Env []string
	// Mode, when set, is the disaggregation mode the engine runs in
	// instead of its role's (prefill, decode or null): a prefill engine
	// listed as decode, say.
	Mode string
	// Down stops the engine before duet starts (its ports stay chosen):
	// an engine that is down when duet starts, for the test to bring up
	// with Sim.Restart.
	Down bool
}

// Options describe a stack.
type Options struct {
	// Prefill engines; empty makes an aggregated stack whose Decode engines
	// run in SGLang's non-PD mode.
	Prefill []SimSpec
	// Decode engines (at least one).
	Decode []SimSpec
	// MaxBodyBytes is duet's request.max_body_bytes (default 4 MiB); a
	// negative value leaves it out of duet's configuration, so that duet's
	// own default applies (the demo's stack).
	MaxBodyBytes int
	// KVTimeout is the decode engines' wait for KV (default 5s).
	KVTimeout time.Duration
	// DecodeMsPerToken paces generated tokens (default 2).
	DecodeMsPerToken int
	// LogLevel is duet's log level (default debug).
	LogLevel string
	// PrefillPolicy and DecodePolicy are duet's policy sections in YAML
	// flow form, e.g. "least_tokens" or "{name: cache_aware, cache_threshold: 0.5}"
	// (default round_robin, so that consecutive requests spread; see
	// DuetDefaultPolicies).
	PrefillPolicy, DecodePolicy string
	// DuetDefaultPolicies leaves an empty PrefillPolicy or DecodePolicy out
	// of duet's configuration, so that duet runs its own default there
	// (least_cost), instead of setting round_robin. The demo sets it.
	DuetDefaultPolicies bool
	// LoadInterval is duet's load.interval (default 200ms).
	LoadInterval time.Duration
	// EngineRanks sets duet's engine_ranks: engines, not duet, choose DP ranks.
	EngineRanks bool
	// Pprof serves /debug/pprof/ on duet's admin port (listen.pprof).
	Pprof bool
	// MaxRoutingRequests sets envoy.max_routing_requests (0: duet's default).
	MaxRoutingRequests int
	// CoverDelay is duet's load.cover_delay (0: duet's default).
	CoverDelay time.Duration
	// DuetYAML is appended to duet's configuration, e.g. a health section.
	DuetYAML string
	// DecodeCluster and PrefillCluster are duet's envoy.clusters, for a
	// Bootstrap whose clusters have other names than duet's (empty: duet's
	// defaults).
	DecodeCluster, PrefillCluster string
	// Bootstrap, when set, makes Envoy's bootstrap instead of `duet
	// envoy-config`, e.g. from a gateway controller's translation: it gets
	// the stack's addresses (Envoy must listen on EnvoyListen, serve its
	// admin on EnvoyAdmin and dial duet at DuetGRPC) and returns the
	// bootstrap, YAML or JSON.
	Bootstrap func(ctx context.Context, addrs Addresses) ([]byte, error)
	// Dir receives configs and logs; default a new temporary directory.
	Dir string
	// Auth is how Envoy authenticates to duet (default AuthMTLS); the
	// stack makes the credentials with `duet certs` in Dir.
	Auth Auth
	// AdminAllInterfaces binds duet's admin port on every interface
	// (0.0.0.0) rather than loopback, so that its protected pages need the
	// admin token; DuetAdminURL still dials loopback.
	AdminAllInterfaces bool
	// DuetReplicas is how many duet processes run (default 1), each on its
	// own ports with the same configuration and credentials otherwise.
	// With more than one, Envoy's bootstrap lists them all
	// (envoy.duet_replicas). They share no state.
	DuetReplicas int
	// EnginesOnly starts the simulated engines alone: no duet and no
	// Envoy (the Stack's Envoy and duet fields stay empty), for a router
	// of the caller's own in front of them.
	EnginesOnly bool
	// KVEvents makes every engine publish SGLang's KV events: each gets
	// --kv-events-config with a ZMQ PUB endpoint and a replay endpoint of
	// its own, free port ranges of its DP size that overlap no other
	// engine's (rank r on base + r; Sim.KVEventsPort and KVReplayPort). The
	// engines advertise them in /server_info, where duet reads them. An
	// engine's own --kv-events-config in SimSpec.Args overrides it.
	KVEvents bool
	// DiscoveryInterval is duet's discovery.interval (default 2s).
	DiscoveryInterval time.Duration
	// NoWaitReady starts Envoy once duet is live (/healthz) rather than
	// ready (/readyz), for stacks whose duet is not ready at first: an
	// engine down or in the wrong mode.
	NoWaitReady bool
	// SimTokenizer, when set, is a tokenizer directory (tokenizer.json,
	// tokenizer_config.json) passed to every engine as --tokenizer-path,
	// so that the engines key text prompts by the token ids duet computes.
	SimTokenizer string
}

// Stack is a running Envoy + duet + engines on loopback.
type Stack struct {
	Tools Tools
	Dir   string
	// EnvoyURL is the base URL clients send to, e.g. http://127.0.0.1:41234.
	EnvoyURL string
	// EnvoyAdminURL is Envoy's admin base URL.
	EnvoyAdminURL string
	// DuetAdminURL is duet's admin base URL (the first replica's).
	DuetAdminURL string
	// DuetAdminURLs are every replica's admin base URL, in replica order.
	DuetAdminURLs []string
	// EnvoyConfig is the path of the rendered Envoy bootstrap.
	EnvoyConfig string
	// DuetGRPC is duet's gRPC (ext_proc and access-log) address (the first
	// replica's).
	DuetGRPC string
	// DuetGRPCs are every replica's gRPC address, in replica order.
	DuetGRPCs []string
	// Credentials are the stack's credentials (see Options.Auth).
	Credentials Credentials
	Prefill     []*Sim
	Decode      []*Sim
	// Duet is the first duet replica, Duets every one.
	Duet  *Process
	Duets []*Process
	Envoy *Process
}

// Start builds a stack and waits until every part is ready. On error,
// everything started so far is stopped. When a part could not bind a port
// that another process took after Start chose it, Start tries again on
// other ports, up to startAttempts times in all.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, opts)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == startAttempts {
			return s, err
		}
	}
}

// startAttempts bounds how often Start picks new ports after one of its
// ports was taken between choosing and binding it.
const startAttempts = 3

// start is one attempt of Start.
func start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if len(opts.Decode) == 0 {
		return nil, errors.New("harness: at least one decode engine is required")
	}
	if opts.DuetReplicas < 0 {
		return nil, fmt.Errorf("harness: %d duet replicas", opts.DuetReplicas)
	}
	tools, err := FindTools()
	if err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "duet-e2e-"); err != nil {
			return nil, err
		}
	}
	s := &Stack{Tools: tools, Dir: opts.Dir}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	// Two ports per engine (API and bootstrap), per duet (gRPC and admin)
	// and for Envoy (listener and admin).
	// With KVEvents, the engines' event port ranges are held while the
	// other ports are chosen, so that none falls in a range.
	kv, held, err := kvEventPorts(opts)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2*(len(opts.Prefill)+len(opts.Decode)+opts.DuetReplicas) + 2)
	held.release()
	if err != nil {
		return nil, err
	}
	next := func() int { p := ports[0]; ports = ports[1:]; return p }
	nextKV := func() kvPorts { p := kv[0]; kv = kv[1:]; return p }

	pd := len(opts.Prefill) > 0
	for i, spec := range opts.Prefill {
		sim, err := startSim(ctx, s.Tools, s.Dir, fmt.Sprintf("prefill-%d", i), cmp.Or(spec.Mode, "prefill"), spec, next(), next(), nextKV(), opts)
		if err != nil {
			return nil, err
		}
		s.Prefill = append(s.Prefill, sim)
	}
	decodeMode := "decode"
	if !pd {
		decodeMode = "null"
	}
	for i, spec := range opts.Decode {
		sim, err := startSim(ctx, s.Tools, s.Dir, fmt.Sprintf("decode-%d", i), cmp.Or(spec.Mode, decodeMode), spec, next(), next(), nextKV(), opts)
		if err != nil {
			return nil, err
		}
		s.Decode = append(s.Decode, sim)
	}
	if err := s.stopDown(opts); err != nil {
		return nil, err
	}
	if opts.EnginesOnly {
		return s, nil
	}

	replicas := make([]replicaPorts, opts.DuetReplicas)
	for i := range replicas {
		replicas[i] = replicaPorts{grpc: next(), admin: next()}
	}
	envoyPort, envoyAdminPort := next(), next()
	addrs := s.addresses(replicas[0].grpc, replicas[0].admin, envoyPort, envoyAdminPort)
	if opts.AdminAllInterfaces {
		addrs.DuetAdmin = net.JoinHostPort("0.0.0.0", strconv.Itoa(replicas[0].admin))
	}
	if opts.Auth != AuthNone {
		if addrs.Credentials, err = MakeCredentials(ctx, tools.Duet, filepath.Join(s.Dir, "credentials")); err != nil {
			return nil, err
		}
	}
	s.Credentials = addrs.Credentials
	cfgPath, err := s.startDuets(ctx, replicas, &addrs, opts)
	if err != nil {
		return nil, err
	}

	s.EnvoyConfig = filepath.Join(s.Dir, "envoy.yaml")
	var rendered []byte
	if opts.Bootstrap != nil {
		if rendered, err = opts.Bootstrap(ctx, addrs); err != nil {
			return nil, fmt.Errorf("envoy bootstrap: %w", err)
		}
	} else if rendered, err = exec.CommandContext(ctx, tools.Duet, "envoy-config", "-config", cfgPath).Output(); err != nil {
		return nil, fmt.Errorf("duet envoy-config: %w", exitDetail(err))
	}
	if err := os.WriteFile(s.EnvoyConfig, rendered, 0o644); err != nil {
		return nil, err
	}
	s.EnvoyURL = "http://" + hostPort(envoyPort)
	s.EnvoyAdminURL = "http://" + hostPort(envoyAdminPort)
	if s.Envoy, err = startEnvoy(ctx, tools, s.Dir, s.EnvoyConfig, s.EnvoyAdminURL); err != nil {
		return nil, err
	}
	return s, nil
}

// stopDown stops the engines whose SimSpec says Down.
func (s *Stack) stopDown(opts Options) error {
	for i, spec := range opts.Prefill {
		if spec.Down {
			if err := s.Prefill[i].Stop(5 * time.Second); err != nil {
				return err
			}
		}
	}
	for i, spec := range opts.Decode {
		if spec.Down {
			if err := s.Decode[i].Stop(5 * time.Second); err != nil {
				return err
			}
		}
	}
	return nil
}

// replicaPorts are one duet replica's ports.
type replicaPorts struct{ grpc, admin int }

// startDuets starts every duet replica, one after the other, each ready
// before the next starts. With several, addrs gets them all as
// EnvoyDuetReplicas. It returns the first replica's configuration path.
func (s *Stack) startDuets(ctx context.Context, replicas []replicaPorts, addrs *Addresses, opts Options) (string, error) {
	if len(replicas) > 1 {
		for _, r := range replicas {
			addrs.EnvoyDuetReplicas = append(addrs.EnvoyDuetReplicas, hostPort(r.grpc))
		}
	}
	var first string
	for i, r := range replicas {
		path, err := s.startDuet(ctx, i, r, *addrs, opts)
		if err != nil {
			return "", err
		}
		if i == 0 {
			first = path
		}
	}
	s.Duet, s.DuetAdminURL, s.DuetGRPC = s.Duets[0], s.DuetAdminURLs[0], s.DuetGRPCs[0]
	return first, nil
}

// startDuet writes replica i's configuration (addrs with the replica's own
// ports) and starts it, waiting until it is ready. It returns the
// configuration's path. Replica 0 is "duet" (duet.yaml, duet.log), replica i
// "duet-i".
func (s *Stack) startDuet(ctx context.Context, i int, r replicaPorts, addrs Addresses, opts Options) (string, error) {
	name := "duet"
	if i > 0 {
		name = fmt.Sprintf("duet-%d", i)
	}
	addrs.DuetGRPC, addrs.DuetAdmin = hostPort(r.grpc), hostPort(r.admin)
	if opts.AdminAllInterfaces {
		addrs.DuetAdmin = net.JoinHostPort("0.0.0.0", strconv.Itoa(r.admin))
	}
	path := filepath.Join(s.Dir, name+".yaml")
	if err := os.WriteFile(path, []byte(DuetConfig(opts, addrs)), 0o644); err != nil {
		return "", err
	}
	p, err := startProcess(s.Dir, name, s.Tools.Duet, "serve", "-config", path)
	if err != nil {
		return "", err
	}
	adminURL := "http://" + hostPort(r.admin)
	s.Duets, s.DuetAdminURLs, s.DuetGRPCs = append(s.Duets, p), append(s.DuetAdminURLs, adminURL), append(s.DuetGRPCs, hostPort(r.grpc))
	if opts.NoWaitReady {
		return path, waitHTTP(ctx, p, adminURL+"/healthz")
	}
	return path, waitHTTP(ctx, p, adminURL+"/readyz")
}

// StartSim starts one simulated engine in mode (prefill, decode or null)
// outside a Stack, logging into dir, and waits until it is healthy.
func StartSim(ctx context.Context, dir, name, mode string, spec SimSpec) (*Sim, error) {
	tools, err := FindTools()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	return startSim(ctx, tools, dir, name, mode, spec, ports[0], ports[1], kvPorts{}, Options{KVTimeout: 5 * time.Second, DecodeMsPerToken: 2})
}

// startSim starts one engine; kv are its KV event ports (zero: none).
func startSim(ctx context.Context, tools Tools, dir, name, mode string, spec SimSpec, port, bootstrapPort int, kv kvPorts, opts Options) (*Sim, error) {
	dp := max(spec.DPSize, 1)
	argv := append([]string{tools.Sim}, simArgs(mode, spec, hostPort(port), bootstrapPort, kv, opts)...)
	p, err := startProcessEnv(dir, name, spec.Env, argv...)
	if err != nil {
		return nil, err
	}
	sim := &Sim{Process: p, Mode: mode, URL: "http://" + hostPort(port), Address: hostPort(port),
		BootstrapPort: bootstrapPort, DPSize: dp, KVEventsPort: kv.pub, KVReplayPort: kv.replay}
	if err := waitHTTP(ctx, p, sim.URL+"/health"); err != nil {
		return sim, err
	}
	return sim, nil
}

// StartEnvoy runs Envoy with the bootstrap at configPath, logging into dir,
// and waits until its admin interface at adminURL reports ready.
func StartEnvoy(ctx context.Context, dir, configPath, adminURL string) (*Process, error) {
	tools, err := FindTools()
	if err != nil {
		return nil, err
	}
	return startEnvoy(ctx, tools, dir, configPath, adminURL)
}

func startEnvoy(ctx context.Context, tools Tools, dir, configPath, adminURL string) (*Process, error) {
	p, err := startProcess(dir, "envoy", append([]string{tools.Envoy}, EnvoyArgs(configPath)...)...)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, p, adminURL+"/ready"); err != nil {
		p.Stop(time.Second)
		return nil, err
	}
	return p, nil
}

// FreePorts reserves n free loopback ports (see freePorts).
func FreePorts(n int) ([]int, error) { return freePorts(n) }

// addresses places the stack's parts on loopback ports.
func (s *Stack) addresses(grpcPort, adminPort, envoyPort, envoyAdminPort int) Addresses {
	addrs := Addresses{
		DuetGRPC: hostPort(grpcPort), DuetAdmin: hostPort(adminPort),
		EnvoyListen: hostPort(envoyPort), EnvoyAdmin: hostPort(envoyAdminPort),
	}
	for _, sim := range s.Prefill {
		addrs.Prefill = append(addrs.Prefill, sim.URL)
	}
	for _, sim := range s.Decode {
		addrs.Decode = append(addrs.Decode, sim.URL)
	}
	return addrs
}

// RestartDuet starts duet (the first replica) again after it stopped or
// was killed, with the same configuration, and waits until it is ready.
// Envoy is not touched.
func (s *Stack) RestartDuet(ctx context.Context) error { return s.RestartReplica(ctx, 0) }

// RestartReplica starts duet replica i again after it stopped or was
// killed, as RestartDuet does the first.
func (s *Stack) RestartReplica(ctx context.Context, i int) error {
	if i < 0 || i >= len(s.Duets) {
		return fmt.Errorf("restart duet replica %d: the stack runs %d", i, len(s.Duets))
	}
	if err := s.Duets[i].Restart(); err != nil {
		return err
	}
	return waitHTTP(ctx, s.Duets[i], s.DuetAdminURLs[i]+"/readyz")
}

// Processes returns every process of the stack.
func (s *Stack) Processes() []*Process {
	var ps []*Process
	for _, sim := range append(append([]*Sim{}, s.Prefill...), s.Decode...) {
		ps = append(ps, sim.Process)
	}
	ps = append(ps, s.Duets...)
	if s.Envoy != nil {
		ps = append(ps, s.Envoy)
	}
	return ps
}

// Logs returns the tail of every process log, for failure reports.
func (s *Stack) Logs() string {
	var b strings.Builder
	for _, p := range s.Processes() {
		fmt.Fprintf(&b, "----- %s (%s)\n%s\n", p.Name, p.LogPath, p.Tail(3000))
	}
	return b.String()
}

// FailureLog is the part of a *testing.T that CloseLoggingIfFailed uses.
type FailureLog interface {
	Helper()
	Failed() bool
	Log(args ...any)
}

// CloseLoggingIfFailed stops every process, as Close does, after logging
// the tail of every process log to t if t has failed: a test's cleanup.
func (s *Stack) CloseLoggingIfFailed(t FailureLog) error {
	t.Helper()
	if t.Failed() {
		t.Log(s.Logs())
	}
	return s.Close()
}

// Close stops every process.
func (s *Stack) Close() error {
	var errs []error
	for _, p := range append([]*Process{s.Envoy}, s.Duets...) {
		if p != nil {
			errs = append(errs, p.Stop(5*time.Second))
		}
	}
	for _, sim := range append(append([]*Sim{}, s.Prefill...), s.Decode...) {
		if sim != nil && sim.Process != nil {
			errs = append(errs, sim.Stop(5*time.Second))
		}
	}
	return errors.Join(errs...)
}

func exitDetail(err error) error {
	var exit *exec.ExitError
	if errors.As(err, &exit) && len(exit.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, exit.Stderr)
	}
	return err
}
