package kvevents

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Defaults of TrackerConfig's zero values.
const (
	DefaultMaxPages      = 1 << 20
	DefaultExpectFor     = 30 * time.Second
	DefaultMaxLag        = 5 * time.Second
	DefaultWarmup        = time.Minute
	DefaultProbeInterval = 2 * time.Second
)

// probeTimeout bounds one TCP probe.
const probeTimeout = time.Second

// TrackerConfig configures a Tracker.
type TrackerConfig struct {
	// BlockTokens is duet's token block size: the pool's
	// prefix.Hasher.BlockTokens, a multiple of every engine's page size.
	BlockTokens int
	// MaxPages bounds each rank's view (default 1<<20 pages); a view that
	// outgrows it, or four times its engine's KV capacity once the
	// scheduler has scraped it (SetCapacity), starts over, and warms up
	// again.
	MaxPages int
	// ExpectFor is how long blocks routed to a rank count as cached there
	// before the engine reports them (default 30s). A report ends the
	// expectation at once; the deadline only ends those of requests that
	// never reached the engine.
	ExpectFor time.Duration
	// MaxLag is how far behind the engine's clock a batch may arrive
	// before the rank falls back (default 5s; negative: never).
	MaxLag time.Duration
	// Warmup is how long a rank whose view started mid-stream (duet
	// subscribed to a running engine, or lost batches it could not
	// replay) counts its view as partial: a match then takes the larger
	// of the view and the estimate (default 1m). A stream followed from
	// the publisher's first batch, or from an AllBlocksCleared, is
	// complete at once.
	Warmup time.Duration
	// ProbeInterval is the time between TCP probes of each rank's event
	// port (default 2s; negative: no probes). A rank whose port refuses
	// falls back until it answers again: a SUB socket never says that its
	// publisher died.
	ProbeInterval time.Duration
	// Clock, if set, replaces time.Now (the routing-quality simulator runs
	// in virtual time).
	Clock func() time.Time
}

// Target is one (engine, rank) whose cache a Tracker follows.
type Target[K comparable] struct {
	// Key identifies the rank to the Tracker's caller.
	Key K
	// Name names the rank in logs and metrics (engine URL and rank).
	Name string
	// Source is where the rank publishes. A zero Source means the caller
	// feeds the rank itself (Tracker.Handler), as the simulator does.
	Source Source
}

// State is how far a rank's view can be trusted.
type State int32

// The states of a rank.
const (
	// StateFallback: no view (not subscribed yet, publisher unreachable,
	// or events lagging): the caller uses its own estimate.
	StateFallback State = iota
	// StateWarming: the view holds what was reported since it started,
	// but the engine may hold more.
	StateWarming
	// StateLive: the view is the engine's cache.
	StateLive
)

// String names the state.
func (s State) String() string {
	switch s {
	case StateWarming:
		return "warming"
	case StateLive:
		return "live"
	}
	return "fallback"
}

// Match is what a rank's view holds of a request's blocks.
type Match struct {
	// GPU is the number of leading blocks held on the GPU (or expected
	// there); Any the number held in any tier (GPU <= Any).
	GPU, Any int
	// Blocks is how many blocks the rank holds in all.
	Blocks int
	// Partial reports a warming view: the engine may hold more.
	Partial bool
}

// Tracker follows the KV events of a pool's ranks: one subscription and one
// RankView per rank, and whether each can be trusted. Ranks whose events
// stop fall back one by one. Safe for concurrent use.
type Tracker[K comparable] struct {
	cfg TrackerConfig
	log *zap.Logger
	now func() time.Time

	mu    sync.RWMutex
	ranks map[K]*rank[K]
	// ctx is Run's context: subscriptions start under it; nil before Run.
	ctx context.Context
}

// rank is one followed rank. Its Handler methods run in its subscriber's
// goroutine (or the caller's, when fed in process), never concurrently.
type rank[K comparable] struct {
	t      *Tracker[K]
	target Target[K]
	view   *RankView
	sub    *Subscriber
	cancel context.CancelFunc

	// fresh: the next batch is the first since a reset.
	fresh bool
	// started: the view has started (a reset has happened).
	started atomic.Bool
	// complete: the view was followed from an empty cache.
	complete atomic.Bool
	// warmSince is when the view last started (Unix nanoseconds).
	warmSince atomic.Int64
	// lagging: the last live batch arrived later than MaxLag (replayed
	// batches leave it as it is, and a replay that reaches the publisher's
	// newest batch clears it); down: the last probe of the event port
	// failed.
	lagging, down atomic.Bool
	// downSince is when the port was found unreachable (Unix nanoseconds).
	downSince atomic.Int64
	// lastTS is the last batch's engine timestamp (float64 bits).
	lastTS atomic.Uint64
	// lastState is the state last logged, for transitions.
	lastState atomic.Int32
	// fallbacks counts, by reason, the times the rank was found
	// unreachable or started to lag.
	fallbacks [numFallbackReasons]atomic.Uint64
}

// Reasons for a fallback, as metrics label them.
const (
	fallbackUnreachable = iota
	fallbackLag
	numFallbackReasons
)

var fallbackReasonNames = [numFallbackReasons]string{"unreachable", "lag"}

// NewTracker returns a tracker with no ranks. A nil log discards logs.
func NewTracker[K comparable](cfg TrackerConfig, log *zap.Logger) *Tracker[K] {
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.BlockTokens <= 0 {
		cfg.BlockTokens = 16
	}
	if cfg.MaxPages <= 0 {
		cfg.MaxPages = DefaultMaxPages
	}
	if cfg.ExpectFor <= 0 {
		cfg.ExpectFor = DefaultExpectFor
	}
	if cfg.MaxLag == 0 {
		cfg.MaxLag = DefaultMaxLag
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = DefaultWarmup
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	t := &Tracker[K]{cfg: cfg, log: log, now: time.Now, ranks: map[K]*rank[K]{}}
	if cfg.Clock != nil {
		t.now = cfg.Clock
	}
	return t
}

// SetTargets makes the tracker follow exactly targets: ranks no longer
// listed are dropped with their subscriptions, new ones start (at once
// when Run is running, else when it starts), and a rank whose Source
// changed starts over.
func (t *Tracker[K]) SetTargets(targets []Target[K]) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keep := make(map[K]bool, len(targets))
	for _, tg := range targets {
		keep[tg.Key] = true
		if r, ok := t.ranks[tg.Key]; ok {
			if r.target.Source == tg.Source {
				r.target.Name = tg.Name
				continue
			}
			r.stop()
		}
		r := &rank[K]{t: t, target: tg, view: NewRankView(t.cfg.BlockTokens, t.cfg.MaxPages)}
		r.lastState.Store(int32(StateFallback))
		t.ranks[tg.Key] = r
		if t.ctx != nil {
			r.start(t.ctx)
		}
	}
	for k, r := range t.ranks {
		if !keep[k] {
			r.stop()
			delete(t.ranks, k)
		}
	}
}

// Run subscribes to every rank and probes their ports until ctx ends.
func (t *Tracker[K]) Run(ctx context.Context) {
	t.mu.Lock()
	t.ctx = ctx
	for _, r := range t.ranks {
		r.start(ctx)
	}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.ctx = nil
		for _, r := range t.ranks {
			r.stop()
		}
		t.mu.Unlock()
	}()
	if t.cfg.ProbeInterval < 0 {
		<-ctx.Done()
		return
	}
	tick := time.NewTicker(t.cfg.ProbeInterval)
	defer tick.Stop()
	for {
		t.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// probe dials every subscribed rank's event port once, concurrently.
func (t *Tracker[K]) probe(ctx context.Context) {
	t.mu.RLock()
	var rs []*rank[K]
	for _, r := range t.ranks {
		if r.target.Source.Endpoint != "" {
			rs = append(rs, r)
		}
	}
	t.mu.RUnlock()
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() {
			err := dial(ctx, r.target.Source.Endpoint)
			if ctx.Err() != nil {
				return
			}
			r.setDown(err)
			r.observe()
		})
	}
	wg.Wait()
}

// setDown records a probe's outcome (err nil: the port answered). Each
// change is logged once, and each time the port is found unreachable
// counts a fallback, whether or not the rank had been reachable (or live)
// before: a port that never answers counts once.
func (r *rank[K]) setDown(err error) {
	now := r.t.now()
	if err != nil {
		if !r.down.Swap(true) {
			r.downSince.Store(now.UnixNano())
			r.fallbacks[fallbackUnreachable].Add(1)
			r.t.log.Warn("KV event port unreachable: the rank uses the prefix estimate until it answers (logged again when it does)",
				zap.String("target", r.target.Name), zap.String("endpoint", r.target.Source.Endpoint), zap.Error(err))
		}
		return
	}
	if r.down.Swap(false) {
		r.t.log.Info("KV event port reachable again", zap.String("target", r.target.Name),
			zap.Duration("unreachable_for", now.Sub(time.Unix(0, r.downSince.Load()))))
	}
}

// dial opens and closes a TCP connection to a tcp:// endpoint.
func dial(ctx context.Context, endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "tcp" || u.Host == "" {
		return fmt.Errorf("endpoint %q is not tcp://host:port", endpoint)
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return err
	}
	return c.Close()
}

// start subscribes r under ctx, unless the caller feeds it. The caller
// holds t.mu.
func (r *rank[K]) start(ctx context.Context) {
	if r.target.Source.Endpoint == "" || r.sub != nil {
		return
	}
	ctx, r.cancel = context.WithCancel(ctx)
	r.sub = NewSubscriber(r.target.Source, r, r.t.log)
	go r.sub.Run(ctx)
}

// stop ends r's subscription. The caller holds t.mu.
func (r *rank[K]) stop() {
	if r.cancel != nil {
		r.cancel()
	}
}

// Handler returns the Handler that feeds key's view, for callers that
// deliver a rank's events themselves (a Target with a zero Source); nil
// when key is not followed.
func (t *Tracker[K]) Handler(key K) Handler {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if r, ok := t.ranks[key]; ok {
		return r
	}
	return nil
}

// Reset implements Handler: the view starts over, warming.
func (r *rank[K]) Reset(reason string) {
	r.view.Reset(reason)
	r.fresh = true
	r.complete.Store(false)
	r.warmSince.Store(r.t.now().UnixNano())
	if r.started.Swap(true) {
		r.t.log.Info("KV events start over: the rank's view warms up again",
			zap.String("target", r.target.Name), zap.String("reason", reason))
	}
	r.observe()
}

// Apply implements Handler.
func (r *rank[K]) Apply(seq uint64, b Batch) {
	if !r.started.Load() {
		r.Reset("first batch")
	}
	if r.fresh {
		r.fresh = false
		if seq == 0 {
			r.complete.Store(true) // the publisher's first batch
		}
	}
	r.view.Apply(seq, b)
	for i := range b.Events {
		if b.Events[i].Kind == AllBlocksCleared {
			r.complete.Store(true)
		}
	}
	r.lastTS.Store(math.Float64bits(b.TS))
	switch {
	case b.Current:
		// The publisher's newest batch, fetched just now: the view is
		// current, however long ago the engine stamped it (an idle
		// engine's last batch).
		if r.lagging.Swap(false) {
			r.t.log.Info("KV events caught up by replay", zap.String("target", r.target.Name))
		}
	case b.Replayed:
		// History fetched to fill a gap or a restart: a live batch
		// follows, and its lag counts.
	case r.t.cfg.MaxLag > 0 && b.TS > 0:
		r.measureLag(r.t.now().Sub(time.Unix(0, int64(b.TS*1e9))))
	}
	r.observe()
}

// measureLag records how late a live batch arrived; the rank lags while
// that is above MaxLag. Each change is logged once, and each start of a
// lag counts a fallback.
func (r *rank[K]) measureLag(lag time.Duration) {
	lagging := lag > r.t.cfg.MaxLag
	was := r.lagging.Swap(lagging)
	switch {
	case lagging && !was:
		r.fallbacks[fallbackLag].Add(1)
		r.t.log.Warn("KV events lag: the rank falls back to the prefix estimate",
			zap.String("target", r.target.Name), zap.Duration("lag", lag), zap.Duration("max_lag", r.t.cfg.MaxLag))
	case !lagging && was:
		r.t.log.Info("KV events caught up", zap.String("target", r.target.Name), zap.Duration("lag", lag))
	}
}

// state returns r's state now.
func (r *rank[K]) state(now time.Time) State {
	switch {
	case !r.started.Load() || r.down.Load() || r.lagging.Load():
		return StateFallback
	case r.complete.Load() || now.UnixNano()-r.warmSince.Load() >= int64(r.t.cfg.Warmup):
		return StateLive
	}
	return StateWarming
}

// observe logs a change of r's state (setDown and measureLag count and
// log the fallbacks' reasons).
func (r *rank[K]) observe() {
	s := r.state(r.t.now())
	old := State(r.lastState.Swap(int32(s)))
	if s == old {
		return
	}
	if s == StateLive {
		r.t.log.Info("KV events live: the rank's view is its cache", zap.String("target", r.target.Name))
	}
}

// Match returns what key's view holds of blocks (duet's token block
// hashes of a request, from block 0); false when key is not followed or
// has fallen back.
func (t *Tracker[K]) Match(key K, blocks []uint64) (Match, bool) {
	t.mu.RLock()
	r, ok := t.ranks[key]
	t.mu.RUnlock()
	if !ok {
		return Match{}, false
	}
	now := t.now()
	s := r.state(now)
	if s == StateFallback {
		return Match{}, false
	}
	gpu, anyTier := r.view.Match(blocks, now.UnixNano())
	n, _ := r.view.Blocks()
	return Match{GPU: gpu, Any: anyTier, Blocks: n, Partial: s == StateWarming}, true
}

// Routed records that blocks were routed to key's rank at now: they count
// as cached there until the engine reports them or ExpectFor passes.
func (t *Tracker[K]) Routed(key K, blocks []uint64, now time.Time) {
	t.mu.RLock()
	r, ok := t.ranks[key]
	t.mu.RUnlock()
	if ok {
		r.view.Expect(blocks, now.Add(t.cfg.ExpectFor).UnixNano(), now.UnixNano())
	}
}

// SetCapacity bounds key's view by its engine's KV capacity in tokens
// (RankView.SetCapacity); the scheduler calls it after each scrape.
func (t *Tracker[K]) SetCapacity(key K, tokens int64) {
	t.mu.RLock()
	r, ok := t.ranks[key]
	t.mu.RUnlock()
	if ok {
		r.view.SetCapacity(int(min(tokens, int64(1)<<40)))
	}
}

// RankStatus is one rank's view, for status pages and metrics.
type RankStatus[K comparable] struct {
	Target[K]
	State State
	// Blocks and Pages are what the view holds.
	Blocks, Pages int
	// LastBatch is the engine's timestamp of the last batch (zero before
	// one arrived); Lag is how long before now it was.
	LastBatch time.Time
	Lag       time.Duration
	// Stats are the subscription's counters (zero for a rank fed in
	// process); View the view's.
	Stats Stats
	View  ViewCounts
	// Fallbacks counts by reason the times the rank fell back: its port
	// was found unreachable ("unreachable"; a port that never answered
	// counts once), or its live batches started to arrive later than
	// MaxLag ("lag"), whatever its state before.
	Fallbacks map[string]uint64
}

// Status returns every followed rank's status.
func (t *Tracker[K]) Status() []RankStatus[K] {
	now := t.now()
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]RankStatus[K], 0, len(t.ranks))
	for _, r := range t.ranks {
		out = append(out, r.status(now))
	}
	return out
}

// RankStatus returns key's status; false when key is not followed.
func (t *Tracker[K]) RankStatus(key K) (RankStatus[K], bool) {
	now := t.now()
	t.mu.RLock()
	defer t.mu.RUnlock()
	r, ok := t.ranks[key]
	if !ok {
		return RankStatus[K]{}, false
	}
	return r.status(now), true
}

// status returns r's status at now. The caller holds t.mu.
func (r *rank[K]) status(now time.Time) RankStatus[K] {
	st := RankStatus[K]{Target: r.target, State: r.state(now), View: r.view.Counts(), Fallbacks: map[string]uint64{}}
	st.Blocks, st.Pages = r.view.Blocks()
	if ts := math.Float64frombits(r.lastTS.Load()); ts > 0 {
		st.LastBatch = time.Unix(0, int64(ts*1e9))
		st.Lag = now.Sub(st.LastBatch)
	}
	if r.sub != nil {
		st.Stats = r.sub.Stats()
	}
	for i := range r.fallbacks {
		st.Fallbacks[fallbackReasonNames[i]] = r.fallbacks[i].Load()
	}
	return st
}
