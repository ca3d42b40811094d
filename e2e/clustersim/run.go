package clustersim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/e2e/sim"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/kvevents"
)

// Oracle replaces the scheduler with a choice made from the engines' true
// state.
type Oracle int

const (
	// OracleNone routes with Config.Policy through duet's scheduler.
	OracleNone Oracle = iota
	// OracleLoad sends each leg to the rank with the least true pending
	// work: prompt tokens still to compute on prefill, KV in use and
	// promised on decode.
	OracleLoad
)

// String names the oracle as reports show it.
func (o Oracle) String() string {
	if o == OracleLoad {
		return "oracle_load"
	}
	return "none"
}

// Preload is work submitted straight to one rank at time 0, past the
// router: a rank that already queues when routing starts (the "everything
// on rank 0" symptom). It is not measured.
type Preload struct {
	Role         scheduler.Role
	Engine, Rank int
	Requests     int
	PromptTokens int
	OutputTokens int
}

// Config is one simulated run.
type Config struct {
	// Cluster is the engines.
	Cluster Cluster
	// Policy is the routing under test (ignored with an Oracle).
	Policy bench.Policy
	// Oracle, if set, routes instead of the scheduler.
	Oracle Oracle
	// Workload is the prepared workload (see Prepare); its block size
	// must be the engines' profile's.
	Workload *Prepared
	// Warmup excludes requests that arrive before it from the results'
	// summary (they still load the cluster).
	Warmup time.Duration
	// Drain bounds the time after the arrival window (default 2m):
	// requests not finished by then count as unfinished.
	Drain time.Duration
	// LoadInterval is the scheduler's scrape interval (default 500ms).
	LoadInterval time.Duration
	// SampleInterval is how often the ranks' true load is sampled for the
	// imbalance figures (default 1s).
	SampleInterval time.Duration
	// Seed draws engine_default's random bootstrap rooms.
	Seed uint64
	// Preload is work put on ranks at time 0.
	Preload []Preload
	// Scheduler adjusts the scheduler's configuration (load, prefix,
	// token settings) before the run; endpoints, policies, clock and
	// transport are the run's. With Replicas it is called once per
	// replica, so that each builds its own policy instances.
	Scheduler func(*scheduler.Config)
	// Replicas is the number of duet replicas (default 1), each with its
	// own scheduler that scrapes every engine itself (their scrapes are
	// spread evenly over the load interval) and shares nothing with the
	// others. Requests go to the replicas in turn, as Envoy spreads ext_proc
	// streams round robin over its duet hosts.
	Replicas int
	// FeedbackAny delivers each leg's feedback to a replica drawn at
	// random (seeded), as an Envoy Gateway or Istio access-log sink spread
	// over replicas does; by default it reaches the replica that routed
	// the request (duet and Envoy in one pod).
	FeedbackAny bool
	// Share makes the replicas share their state, as duet replicas do over
	// NATS: every pick's holds and prefix blocks reach every replica
	// (scheduler.Config.OnPicked, Scheduler.ApplyPicked), and every leg's
	// feedback is applied by every replica (the one that received it, and
	// the others through the event). Delivery is instant in virtual time;
	// a LAN's NATS adds well under a millisecond.
	Share bool
	// Cache is what the scheduler knows of the engines' caches (default
	// CacheEstimate: text blocks and duet's estimate).
	Cache CacheMode
	// EventDelay is how long after an engine's cache changes its KV
	// events reach the views (CacheEvents).
	EventDelay time.Duration
	// Bypass is the share of requests that reach the engines without
	// duet (another router, direct clients): engines and ranks drawn at
	// random, no feedback. They are measured with the others.
	Bypass float64
	// Restarts empty engines' prefix caches mid-run, as a restarted engine
	// starts (their ranks report AllBlocksCleared); in time order.
	Restarts []Restart
	// Admission, if set, queues requests in duet while the pool is
	// saturated (see Admission); each replica has its own queue. Nil
	// routes every request on arrival, as before admission existed.
	Admission *Admission
}

// Restart empties one engine's prefix caches at a time.
type Restart struct {
	At     time.Duration
	Role   scheduler.Role
	Engine int
}

// epoch is virtual time zero on the scheduler's clock.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run simulates cfg to the end and returns what every request saw. It is
// deterministic: equal configurations give equal results.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	r, err := newRun(cfg)
	if err != nil {
		return nil, err
	}
	if err := r.loop(ctx); err != nil {
		return nil, err
	}
	return r.result(), nil
}

// run is the state of one simulation.
type run struct {
	cfg Config
	now time.Duration
	end time.Duration
	// scheds are the replicas' schedulers (nil with an oracle);
	// nextScrape is each one's next scrape.
	scheds     []*scheduler.Scheduler
	nextScrape []time.Duration
	// feedbackTo draws the replica a leg's feedback reaches (FeedbackAny).
	feedbackTo *rand.Rand
	prefill    []*engine
	decode     []*engine
	engines    []*engine
	arrivals   arrivalHeap
	seq        uint64
	rooms      *rand.Rand
	active     int
	requests   []*request

	nextSample time.Duration
	samples    []sample
	// seen holds every block hash of every prompt sent so far, for the
	// hit-rate bound; seenDecode every block a decode radix cache held at
	// the end of a request (prompts and answers), for the decode bound.
	seen, seenDecode map[uint64]struct{}

	// views are the replicas' KV event views (CacheEvents); deliveries
	// the event batches on their way to them.
	views       []fedView
	deliveries  deliveryHeap
	deliverySeq uint64
	// routing is the prompt being routed (CacheOracle reads it).
	routing *sim.Prompt
	// bypass draws the requests that bypass duet, and their targets.
	bypass *rand.Rand
	// restarts are the restarts still due.
	restarts []Restart
	// oracle is the replicas' view with CacheOracle.
	oracle *oracleView
	// adm is the admission queues (nil without Config.Admission).
	adm *admission
}

// request is one request in flight or done.
type request struct {
	id            string
	replica       int // the replica that routed it
	session, turn int
	arrival       time.Duration
	turnInfo      *preparedTurn
	pEng, dEng    *engine
	pRank, dRank  int
	pLegRank      int // the rank the legs carry (NoRank when the engines chose)
	dLegRank      int
	pItem, dItem  *sim.Item
	prefillDone   bool
	delivered     bool
	firstAt       time.Duration
	doneAt        time.Duration
	cached        int
	bound         int // tokens a cache holding every earlier prompt would hit
	// decodeCached is what the decode radix cache matched at
	// preallocation; decodeBound what a decode cache holding every
	// earlier prompt and answer would (both 0 without the cache).
	decodeCached, decodeBound int
	prefixSent                bool // the decode's match was given to the prefill
	bypassed                  bool // routed past duet (Config.Bypass)
	generated                 int
	err                       string
	finished                  bool
	// class and tenant are the session's (with admission, the class and
	// tenant duet's rules gave the request).
	class, tenant string
	// sreq is the request to the scheduler once built (schedRequest),
	// until its pick.
	sreq *scheduler.Request
	// queued reports that the request waited in duet's admission queue,
	// for wait; refused is why admission refused it.
	queued  bool
	wait    time.Duration
	refused string
}

// newRun builds the engines, the scheduler and the first arrivals.
func newRun(cfg Config) (*run, error) {
	if cfg.Workload == nil {
		return nil, errors.New("clustersim: no workload")
	}
	if len(cfg.Cluster.Decode) == 0 {
		return nil, errors.New("clustersim: no decode engine")
	}
	if cfg.Drain <= 0 {
		cfg.Drain = 2 * time.Minute
	}
	if cfg.LoadInterval <= 0 {
		cfg.LoadInterval = 500 * time.Millisecond
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = time.Second
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	r := &run{cfg: cfg, rooms: rand.New(rand.NewPCG(cfg.Seed, 0x726f6f6d)), seen: map[uint64]struct{}{}, seenDecode: map[uint64]struct{}{},
		feedbackTo: rand.New(rand.NewPCG(cfg.Seed, 0x66656564)), bypass: rand.New(rand.NewPCG(cfg.Seed, 0x62797061))}
	r.end = cfg.Workload.Workload.Window + cfg.Drain
	r.restarts = slices.Clone(cfg.Restarts)
	aggregated := len(cfg.Cluster.Prefill) == 0
	priority := cfg.Admission != nil && cfg.Admission.EnginePriority
	for i, spec := range cfg.Cluster.Prefill {
		e, err := newEngine(scheduler.RolePrefill, i, spec, false, priority)
		if err != nil {
			return nil, err
		}
		r.prefill = append(r.prefill, e)
	}
	for i, spec := range cfg.Cluster.Decode {
		e, err := newEngine(scheduler.RoleDecode, i, spec, aggregated, priority)
		if err != nil {
			return nil, err
		}
		r.decode = append(r.decode, e)
	}
	r.engines = append(append([]*engine(nil), r.prefill...), r.decode...)
	for _, e := range r.engines {
		if e.blockTokens != cfg.Workload.blockTokens {
			return nil, fmt.Errorf("clustersim: workload hashed with %d-token blocks, %s engine %d uses %d", cfg.Workload.blockTokens, e.role, e.index, e.blockTokens)
		}
	}
	if cfg.Cache == CacheEvents {
		for _, e := range r.engines {
			r.followEvents(e)
		}
	}
	adm, err := newAdmission(cfg, cfg.Replicas)
	if err != nil {
		return nil, err
	}
	r.adm = adm
	if cfg.Oracle == OracleNone {
		for i := range cfg.Replicas {
			s, err := r.newScheduler()
			if err != nil {
				return nil, err
			}
			r.scheds = append(r.scheds, s)
			r.nextScrape = append(r.nextScrape, time.Duration(i)*cfg.LoadInterval/time.Duration(cfg.Replicas))
		}
	}
	for i, s := range cfg.Workload.Workload.Sessions {
		r.push(s.Start, i, 0)
	}
	return r, nil
}

// newScheduler builds a duet scheduler over the engines, on the run's
// clock and in-process transport.
func (r *run) newScheduler() (*scheduler.Scheduler, error) {
	byHost := map[string]*engine{}
	var prefill, decode []scheduler.EndpointSpec
	for _, e := range r.engines {
		byHost[e.addr] = e
		if e.role == scheduler.RolePrefill {
			prefill = append(prefill, scheduler.EndpointSpec{URL: e.url})
		} else {
			decode = append(decode, scheduler.EndpointSpec{URL: e.url})
		}
	}
	prefillSpec, err := policySpec(r.cfg.Policy.Prefill)
	if err != nil {
		return nil, fmt.Errorf("clustersim: prefill policy: %w", err)
	}
	decodeSpec, err := policySpec(r.cfg.Policy.Decode)
	if err != nil {
		return nil, fmt.Errorf("clustersim: decode policy: %w", err)
	}
	var sc scheduler.Config
	if r.cfg.Scheduler != nil {
		r.cfg.Scheduler(&sc)
	}
	sc.Prefill, sc.Decode = prefill, decode
	sc.PrefillPolicy, sc.DecodePolicy = prefillSpec, decodeSpec
	sc.EngineRanks = r.cfg.Policy.EngineRanks
	if r.cfg.Admission != nil {
		sc.Saturation = r.cfg.Admission.Saturation
	}
	sc.Clock = func() time.Time { return epoch.Add(r.now) }
	sc.HTTPClient = &http.Client{Transport: &transport{byHost: byHost, now: func() time.Duration { return r.now }}}
	sc.Health.Interval = -1
	sc.Load.Interval = r.cfg.LoadInterval
	if r.cfg.Cache != CacheEstimate {
		sc.Prefix.BlockTokens = r.cfg.Workload.blockTokens
	}
	switch r.cfg.Cache {
	case CacheEvents:
		v := fedView{kvevents.NewTracker[scheduler.TargetKey](kvevents.TrackerConfig{
			BlockTokens: r.cfg.Workload.blockTokens, Clock: sc.Clock, ProbeInterval: -1, MaxLag: -1,
		}, nil)}
		r.views = append(r.views, v)
		sc.CacheView = v
		sc.KVEvents = scheduler.KVEvents{Port: simEventPort}
	case CacheOracle:
		if r.oracle == nil {
			r.oracle = &oracleView{r: r, expected: map[scheduler.TargetKey]*kvevents.RankView{}}
		}
		sc.CacheView = r.oracle
	}
	if r.cfg.Share {
		self := len(r.scheds) // this replica's position, once appended
		sc.OnPicked = func(p scheduler.Picked) {
			for i, peer := range r.scheds {
				if i != self {
					peer.ApplyPicked(p)
				}
			}
		}
	}
	s, err := scheduler.New(sc, nil)
	if err != nil {
		return nil, fmt.Errorf("clustersim: %w", err)
	}
	if err := s.Discover(context.Background()); err != nil {
		return nil, fmt.Errorf("clustersim: discovery: %w", err)
	}
	return s, nil
}

// push schedules session s's turn k to arrive at t.
func (r *run) push(t time.Duration, s, k int) {
	r.seq++
	heap.Push(&r.arrivals, arrival{at: t, seq: r.seq, session: s, turn: k})
}

// loop runs the simulation: at each step it moves time to the earliest
// of the engines' next events, the next arrival, scrape and sample, and
// handles everything due then, in a fixed order (engines, scrape, sample,
// arrivals), so that runs are deterministic.
func (r *run) loop(ctx context.Context) error {
	r.preload()
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("clustersim: %w", err)
		}
		next := r.end
		for _, e := range r.engines {
			if t, ok := e.model.NextEvent(); ok && t < next {
				next = t
			}
		}
		if len(r.arrivals) > 0 {
			next = min(next, r.arrivals[0].at)
		}
		if t, ok := r.adm.nextDeadline(); ok {
			next = min(next, t)
		}
		busy := len(r.arrivals) > 0 || r.active > 0
		if !busy || next >= r.end {
			return nil
		}
		for _, t := range r.nextScrape {
			next = min(next, t)
		}
		next = min(next, r.nextSample)
		if len(r.deliveries) > 0 {
			next = min(next, r.deliveries[0].at)
		}
		if len(r.restarts) > 0 {
			next = min(next, r.restarts[0].At)
		}
		r.now = max(r.now, next)
		r.settle()
		r.restart()
		r.deliverEvents()
		for i, s := range r.scheds {
			if r.now >= r.nextScrape[i] {
				s.ScrapeLoads(ctx)
				r.nextScrape[i] += r.cfg.LoadInterval
			}
		}
		if r.now >= r.nextSample {
			r.sample()
			r.nextSample += r.cfg.SampleInterval
		}
		r.admitQueued(ctx)
		for len(r.arrivals) > 0 && r.arrivals[0].at <= r.now {
			a := heap.Pop(&r.arrivals).(arrival)
			r.dispatch(ctx, a.session, a.turn)
			r.settle()
		}
		r.admitQueued(ctx)
	}
}

// settle advances every engine to now and handles their changes until
// none is left (a change can start work on another engine at the same
// time).
func (r *run) settle() {
	for {
		changed := false
		for _, e := range r.engines {
			e.model.Advance(r.now)
			for _, it := range e.model.Changed() {
				changed = true
				r.onChange(e, it)
			}
		}
		if !changed {
			return
		}
	}
}

// restart empties the caches of the engines whose restart is due.
func (r *run) restart() {
	for len(r.restarts) > 0 && r.restarts[0].At <= r.now {
		rs := r.restarts[0]
		r.restarts = r.restarts[1:]
		pool := r.decode
		if rs.Role == scheduler.RolePrefill {
			pool = r.prefill
		}
		if rs.Engine < len(pool) {
			e := pool[rs.Engine]
			e.model.ResetCache(r.now)
			if r.oracle != nil {
				// What was routed there is gone too, as the events view
				// drops its overlay at AllBlocksCleared.
				r.oracle.forget(e.url)
			}
		}
	}
}

// preload submits cfg.Preload at time 0.
func (r *run) preload() {
	for _, p := range r.cfg.Preload {
		pool := r.decode
		if p.Role == scheduler.RolePrefill {
			pool = r.prefill
		}
		if p.Engine >= len(pool) {
			continue
		}
		e := pool[p.Engine]
		for i := range p.Requests {
			prompt := sim.Prompt{Tokens: p.PromptTokens, Blocks: preloadBlocks(i, p.PromptTokens/max(e.blockTokens, 1))}
			if it, err := e.model.Submit(0, p.Rank, prompt, p.OutputTokens); err == nil {
				it.Tag = preloadTag{}
			}
		}
	}
}

// preloadTag marks preloaded items.
type preloadTag struct{}

// preloadBlocks gives preloaded request i distinct block hashes, so that it
// neither hits nor seeds the cache of measured prompts.
func preloadBlocks(i, n int) []uint64 {
	out := make([]uint64, n)
	for j := range out {
		out[j] = uint64(i+1)<<32 | uint64(j) | 1<<63
	}
	return out
}

// dispatch handles the arrival of session s's turn k now: with admission
// it may wait in duet's queue first; otherwise it is sent at once.
func (r *run) dispatch(ctx context.Context, s, k int) {
	turn := &r.cfg.Workload.turns[s][k]
	session := &r.cfg.Workload.Workload.Sessions[s]
	q := &request{
		id: "s" + strconv.Itoa(s) + "t" + strconv.Itoa(k), session: s, turn: k,
		arrival: r.now, turnInfo: turn, pLegRank: scheduler.NoRank, dLegRank: scheduler.NoRank,
		class: session.Class, tenant: session.Tenant,
	}
	if n := len(r.scheds); n > 0 {
		q.replica = len(r.requests) % n // round robin over the replicas
	}
	r.requests = append(r.requests, q)
	r.active++
	if r.adm != nil {
		r.admitArrival(ctx, q)
		return
	}
	r.send(ctx, q)
}

// send routes q now: pick, then both legs at once.
func (r *run) send(ctx context.Context, q *request) {
	turn := q.turnInfo
	q.decodeBound = r.decodeBound(turn.prompt)
	q.bound = r.hitBound(turn.prompt)
	if err := r.route(ctx, q); err != nil {
		r.fail(q, err.Error())
		return
	}
	maxNew := turn.prompt.MaxTokens
	prompt := turn.prompt
	if r.adm != nil && r.adm.cfg.EnginePriority {
		// duet writes the class's priority; both legs get it.
		p := int64(r.adm.cfg.Queue.Classes[r.adm.classify(q)].Priority)
		prompt.Priority = &p
	}
	if q.pEng != nil {
		// The prefill waits in its bootstrap queue until the decode leg
		// has preallocated (sendDecodePrefix), as SGLang's does.
		it, err := q.pEng.model.SubmitBootstrap(r.now, q.pRank, prompt, maxNew)
		if err != nil {
			r.fail(q, "prefill: "+err.Error())
			return
		}
		it.Tag = q
		q.pItem = it
	}
	it, err := q.dEng.model.Submit(r.now, q.dRank, prompt, maxNew)
	if err != nil {
		if q.pItem != nil {
			q.pEng.model.Abort(r.now, q.pItem)
		}
		r.fail(q, "decode: "+err.Error())
		return
	}
	it.Tag = q
	q.dItem = it
	r.sendDecodePrefix(q)
}

// sendDecodePrefix bootstraps q's prefill once q's decode leg has
// preallocated the KV, as SGLang's decode does: the prefill leaves its
// bootstrap queue for its waiting queue (before, it computes nothing, so
// a decode short of KV holds its prefills back) and learns what the
// decode radix cache matched, sending only the KV beyond it
// (decode_prefix_len; 0 without the cache).
func (r *run) sendDecodePrefix(q *request) {
	if q.prefixSent || q.pItem == nil || q.dItem == nil || q.dItem.State() != sim.ItemTransfer {
		return
	}
	q.prefixSent = true
	q.decodeCached = q.dItem.DecodePrefix()
	q.pEng.model.Bootstrapped(r.now, q.pItem, q.decodeCached)
}

// decodeBound returns how many of prompt's tokens a decode cache holding
// every prompt and answer that decode engines cached before would hit,
// capped as the engine caps a hit; 0 when no decode engine caches.
func (r *run) decodeBound(prompt sim.Prompt) int {
	if len(r.seenDecode) == 0 && !r.decodeCaches() {
		return 0
	}
	matched := 0
	for _, h := range prompt.Blocks {
		_, inDecode := r.seenDecode[h]
		_, inPrompts := r.seen[h]
		if !inDecode && !inPrompts {
			break
		}
		matched++
	}
	bt := r.cfg.Workload.blockTokens
	if bt <= 0 {
		return 0
	}
	return min(matched, (prompt.Tokens-1)/bt) * bt
}

// decodeCaches reports whether any decode engine runs a decode radix cache.
func (r *run) decodeCaches() bool {
	for _, e := range r.cfg.Cluster.Decode {
		if e.DecodeRadixCache {
			return len(r.cfg.Cluster.Prefill) > 0
		}
	}
	return false
}

// hitBound returns how many of prompt's tokens a cache holding every
// prompt sent before would hit (block hashes are chained: a present block
// means its whole prefix was sent), capped as the engine caps a hit (the
// last token is always computed), and records prompt's blocks.
func (r *run) hitBound(prompt sim.Prompt) int {
	bt := r.cfg.Workload.blockTokens
	matched := 0
	for _, h := range prompt.Blocks {
		if _, ok := r.seen[h]; !ok {
			break
		}
		matched++
	}
	for _, h := range prompt.Blocks {
		r.seen[h] = struct{}{}
	}
	if bt <= 0 {
		return 0
	}
	return min(matched, (prompt.Tokens-1)/bt) * bt
}

// route chooses q's engines and ranks.
func (r *run) route(ctx context.Context, q *request) error {
	if r.cfg.Oracle != OracleNone {
		r.oracleRoute(q)
		return nil
	}
	if r.cfg.Bypass > 0 && r.bypass.Float64() < r.cfg.Bypass {
		r.routeAround(q)
		return nil
	}
	req := r.schedRequest(q)
	q.sreq = nil // the pick is its last use
	r.routing = &q.turnInfo.prompt
	d, err := r.scheds[q.replica].Pick(ctx, req)
	r.routing = nil
	if err != nil {
		return err
	}
	if d.Prefill != nil {
		q.pEng = r.engineAt(d.Prefill.Endpoint.URL)
		q.pRank, q.pLegRank = d.Prefill.Rank, d.Prefill.Rank
		if q.pRank == scheduler.NoRank {
			// follow_bootstrap_room: the prefill rank is a random
			// room % dp.
			q.pRank = r.rooms.IntN(q.pEng.dp)
		}
	}
	q.dEng = r.engineAt(d.Decode.Endpoint.URL)
	q.dRank, q.dLegRank = d.Decode.Rank, d.Decode.Rank
	if q.dRank == scheduler.NoRank {
		q.dRank = q.dEng.rr % q.dEng.dp
		q.dEng.rr++
	}
	return nil
}

// routeAround sends q past duet (Config.Bypass): engines and ranks drawn
// at random, as a client or another router that knows nothing of duet's
// state would; duet hears nothing of it.
func (r *run) routeAround(q *request) {
	q.bypassed = true
	if len(r.prefill) > 0 {
		q.pEng = r.prefill[r.bypass.IntN(len(r.prefill))]
		q.pRank = r.bypass.IntN(q.pEng.dp)
	}
	q.dEng = r.decode[r.bypass.IntN(len(r.decode))]
	q.dRank = r.bypass.IntN(q.dEng.dp)
}

// simEventPort is the KV event port the simulated engines are configured
// with (the scheduler only needs one to follow them; nothing listens).
const simEventPort = 5557

// engineAt returns the engine whose URL is url.
func (r *run) engineAt(url string) *engine {
	for _, e := range r.engines {
		if e.url == url {
			return e
		}
	}
	panic("clustersim: scheduler chose unknown engine " + url)
}

// onChange handles a change of item it on engine e.
func (r *run) onChange(e *engine, it *sim.Item) {
	if _, ok := it.Tag.(preloadTag); ok {
		if it.State() == sim.ItemTransfer && e.role == scheduler.RoleDecode {
			e.model.KVArrived(r.now, it)
		}
		return
	}
	q, ok := it.Tag.(*request)
	if !ok || q.finished {
		return
	}
	if it == q.pItem {
		if it.State() == sim.ItemDone && !q.prefillDone {
			q.prefillDone = true
			q.cached = it.CachedTokens()
			r.deliver(q)
		}
		return
	}
	// The decode (or aggregated) leg.
	if q.pItem != nil && it.State() == sim.ItemTransfer {
		r.sendDecodePrefix(q)
		r.deliver(q)
	}
	if q.firstAt == 0 && it.FirstTokenAt() > 0 {
		q.firstAt = it.FirstTokenAt()
	}
	if it.State() == sim.ItemDone {
		if q.pItem == nil {
			q.cached = it.CachedTokens()
		}
		r.finish(q, it)
	}
}

// deliver hands the prefill's KV to the decode leg once the prefill is
// done and the decode has preallocated; the prefill leg then answers.
func (r *run) deliver(q *request) {
	if q.delivered || !q.prefillDone || q.dItem == nil || q.dItem.State() != sim.ItemTransfer {
		return
	}
	q.delivered = true
	q.dEng.model.KVArrived(r.now, q.dItem)
	r.feedback(q, scheduler.RolePrefill, q.pEng, q.pLegRank, false)
}

// finish ends q with its decode leg's outcome.
func (r *run) finish(q *request, it *sim.Item) {
	q.finished = true
	r.active--
	q.doneAt = r.now
	q.generated = it.Generated()
	if it.Aborted() {
		q.err = "aborted"
	}
	for _, h := range it.CachedBlocks() {
		r.seenDecode[h] = struct{}{}
	}
	r.feedback(q, scheduler.RoleDecode, q.dEng, q.dLegRank, it.Aborted())
	r.feedback(q, "", nil, scheduler.NoRank, it.Aborted())
	r.nextTurn(q)
}

// fail ends q with err before it reached an engine (a 503 or a 400).
func (r *run) fail(q *request, err string) {
	q.finished = true
	r.active--
	q.err = err
	q.doneAt = r.now
	r.feedback(q, "", nil, scheduler.NoRank, true)
}

// nextTurn schedules the next turn of q's session after its think time,
// unless the session ended, q failed or the window is over.
func (r *run) nextTurn(q *request) {
	s := r.cfg.Workload.Workload.Sessions[q.session]
	if q.err != "" || q.turn+1 >= len(s.Turns) {
		return
	}
	at := r.now + s.Turns[q.turn].Think
	if at >= r.cfg.Workload.Workload.Window {
		return
	}
	r.push(at, q.session, q.turn+1)
}

// feedback reports a leg (or, with role "", the whole request) to the
// scheduler, as Envoy's access log would.
func (r *run) feedback(q *request, role scheduler.Role, e *engine, rank int, failed bool) {
	if len(r.scheds) == 0 || q.bypassed {
		return
	}
	to := q.replica
	if r.cfg.FeedbackAny {
		to = r.feedbackTo.IntN(len(r.scheds))
	}
	f := scheduler.Feedback{RequestID: q.id, Role: role, Rank: rank, Failed: failed}
	if e != nil {
		f.Address = e.addr
		f.PromptTokens = int64(q.turnInfo.prompt.Tokens)
	}
	if role == "" && r.decodeCaches() {
		// The whole request's usage, as Envoy's access log reports it;
		// only a decode radix cache reads the answer's length (given
		// here only where one runs, so that other runs stay as they were).
		f.CompletionTokens = int64(q.generated)
	}
	if r.cfg.Share {
		for _, s := range r.scheds {
			s.Complete(f)
		}
		return
	}
	r.scheds[to].Complete(f)
}

// arrival is a request due to be sent.
type arrival struct {
	at            time.Duration
	seq           uint64
	session, turn int
}

// arrivalHeap orders arrivals by time, then by scheduling order.
type arrivalHeap []arrival

func (h arrivalHeap) Len() int { return len(h) }
func (h arrivalHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h arrivalHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *arrivalHeap) Push(x any)   { *h = append(*h, x.(arrival)) }
func (h *arrivalHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	*h = old[:len(old)-1]
	return a
}
