package scheduler

import (
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Health defaults for the zero values of HealthConfig.
const (
	defaultHealthInterval     = 5 * time.Second
	defaultHealthTimeout      = time.Second
	defaultHealthPath         = "/health"
	defaultUnreachableToEject = 1
	defaultFailuresToEject    = 5
	defaultProbeFailures      = 2
	defaultBaseEjection       = 5 * time.Second
	defaultMaxEjection        = 2 * time.Minute
	// sweepInterval is how often half-open transitions are looked for when
	// probing is disabled (the probe loop looks for them every round).
	sweepInterval = time.Second
)

// Reasons for an ejection, as in Ejection.Reason and the reason label of
// duet_ejections_total.
const (
	// ReasonUnreachable: legs got no response from the engine's host
	// (connection refused or failed, no healthy host).
	ReasonUnreachable = "unreachable"
	// ReasonFailures: legs on one target failed (5xx, reset, timeout).
	ReasonFailures = "failures"
	// ReasonScrape: load scrapes whose connection failed or was cut (a timed-out
	// scrape does not count: a slow /v1/loads is not a dead engine).
	ReasonScrape = "scrape"
	// ReasonProbe: active health probes failed (non-200 or no answer).
	ReasonProbe = "probe"
)

// HealthConfig configures passive and active health checking and the
// ejection of unhealthy endpoints and targets. Zero values take the
// defaults; see docs/scheduling.md for the model.
type HealthConfig struct {
	// Interval between active probes of every configured endpoint
	// (default 5s). Negative disables probing.
	Interval time.Duration
	// Timeout bounds one probe (default 1s).
	Timeout time.Duration
	// Path is probed with GET on every endpoint's URL (default "/health").
	Path string
	// UnreachableToEject is how many legs in a row that got no response
	// from an endpoint's host eject the whole endpoint (default 1).
	// Negative: never.
	UnreachableToEject int
	// FailuresToEject is how many failed legs in a row (5xx, reset,
	// timeout; not unreachable) eject one target (default 5). Negative:
	// never.
	FailuresToEject int
	// ProbeFailures is how many failed probes in a row, or load scrapes in
	// a row whose connection failed (not timed out), eject the whole endpoint (default 2).
	// Negative: never.
	ProbeFailures int
	// BaseEjection is the first ejection's duration (default 5s). Each
	// ejection in a row without a recovery doubles it.
	BaseEjection time.Duration
	// MaxEjection caps the ejection duration (default 2m).
	MaxEjection time.Duration
}

// withDefaults returns c with the zero fields set to their defaults.
func (c HealthConfig) withDefaults() HealthConfig {
	if c.Interval == 0 {
		c.Interval = defaultHealthInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = defaultHealthTimeout
	}
	if c.Path == "" {
		c.Path = defaultHealthPath
	}
	if c.UnreachableToEject == 0 {
		c.UnreachableToEject = defaultUnreachableToEject
	}
	if c.FailuresToEject == 0 {
		c.FailuresToEject = defaultFailuresToEject
	}
	if c.ProbeFailures == 0 {
		c.ProbeFailures = defaultProbeFailures
	}
	if c.BaseEjection <= 0 {
		c.BaseEjection = defaultBaseEjection
	}
	if c.MaxEjection <= 0 {
		c.MaxEjection = defaultMaxEjection
	}
	c.MaxEjection = max(c.MaxEjection, c.BaseEjection)
	return c
}

// Ejection describes one ejection, as passed to Config.OnEject.
type Ejection struct {
	// Role is the ejected endpoint's role.
	Role Role
	// URL is the endpoint's base URL, as in Endpoint.URL.
	URL string
	// Address is the endpoint's "ip:port" as Envoy sees it (Endpoint.Address);
	// empty while a hostname has never been resolved.
	Address string
	// Rank is the ejected target's DP rank, or NoRank when the whole
	// endpoint is ejected (a single-rank decode target has NoRank too).
	Rank int
	// Reason is one of ReasonUnreachable, ReasonFailures (a target
	// ejection), ReasonScrape and ReasonProbe.
	Reason string
	// For is how long the ejection lasts before the target or endpoint is
	// half-open (pickable again, on probation).
	For time.Duration
}

// signal is a kind of health evidence; each counts its own consecutive
// failures.
type signal uint8

const (
	sigUnreachable signal = iota // endpoint: legs with no response from the host
	sigFailures                  // target: failed legs that reached the engine
	sigScrape                    // endpoint: load scrapes whose connection failed or was cut
	sigProbe                     // endpoint: failed health probes
	numSignals
)

// reason returns the Ejection.Reason of s.
func (s signal) reason() string {
	switch s {
	case sigUnreachable:
		return ReasonUnreachable
	case sigFailures:
		return ReasonFailures
	case sigScrape:
		return ReasonScrape
	default:
		return ReasonProbe
	}
}

// phase is where a health record stands.
type phase uint8

const (
	phaseHealthy  phase = iota
	phaseEjected        // picks skip it until the ejection's end
	phaseHalfOpen       // pickable again; the next failure re-ejects, the next success recovers
)

// healthState is the health of one endpoint (all its targets) or of one
// target. Picks read until without a lock; the rest is guarded by
// health.mu. A removed record (its endpoint left the configuration, or its
// target left the snapshot) ignores all evidence: goroutines that looked it
// up before the removal may still report on it.
type healthState struct {
	// until is when the current ejection ends (Unix ns); picks skip the
	// endpoint's or target's targets while now < until.
	until atomic.Int64

	// Identity, immutable.
	role   Role
	url    string // the endpoint's Endpoint.URL
	rank   int    // NoRank for an endpoint record
	target string // Target.String() for a target record; "" for an endpoint

	// Guarded by health.mu.
	phase     phase
	reason    signal
	fails     [numSignals]int // consecutive failures per signal
	ejections int             // ejections in a row without a recovery
	removed   bool            // no longer in use: evidence is ignored
}

// ejected reports whether picks skip rec's targets at now (Unix ns). A nil
// record is never ejected.
func (rec *healthState) ejected(now int64) bool { return rec != nil && rec.until.Load() > now }

// health keeps the health records and applies the ejection model. Its
// methods return what happened as healthEvents; the caller reports them
// (logs, OnEject) outside the lock with Scheduler.report.
type health struct {
	cfg     HealthConfig
	metrics *metrics // nil without metrics
	// endpoints maps Endpoint.URL to its endpoint's record. The map is
	// copy-on-write: readers (probes, scrapes, feedback, snapshot builds)
	// load it without a lock; updateEndpoints publishes a new one under mu.
	endpoints atomic.Pointer[map[string]*healthState]
	mu        sync.Mutex                // guards the records' mutable fields, unhealthy, and writes of endpoints
	unhealthy map[*healthState]struct{} // ejected or half-open records
	// count is len(unhealthy), read by picks without mu: while it is zero
	// no target is ejected and picks skip the per-target checks.
	count atomic.Int64
}

func newHealth(cfg HealthConfig, m *metrics) *health {
	h := &health{
		cfg:       cfg.withDefaults(),
		metrics:   m,
		unhealthy: map[*healthState]struct{}{},
	}
	h.endpoints.Store(&map[string]*healthState{})
	return h
}

// endpoint returns the record of the endpoint whose Endpoint.URL is url, or
// nil if there is none (the endpoint was removed from the configuration).
func (h *health) endpoint(url string) *healthState {
	return (*h.endpoints.Load())[url]
}

// endpointRef names an endpoint record to create.
type endpointRef struct {
	role Role
	url  string
}

// updateEndpoints removes the records of the endpoints whose URLs are in
// remove, then creates records for add, and publishes the new map. Records
// of other endpoints are kept as they are. A removed record leaves the
// unhealthy set and ignores later evidence, and its gauge is deleted.
// Callers serialize updates (New, or Scheduler.discoverMu).
func (h *health) updateEndpoints(add []endpointRef, remove []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := *h.endpoints.Load()
	next := make(map[string]*healthState, len(old)+len(add))
	for url, rec := range old {
		next[url] = rec
	}
	for _, url := range remove {
		rec, ok := next[url]
		if !ok {
			continue
		}
		delete(next, url)
		h.forgetLocked(rec)
		if h.metrics != nil {
			h.metrics.endpointEjected.DeleteLabelValues(string(rec.role), rec.url)
		}
	}
	for _, ref := range add {
		next[ref.url] = &healthState{role: ref.role, url: ref.url, rank: NoRank}
		if h.metrics != nil {
			h.metrics.endpointEjected.WithLabelValues(string(ref.role), ref.url).Set(0)
		}
	}
	h.endpoints.Store(&next)
}

// forgetTarget retires the record of a target that left the snapshot: its
// health starts over if the target comes back.
func (h *health) forgetTarget(rec *healthState) {
	if rec == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, unhealthy := h.unhealthy[rec]; unhealthy {
		h.setGauge(rec, 0)
	}
	h.forgetLocked(rec)
}

// forgetLocked marks rec removed and takes it out of the unhealthy set.
// Caller holds mu.
func (h *health) forgetLocked(rec *healthState) {
	rec.removed = true
	if _, ok := h.unhealthy[rec]; ok {
		delete(h.unhealthy, rec)
		h.count.Store(int64(len(h.unhealthy)))
	}
}

// newTargetHealth creates the record of a target.
func newTargetHealth(t Target) *healthState {
	return &healthState{role: t.Endpoint.Role, url: t.Endpoint.URL, rank: t.Rank, target: t.String()}
}

// eventKind is what happened to a health record.
type eventKind uint8

const (
	eventEject eventKind = iota
	eventHalfOpen
	eventRecover
)

// healthEvent is one transition of a health record, to be reported.
type healthEvent struct {
	kind      eventKind
	rec       *healthState
	reason    signal
	failures  int           // consecutive failures that led to an ejection
	ejections int           // the ejection's position in a row of them, from 1
	dur       time.Duration // the ejection's duration
}

// threshold returns how many consecutive failures of sig eject; 0 means
// never.
func (h *health) threshold(sig signal) int {
	var n int
	switch sig {
	case sigUnreachable:
		n = h.cfg.UnreachableToEject
	case sigFailures:
		n = h.cfg.FailuresToEject
	default:
		n = h.cfg.ProbeFailures
	}
	return max(n, 0)
}

// duration returns the length of an ejection preceded by k others in a
// row: BaseEjection × 2^k, capped at MaxEjection.
func (h *health) duration(k int) time.Duration {
	d := h.cfg.BaseEjection
	for range k {
		if d >= h.cfg.MaxEjection/2 {
			return h.cfg.MaxEjection
		}
		d *= 2
	}
	return min(d, h.cfg.MaxEjection)
}

// fail records one failure of sig on rec at now and appends the resulting
// transitions to evs. A nil or removed rec is ignored. A failure while ejected is ignored; a failure while
// half-open re-ejects at once.
func (h *health) fail(rec *healthState, sig signal, now time.Time, evs []healthEvent) []healthEvent {
	if rec == nil {
		return evs
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if rec.removed {
		return evs
	}
	evs = h.settle(rec, now, evs)
	switch rec.phase {
	case phaseEjected:
		return evs
	case phaseHalfOpen:
		rec.fails[sig]++
		return h.eject(rec, sig, now, evs)
	}
	rec.fails[sig]++
	if n := h.threshold(sig); n > 0 && rec.fails[sig] >= n {
		evs = h.eject(rec, sig, now, evs)
	}
	return evs
}

// reset ends sig's run of consecutive failures on rec without being a
// success that recovers it (a leg that reached the engine but failed, a
// scrape answered with an error).
func (h *health) reset(rec *healthState, sig signal) {
	if rec == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	rec.fails[sig] = 0
}

// succeed records a success of sig on rec at now: it ends sig's run of
// failures and, if rec is half-open, recovers it unless the success cannot
// speak for the ejection's reason (a scrape answer does not clear a probe
// ejection: an engine can serve loads while its /health fails).
func (h *health) succeed(rec *healthState, sig signal, now time.Time, evs []healthEvent) []healthEvent {
	if rec == nil {
		return evs
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if rec.removed {
		return evs
	}
	evs = h.settle(rec, now, evs)
	rec.fails[sig] = 0
	if rec.phase != phaseHalfOpen || (sig == sigScrape && rec.reason == sigProbe) {
		return evs
	}
	rec.phase = phaseHealthy
	rec.ejections = 0
	rec.fails = [numSignals]int{}
	rec.until.Store(0)
	delete(h.unhealthy, rec)
	h.count.Store(int64(len(h.unhealthy)))
	h.setGauge(rec, 0)
	if h.metrics != nil {
		h.metrics.recoveries.WithLabelValues(string(rec.role), rec.url).Inc()
	}
	return append(evs, healthEvent{kind: eventRecover, rec: rec, reason: rec.reason})
}

// sweep moves every record whose ejection has ended to half-open.
func (h *health) sweep(now time.Time) []healthEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var evs []healthEvent
	for rec := range h.unhealthy {
		evs = h.settle(rec, now, evs)
	}
	return evs
}

// settle moves rec to half-open if its ejection has ended. Caller holds mu.
func (h *health) settle(rec *healthState, now time.Time, evs []healthEvent) []healthEvent {
	if rec.phase == phaseEjected && !rec.ejected(now.UnixNano()) {
		rec.phase = phaseHalfOpen
		evs = append(evs, healthEvent{kind: eventHalfOpen, rec: rec, reason: rec.reason})
	}
	return evs
}

// eject ejects rec for sig at now. Caller holds mu.
func (h *health) eject(rec *healthState, sig signal, now time.Time, evs []healthEvent) []healthEvent {
	d := h.duration(rec.ejections)
	rec.ejections++
	rec.phase, rec.reason = phaseEjected, sig
	rec.until.Store(now.Add(d).UnixNano())
	ev := healthEvent{kind: eventEject, rec: rec, reason: sig, failures: rec.fails[sig], ejections: rec.ejections, dur: d}
	rec.fails = [numSignals]int{}
	h.unhealthy[rec] = struct{}{}
	h.count.Store(int64(len(h.unhealthy)))
	h.setGauge(rec, 1)
	if h.metrics != nil {
		h.metrics.ejections.WithLabelValues(string(rec.role), rec.url, sig.reason()).Inc()
	}
	return append(evs, ev)
}

// setGauge sets rec's ejected gauge: 1 from an ejection until the recovery
// (half-open included). Caller holds mu.
func (h *health) setGauge(rec *healthState, v float64) {
	if h.metrics == nil {
		return
	}
	if rec.target == "" {
		h.metrics.endpointEjected.WithLabelValues(string(rec.role), rec.url).Set(v)
	} else {
		h.metrics.targetEjected.WithLabelValues(string(rec.role), rec.target).Set(v)
	}
}

// report logs health transitions and calls OnEject for ejections, which it
// returns. It runs outside every scheduler lock, in the goroutine that
// observed the evidence.
func (s *Scheduler) report(evs []healthEvent) (ejected []Ejection) {
	for _, ev := range evs {
		rec := ev.rec
		fields := []zap.Field{zap.String("role", string(rec.role)), zap.String("endpoint", rec.url)}
		what := "endpoint"
		if rec.target != "" {
			what = "target"
			fields = append(fields, zap.String("target", rec.target))
		}
		fields = append(fields, zap.String("reason", ev.reason.reason()))
		switch ev.kind {
		case eventEject:
			s.log.Warn(what+" ejected", append(fields,
				zap.Int("consecutive_failures", ev.failures),
				zap.Int("ejections_in_a_row", ev.ejections),
				zap.Duration("duration", ev.dur))...)
			e := Ejection{
				Role: rec.role, URL: rec.url, Address: s.addressOf(rec.url),
				Rank: rec.rank, Reason: ev.reason.reason(), For: ev.dur,
			}
			ejected = append(ejected, e)
			if s.onEject != nil {
				s.onEject(e)
			}
		case eventHalfOpen:
			s.log.Info(what+" half-open: pickable again, on probation", fields...)
		case eventRecover:
			s.log.Info(what+" recovered", fields...)
		}
	}
	return ejected
}

// addressOf returns the current Address of the endpoint with base URL url.
func (s *Scheduler) addressOf(url string) string {
	for _, ep := range s.snap.Load().endpoints {
		if ep.URL == url {
			return ep.Address
		}
	}
	return ""
}

// sweepHealth reports the ejections that ended since the last sweep.
func (s *Scheduler) sweepHealth() {
	s.report(s.health.sweep(s.now()))
}
