package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/duet-router/duet/scheduler/load"
	"github.com/duet-router/duet/scheduler/prefix"
)

// Defaults for the zero values of Config.
const (
	defaultDiscoveryInterval = 10 * time.Second
	defaultDiscoveryTimeout  = 2 * time.Second
	// defaultRetryBase is Run's first delay before it probes endpoints
	// that are not ready again.
	defaultRetryBase = 250 * time.Millisecond
)

// ErrNoEndpoints is wrapped in the error Pick returns when a role has no
// ready endpoint, or when every target of a role is ejected; the error
// message names the role.
var ErrNoEndpoints = errors.New("no ready endpoint")

// Config configures a Scheduler.
type Config struct {
	// Pool names the pool this scheduler serves (one model's engines), in
	// its Picked events; "" for a scheduler that serves every model.
	Pool string
	// Prefill lists the prefill engines. Empty means aggregated mode: no
	// prefill leg, the decode pool serves whole requests.
	Prefill []EndpointSpec
	// Decode lists the decode engines (or, in aggregated mode, the
	// engines). At least one is required, unless EmptyPools is set.
	Decode []EndpointSpec
	// EmptyPools lets New and SetEndpoints accept empty endpoint lists, for
	// lists that service discovery fills and empties as engines come and go
	// (see package scheduler/kubernetes). A role without endpoints has no
	// target: Ready is false and Pick fails with ErrNoEndpoints until
	// SetEndpoints lists some. Whether a prefill pool is configured then
	// comes from PD, not from whether Prefill is empty.
	EmptyPools bool
	// PD, with EmptyPools, says that a prefill pool is configured: requests
	// are served disaggregated even while the pool has no endpoint.
	// Without EmptyPools it must be false.
	PD bool
	// PrefillPolicy is the prefill pool's policy; default round_robin.
	PrefillPolicy PolicySpec
	// DecodePolicy is the decode pool's policy; default round_robin.
	DecodePolicy PolicySpec
	// PrefillPolicyInstance and DecodePolicyInstance, if set, replace the
	// policies PrefillPolicy and DecodePolicy name: a policy built outside
	// this package, such as a peer router's rule ported for comparison in
	// the routing-quality simulator. Each instance serves one scheduler.
	PrefillPolicyInstance, DecodePolicyInstance Policy
	// DiscoveryInterval is the time between discovery rounds in Run;
	// default 10s.
	DiscoveryInterval time.Duration
	// DiscoveryTimeout bounds each HTTP call and DNS lookup of discovery;
	// default 2s.
	DiscoveryTimeout time.Duration
	// HTTPClient makes the discovery calls; default a client with no
	// overall timeout (DiscoveryTimeout applies per call).
	HTTPClient *http.Client
	// Load configures load scraping and the reservation ledger.
	Load LoadConfig
	// Prefix configures prompt hashing and the prefix index.
	Prefix PrefixConfig
	// Tokens configures the token estimate.
	Tokens TokenConfig
	// Health configures health checking and ejection.
	Health HealthConfig
	// OnEject, if set, is called on every ejection of an endpoint or a
	// target. It is called outside every scheduler lock, in the goroutine
	// that observed the failure (a Complete caller, the probe loop or the
	// scrape loop), so calls may be concurrent; it may call the scheduler,
	// and should return quickly.
	OnEject func(Ejection)
	// OnPicked, if set, is told what every successful Pick changed in the
	// scheduler's state (package docs: "Replicas"), for other duet
	// replicas to apply with ApplyPicked. It is called after the pick lock
	// is released, in Pick's goroutine, and must not block.
	OnPicked func(Picked)
	// Registerer receives the scheduler's metrics; nil means none.
	Registerer prometheus.Registerer
	// EngineRanks makes duet choose engines only, never ranks: prefill
	// ranks then follow the (random) bootstrap room, decode engines pick
	// their own. This is SGLang's behaviour behind a rank-unaware router,
	// the baseline that rank-aware scheduling is measured against.
	EngineRanks bool
	// KVEvents is where engines publish their KV cache events when neither
	// their /server_info nor their EndpointSpec says (older SGLang); the
	// zero value means only advertised or configured events are followed.
	KVEvents KVEvents
	// CacheView, if set, is the engines' own account of their caches (KV
	// events): for requests hashed in token blocks it replaces the prefix
	// index's estimate on every target it has a word for. The scheduler
	// names the targets to follow (SetTargets) whenever the pools change;
	// the caller runs the view (kvevents.Tracker.Run).
	CacheView CacheView
	// Saturation says when a target is saturated (Saturated); zero fields
	// take the defaults.
	Saturation SaturationConfig
	// OnRelease, if set, is called whenever the pool may have room again:
	// after feedback released reservations, after each round of load
	// scrapes, and after endpoints changed. It must not block (an
	// admission queue's Kick).
	OnRelease func()
	// Clock, if set, is the scheduler's clock: reservations, load
	// freshness, scrape times, health and the decisions shown on the status
	// page read it instead of time.Now. The routing-quality simulator
	// (e2e/clustersim) drives a scheduler in virtual time with it. Timers
	// (Run's loops) and timeouts of network calls stay on the wall clock.
	Clock func() time.Time
}

// LoadConfig configures load scraping and the reservation ledger.
type LoadConfig struct {
	// Interval between scrapes of every ready endpoint (default 1s).
	// Negative disables scraping: loads are then duet's reservations only.
	Interval time.Duration
	// Timeout bounds one scrape (default 1s).
	Timeout time.Duration
	// Concurrency bounds the scrapes in flight (default 16).
	Concurrency int
	// StaleAfter is the age past which scraped numbers are not used
	// (default 5s).
	StaleAfter time.Duration
	// CoverDelay is how long after a pick the request is assumed to have
	// reached the engine, so that a scrape started later covers it
	// (default 100ms).
	CoverDelay time.Duration
	// ReservationTTL ends reservations whose feedback never came
	// (default 10m).
	ReservationTTL time.Duration
	// PrefillCovered makes prefill reservations end at the first covering
	// scrape, as decode reservations do, and adds them to the engine's
	// reported pending tokens. By default (false) prefill ranks are
	// accounted in flight instead: a prefill reservation ends with its
	// leg's feedback, and a prefill target's load is the
	// larger of its reservations and the engine's reported pending tokens
	// (which still count traffic duet did not send). SGLang's pending
	// tokens leave the queue when a prefill starts, long before it ends,
	// so a covered reservation makes a rank that is busy prefilling look
	// idle. See docs/scheduling.md.
	PrefillCovered bool
}

// PrefixConfig configures prompt hashing and the prefix index.
type PrefixConfig struct {
	// BlockBytes is the text block size (default 64 bytes, about 16 tokens).
	BlockBytes int
	// BlockTokens is the token-id block size (default 16).
	BlockTokens int
	// MaxBlocksPerTarget bounds the index's memory per target (default 65536).
	MaxBlocksPerTarget int
	// IgnoreCapacity keeps MaxBlocksPerTarget as every target's bound. By
	// default a target that reports its KV capacity holds at most that
	// capacity's worth of blocks, so the index forgets about as fast as the
	// engine's cache evicts (docs/scheduling.md).
	IgnoreCapacity bool
}

// TokenConfig configures the token estimate.
type TokenConfig struct {
	// CharsPerToken is the starting characters-per-token ratio of every
	// model (default 4); reported usage corrects it per model.
	CharsPerToken float64
	// DefaultMaxTokens is the expected output per sequence, and the cap of
	// a requested max_tokens, in decode reservations (default 256).
	DefaultMaxTokens int
}

// Decision is the outcome for one request.
type Decision struct {
	// Prefill is the prefill target; nil when no prefill pool is
	// configured (aggregated mode).
	Prefill *Target
	// Decode is the decode target (in aggregated mode, the only one).
	Decode Target
}

// Scheduler keeps the configured endpoints up to date and picks targets for
// requests. Its methods are safe for concurrent use.
type Scheduler struct {
	log      *zap.Logger
	client   *http.Client
	interval time.Duration
	timeout  time.Duration
	// retryBase is Run's first delay before the endpoints that are not
	// ready are probed again (defaultRetryBase; tests shorten it).
	retryBase time.Duration
	// pendingKick tells Run that SetEndpoints added endpoints: the
	// backoff of its retries starts over.
	pendingKick   chan struct{}
	lookup        func(ctx context.Context, host string) ([]netip.Addr, error)
	prefillPolicy Policy
	decodePolicy  Policy
	pd            bool
	emptyPools    bool // Config.EmptyPools

	discoverMu sync.Mutex // serializes discovery rounds and SetEndpoints; guards members and their discovery state
	members    []*member  // prefill first, then decode, in configuration order

	snap atomic.Pointer[snapshot]

	engineRanks bool
	ledger      *ledger
	tokens      *TokenEstimator
	hasher      prefix.Hasher
	index       *prefix.Index[TargetKey]
	// turnEnds extends the index's matches to the earlier turns' whole
	// prompts routed to a target, and on decode targets with a decode
	// radix cache to their answers.
	turnEnds *turnEnds
	// prefixIgnoreCapacity is PrefixConfig.IgnoreCapacity.
	prefixIgnoreCapacity bool
	scraper              *load.Scraper
	loadCfg              LoadConfig
	defaultMaxTokens     int
	metrics              *metrics
	anonymous            atomic.Uint64
	fallbackTurn         atomic.Uint64 // rotates DecodeFallback over the eligible engines
	health               *health
	onEject              func(Ejection)
	onPicked             func(Picked)
	pool                 string // Config.Pool
	cacheView            CacheView
	kvEvents             KVEvents // Config.KVEvents
	saturation           SaturationConfig
	onRelease            func()
	// now is the scheduler's clock (time.Now; tests replace it before use).
	now func() time.Time
	// discovered and scraped record that a first discovery round, and a
	// first scrape round after it, have finished: Ready waits for both.
	discovered, scraped atomic.Bool
	// Candidate scratch space, guarded by ledger.mu.
	prefillScratch, decodeScratch []Candidate
	posScratch                    []int32
	// decisions keeps the latest picks for Status, guarded by ledger.mu.
	decisions decisionRing
}

// New validates cfg and returns a Scheduler for it. No endpoint is ready
// until the first discovery round: call Discover or Run. A nil log discards
// logs.
func New(cfg Config, log *zap.Logger) (*Scheduler, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if len(cfg.Decode) == 0 && !cfg.EmptyPools {
		return nil, errors.New("scheduler: no decode endpoint configured")
	}
	if cfg.PD && !cfg.EmptyPools {
		return nil, errors.New("scheduler: PD is set without EmptyPools (the prefill list says whether a prefill pool is configured)")
	}
	if cfg.EmptyPools && !cfg.PD && len(cfg.Prefill) > 0 {
		return nil, errors.New("scheduler: prefill endpoints listed, but PD is not set")
	}
	s := &Scheduler{
		log:         log,
		client:      cfg.HTTPClient,
		interval:    cfg.DiscoveryInterval,
		timeout:     cfg.DiscoveryTimeout,
		retryBase:   defaultRetryBase,
		pendingKick: make(chan struct{}, 1),
		pd:          len(cfg.Prefill) > 0 || cfg.PD,
		emptyPools:  cfg.EmptyPools,
		onEject:     cfg.OnEject,
		onPicked:    cfg.OnPicked,
		pool:        cfg.Pool,
		cacheView:   cfg.CacheView,
		kvEvents:    cfg.KVEvents,
		now:         time.Now,
	}
	if cfg.Clock != nil {
		s.now = cfg.Clock
	}
	if s.client == nil {
		s.client = &http.Client{}
	}
	if s.interval <= 0 {
		s.interval = defaultDiscoveryInterval
	}
	if s.timeout <= 0 {
		s.timeout = defaultDiscoveryTimeout
	}
	resolver := &net.Resolver{}
	s.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
		return resolver.LookupNetIP(ctx, "ip", host)
	}

	var err error
	cfg.PrefillPolicy.Role, cfg.DecodePolicy.Role = RolePrefill, RoleDecode
	if s.prefillPolicy, err = policyOrDefault(cfg.PrefillPolicy); err != nil {
		return nil, fmt.Errorf("scheduler: prefill policy: %w", err)
	}
	if s.decodePolicy, err = policyOrDefault(cfg.DecodePolicy); err != nil {
		return nil, fmt.Errorf("scheduler: decode policy: %w", err)
	}
	if cfg.PrefillPolicyInstance != nil {
		s.prefillPolicy = cfg.PrefillPolicyInstance
	}
	if cfg.DecodePolicyInstance != nil {
		s.decodePolicy = cfg.DecodePolicyInstance
	}

	s.engineRanks = cfg.EngineRanks
	s.loadCfg = cfg.Load
	if s.loadCfg.Interval == 0 {
		s.loadCfg.Interval = time.Second
	}
	if s.loadCfg.Timeout <= 0 {
		s.loadCfg.Timeout = time.Second
	}
	if s.loadCfg.Concurrency <= 0 {
		s.loadCfg.Concurrency = 16
	}
	s.ledger = newLedger(s.loadCfg.CoverDelay, s.loadCfg.StaleAfter, s.loadCfg.ReservationTTL)
	s.ledger.now = s.now
	s.ledger.prefillInFlight = !s.loadCfg.PrefillCovered
	s.ledger.legEnded = s.legEnded()
	s.tokens = NewTokenEstimator(cfg.Tokens.CharsPerToken)
	s.defaultMaxTokens = cfg.Tokens.DefaultMaxTokens
	if s.defaultMaxTokens <= 0 {
		s.defaultMaxTokens = 256
	}
	s.hasher = prefix.Hasher{BlockBytes: cfg.Prefix.BlockBytes, BlockTokens: cfg.Prefix.BlockTokens}
	s.index = prefix.NewIndex[TargetKey](cfg.Prefix.MaxBlocksPerTarget)
	s.turnEnds = newTurnEnds()
	s.prefixIgnoreCapacity = cfg.Prefix.IgnoreCapacity
	s.saturation = cfg.Saturation.withDefaults()
	s.onRelease = cfg.OnRelease
	s.scraper = load.NewScraper(s.client, s.loadCfg.Timeout)
	s.scraper.SetClock(s.now)
	if cfg.Registerer != nil {
		s.metrics = newMetrics(cfg.Registerer, s.ledger, map[Role]string{
			RolePrefill: s.prefillPolicy.Name(), RoleDecode: s.decodePolicy.Name(),
		})
	}
	s.health = newHealth(cfg.Health, s.metrics)
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(saturationCollector{s}, readinessCollector{s})
	}

	if s.members, err = newMembers(cfg.Prefill, cfg.Decode); err != nil {
		return nil, err
	}
	refs := make([]endpointRef, len(s.members))
	for i, m := range s.members {
		refs[i] = endpointRef{role: m.role, url: m.cur.URL}
	}
	s.health.updateEndpoints(refs, nil)
	s.publish()
	return s, nil
}

// legEnded returns the ledger's leg callback: each role's policy that is a
// LegObserver hears of its role's legs. Nil when neither policy observes.
func (s *Scheduler) legEnded() func(LegReport) {
	prefill, _ := s.prefillPolicy.(LegObserver)
	decode, _ := s.decodePolicy.(LegObserver)
	if prefill == nil && decode == nil {
		return nil
	}
	return func(r LegReport) {
		switch {
		case r.Role == RolePrefill && prefill != nil:
			prefill.ObserveLeg(r)
		case r.Role == RoleDecode && decode != nil:
			decode.ObserveLeg(r)
		}
	}
}

// policyOrDefault builds the policy of spec, round_robin if it names none.
func policyOrDefault(spec PolicySpec) (Policy, error) {
	if spec.Name == "" {
		spec.Name = policyRoundRobin
	}
	return NewPolicy(spec)
}

// newMembers validates the endpoint lists of both roles and returns their
// members, undiscovered: prefill first, then decode, in list order. Two
// entries that name the same engine (see parseEndpointURL) are an error.
func newMembers(prefill, decode []EndpointSpec) ([]*member, error) {
	var members []*member
	seen := make(map[string]string) // duplicate key -> URL as configured
	add := func(role Role, specs []EndpointSpec) error {
		for i, spec := range specs {
			m, err := newMember(role, spec)
			if err != nil {
				return fmt.Errorf("scheduler: %s endpoint %d: %w", role, i, err)
			}
			if prev, ok := seen[m.url.key]; ok {
				return fmt.Errorf("scheduler: duplicate endpoint URL %q (same engine as %q)", spec.URL, prev)
			}
			seen[m.url.key] = spec.URL
			members = append(members, m)
		}
		return nil
	}
	if err := add(RolePrefill, prefill); err != nil {
		return nil, err
	}
	if err := add(RoleDecode, decode); err != nil {
		return nil, err
	}
	return members, nil
}

// newMember validates spec and returns its endpoint in the undiscovered
// state.
func newMember(role Role, spec EndpointSpec) (*member, error) {
	u, err := parseEndpointURL(spec.URL)
	if err != nil {
		return nil, fmt.Errorf("URL %q: %w", spec.URL, err)
	}
	if spec.DPSize < 0 || spec.DPSize > maxDPSize {
		return nil, fmt.Errorf("URL %q: DPSize %d out of range [0, %d]", spec.URL, spec.DPSize, maxDPSize)
	}
	if spec.BootstrapPort < 0 || spec.BootstrapPort > 65535 {
		return nil, fmt.Errorf("URL %q: BootstrapPort %d out of range [0, 65535]", spec.URL, spec.BootstrapPort)
	}
	m := &member{role: role, spec: spec, url: u}
	m.cur = Endpoint{Role: role, URL: u.base, BootstrapHost: u.host}
	if u.ip.IsValid() {
		m.cur.Address = address(u.ip, u.port)
	}
	return m, nil
}

// publish makes the members' current states the snapshot picks use. The
// caller holds discoverMu or is New.
func (s *Scheduler) publish() {
	eps := s.states()
	s.snap.Store(newSnapshot(eps, s.engineRanks, s.ledger, s.metrics, s.health, s.forgetPrefixes))
	if s.cacheView != nil {
		s.cacheView.SetTargets(cacheTargets(eps))
	}
	s.released()
}

// states returns the members' current states. The caller holds discoverMu
// or is New.
func (s *Scheduler) states() []Endpoint {
	eps := make([]Endpoint, len(s.members))
	for i, m := range s.members {
		eps[i] = m.cur
	}
	return eps
}

// Discover runs one discovery round over all endpoints concurrently and
// publishes the result if anything changed. It returns the endpoints'
// errors joined, including those of endpoints that stay ready on known or
// configured values. If ctx ends during the round, the round's results are
// dropped and the context's error is returned.
func (s *Scheduler) Discover(ctx context.Context) error {
	err := s.discover(ctx, false)
	if err == nil || ctx.Err() == nil {
		s.discovered.Store(true)
	}
	return err
}

// discover runs one discovery round, over every endpoint or, with
// pendingOnly, over the endpoints that are not ready; it publishes the
// result if anything changed.
func (s *Scheduler) discover(ctx context.Context, pendingOnly bool) error {
	s.discoverMu.Lock()
	defer s.discoverMu.Unlock()

	members := s.members
	if pendingOnly {
		members = nil
		for _, m := range s.members {
			if !m.cur.Ready {
				members = append(members, m)
			}
		}
		if len(members) == 0 {
			return nil
		}
	}
	probes := make([]probe, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() { probes[i] = s.probe(ctx, m) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("scheduler: discover: %w", err)
	}

	var errs []error
	changed := false
	for i, m := range members {
		ep, err := s.apply(m, probes[i])
		if err != nil {
			errs = append(errs, err)
		}
		if ep != m.cur {
			changed = true
			m.cur = ep
		}
	}
	if changed {
		s.publish()
	}
	return errors.Join(errs...)
}

// Run calls Discover now and then every DiscoveryInterval until ctx is
// done. Between those rounds it probes the endpoints that are not ready
// (down or unreachable at start, not yet resolved, or in the wrong
// disaggregation mode) sooner, with backoff: 250ms after a round leaves
// one not ready, then 500ms, 1s and so on, doubling while the delay is
// shorter than DiscoveryInterval (see retryBackoff); the backoff starts
// over once every endpoint is ready, or when SetEndpoints adds endpoints.
// After the first discovery round Run also scrapes loads every
// LoadConfig.Interval and probes health every HealthConfig.Interval (each
// unless disabled). Discovery errors are logged as endpoints change state;
// Run itself only logs them at debug level. Run returns when ctx is done
// and its loops have stopped.
func (s *Scheduler) Run(ctx context.Context) {
	var loops sync.WaitGroup
	defer loops.Wait()
	ticker := time.NewTicker(s.interval)
	defer ticker.Stop()
	retry := retryBackoff{base: s.retryBase, limit: s.interval}
	s.runDiscover(ctx, false)
	if s.loadCfg.Interval > 0 {
		loops.Go(func() { s.runScrapes(ctx) })
	}
	loops.Go(func() { s.runHealth(ctx) })
	for {
		var timer *time.Timer
		var retryC <-chan time.Time
		if d, ok := retry.next(s.pendingCount() > 0); ok {
			timer = time.NewTimer(d)
			retryC = timer.C
		}
		select {
		case <-ctx.Done():
		case <-ticker.C:
			s.runDiscover(ctx, false)
		case <-retryC:
			retry.fired()
			s.runDiscover(ctx, true)
		case <-s.pendingKick:
			retry.reset()
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// runDiscover runs one round of Run: Discover, or with pendingOnly a round
// over the endpoints that are not ready.
func (s *Scheduler) runDiscover(ctx context.Context, pendingOnly bool) {
	var err error
	if pendingOnly {
		err = s.discover(ctx, true)
	} else {
		err = s.Discover(ctx)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Debug("discovery round finished with errors", zap.Bool("pending_only", pendingOnly), zap.Error(err))
	}
}

// Ready reports whether requests can be scheduled: the first discovery
// round has finished and, when scraping is enabled, so has the first load
// scrape round after it; and at least one decode endpoint is ready and, if
// a prefill pool is configured, at least one prefill endpoint too.
// Ejections do not affect readiness: a pool whose targets are all ejected
// still answers, with fast errors from Pick.
func (s *Scheduler) Ready() bool {
	if !s.Settled() {
		return false
	}
	snap := s.snap.Load()
	return len(snap.decode.targets) > 0 && (!s.pd || len(snap.prefill.targets) > 0)
}

// Settled reports whether the first discovery round has finished and, when
// scraping is enabled, so has the first load scrape round after it: the
// scheduler knows what its engines are, whether or not any is ready.
func (s *Scheduler) Settled() bool {
	return s.discovered.Load() && (s.loadCfg.Interval <= 0 || s.scraped.Load())
}

// PD reports whether a prefill pool is configured, that is whether requests
// are served disaggregated.
func (s *Scheduler) PD() bool { return s.pd }

// Endpoints returns a snapshot of all endpoints of both roles: prefill
// first, then decode, each in configuration order.
func (s *Scheduler) Endpoints() []Endpoint {
	return slices.Clone(s.snap.Load().endpoints)
}

// forgetPrefixes drops what the prefix index and the turn ends hold for a
// target that left the pools.
func (s *Scheduler) forgetPrefixes(key TargetKey) {
	s.index.Remove(key)
	s.turnEnds.forget(key)
}
