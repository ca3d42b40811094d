package legs

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/legtrace"
	"github.com/duet-router/duet/scheduler"
)

// Defaults of Options.
const (
	defaultTTL         = 15 * time.Minute
	defaultMaxInFlight = 64
)

// Reasons for an abort, the "reason" label of duet_leg_aborts_total.
const (
	ReasonPrefillFailed  = "prefill_failed"  // the prefill leg failed: abort decode
	ReasonDecodeFailed   = "decode_failed"   // the decode leg failed: abort prefill
	ReasonClientGone     = "client_gone"     // the client request ended badly: abort prefill
	ReasonPrefillEjected = "prefill_ejected" // the prefill engine was ejected: abort decode
	ReasonDecodeEjected  = "decode_ejected"  // the decode engine was ejected: abort prefill
)

// Aborter aborts requests on an engine by rid.
type Aborter interface {
	Abort(ctx context.Context, engineURL string, rids []string) error
}

// Options configure a Tracker.
type Options struct {
	// Aborter carries out aborts; required.
	Aborter Aborter
	// TTL forgets requests whose legs never both reported (lost feedback);
	// default 15m.
	TTL time.Duration
	// MaxInFlight bounds concurrent abort calls; default 64. Aborts past it
	// are dropped and counted (outcome "dropped").
	MaxInFlight int
	// AbortRetries are the delays after which an abort is sent again while
	// the aborted leg has not ended; nil means 100ms, 500ms, 2s, and an
	// empty list sends each abort once.
	AbortRetries []time.Duration
	// Logger; nil means none.
	Logger *zap.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
}

// Tracker follows the legs of PD requests. Its methods are safe for
// concurrent use. Track is called by extproc when a request is routed,
// Complete (accesslog.Sink) with each access-log entry, and Ejected by the
// scheduler's health checks.
type Tracker struct {
	opts Options
	log  *zap.Logger
	now  func() time.Time
	sem  chan struct{}

	mu   sync.Mutex
	reqs map[string]*request

	aborts  *prometheus.CounterVec
	retries *prometheus.CounterVec
	tracked prometheus.GaugeFunc
	wg      sync.WaitGroup
}

// request is one PD request's legs.
type request struct {
	id       string
	rids     []string
	started  time.Time
	prefill  leg
	decode   leg
	finished bool // the whole-request entry arrived
}

// leg is one leg's engine and state.
type leg struct {
	url   string // "" once the leg moved to a host duet does not know
	rank  int
	done  bool // nothing more to do: its entry arrived, or it was aborted
	ended bool // its access-log entry arrived
	// retried: an attempt of the decode leg could not connect, and Envoy
	// retries it once (the route's connect-failure retry) on fallback.
	retried  bool
	fallback string // the decode engine listed second, or ""
}

// defaultAbortRetries are the delays after which an abort is sent again while the
// aborted leg's access-log entry has not arrived. SGLang drops an abort
// whose rid it has not registered yet (the tokenizer checks the rid
// exactly), and an abort can outrun the request it names: a prefill that
// fails on arrival is reported before the decode engine has parsed the
// decode leg. Repeating it until the leg ends closes that race.
var defaultAbortRetries = []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}

// leg returns r's leg of role.
func (r *request) leg(role scheduler.Role) *leg {
	if role == scheduler.RolePrefill {
		return &r.prefill
	}
	return &r.decode
}

// partner returns the other role of a PD request.
func partner(role scheduler.Role) scheduler.Role {
	if role == scheduler.RolePrefill {
		return scheduler.RoleDecode
	}
	return scheduler.RolePrefill
}

// abortLeg marks r's leg of role done and returns the job that aborts it.
func (r *request) abortLeg(role scheduler.Role, reason string) *abortJob {
	l := r.leg(role)
	l.done = true
	return &abortJob{id: r.id, role: role, url: l.url, rids: r.rids, reason: reason}
}

// New returns a Tracker.
func New(opts Options) *Tracker {
	if opts.TTL <= 0 {
		opts.TTL = defaultTTL
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = defaultMaxInFlight
	}
	if opts.AbortRetries == nil {
		opts.AbortRetries = defaultAbortRetries
	}
	t := &Tracker{
		opts: opts,
		log:  opts.Logger,
		now:  time.Now,
		sem:  make(chan struct{}, opts.MaxInFlight),
		reqs: map[string]*request{},
		aborts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_leg_aborts_total",
			Help: "Legs duet aborted on their engine because the other leg failed or its engine was ejected, by role of the aborted leg, reason and outcome (ok, failed, dropped).",
		}, []string{"role", "reason", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_leg_abort_retries_total",
			Help: "Aborts sent again because the aborted leg had not ended yet (the engine may not have registered its rid when the first abort came), by role and reason.",
		}, []string{"role", "reason"}),
	}
	if t.log == nil {
		t.log = zap.NewNop()
	}
	t.tracked = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "duet_legs_tracked",
		Help: "PD requests whose legs duet is following (not yet both finished).",
	}, func() float64 { return float64(t.Len()) })
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(t.aborts, t.retries, t.tracked)
	}
	return t
}

// RIDs returns the rids SGLang gives a request whose body carries rid id:
// id itself for a single request, "<id>_<i>" for each of a batch's items
// (GenerateReqInput's normalization of a string rid).
func RIDs(id string, items int) []string {
	if items <= 0 {
		return []string{id}
	}
	out := make([]string, items)
	for i := range out {
		out[i] = id + "_" + strconv.Itoa(i)
	}
	return out
}

// Track records a PD request routed to d, under duet's request id, whose
// body carries rid id and has items batch items (0 for a single request).
// Requests without a prefill leg are not tracked.
func (t *Tracker) Track(id string, items int, d scheduler.Decision, decodeFallback *scheduler.Endpoint) {
	if d.Prefill == nil || d.Prefill.Endpoint == nil || d.Decode.Endpoint == nil {
		return
	}
	r := &request{
		id:      id,
		rids:    RIDs(id, items),
		started: t.now(),
		prefill: leg{url: d.Prefill.Endpoint.URL, rank: d.Prefill.Rank},
		decode:  leg{url: d.Decode.Endpoint.URL, rank: d.Decode.Rank},
	}
	if decodeFallback != nil {
		r.decode.fallback = decodeFallback.URL
	}
	t.mu.Lock()
	t.reqs[id] = r
	t.mu.Unlock()
}

// Len returns how many requests are tracked.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.reqs)
}

// abortJob is one abort to carry out.
type abortJob struct {
	id     string
	role   scheduler.Role
	url    string
	rids   []string
	reason string
}

// Complete implements accesslog.Sink: it marks the entry's leg finished and
// aborts the other leg when this one failed while the other still runs.
func (t *Tracker) Complete(ctx context.Context, c accesslog.Completion) {
	if c.RequestID == "" {
		return
	}
	var job *abortJob
	t.mu.Lock()
	r, ok := t.reqs[c.RequestID]
	if ok {
		job = t.completeLocked(r, c)
		if r.prefill.ended && (r.decode.ended || r.finished) {
			delete(t.reqs, r.id)
		}
	}
	t.mu.Unlock()
	if job != nil {
		legtrace.Aborted(ctx, job.role, job.url, job.reason)
		t.abort(ctx, *job, c)
	}
}

// completeLocked applies one entry to r and returns the abort it calls
// for, if any. Caller holds mu.
func (t *Tracker) completeLocked(r *request, c accesslog.Completion) *abortJob {
	switch c.Leg {
	case accesslog.LegPrefill:
		r.prefill.done, r.prefill.ended = true, true
		if c.Failed && !r.decode.done {
			return r.abortLeg(scheduler.RoleDecode, ReasonPrefillFailed)
		}
	case accesslog.LegDecode:
		if c.Unreachable && !r.decode.retried && !r.decode.done {
			// The attempt never reached its engine, and Envoy retries it
			// once on the host listed second (envoy-contract claim 24), or
			// on one its fallback policy picks when duet listed none. The
			// leg lives on there: the retry's entry, or the request's
			// entry if the retry fails too, ends it.
			r.decode.retried, r.decode.url = true, r.decode.fallback
			return nil
		}
		r.decode.done, r.decode.ended = true, true
		if c.Failed && !r.prefill.done {
			return r.abortLeg(scheduler.RolePrefill, ReasonDecodeFailed)
		}
	case accesslog.LegRequest:
		// The decode leg cannot outlive the client request.
		r.finished, r.decode.done = true, true
		if c.Failed && !r.prefill.done {
			return r.abortLeg(scheduler.RolePrefill, ReasonClientGone)
		}
	}
	return nil
}

// Ejected aborts, on the partner engines, the running legs of requests that
// have a running leg on the ejected engine (rank scheduler.NoRank: the whole
// engine; else only that DP rank). The ejected engine itself is asked too,
// in case it still listens. Call it only for ejections that mean the engine
// is dead or hung; an engine that merely returned errors finishes its
// requests on its own.
func (t *Tracker) Ejected(ctx context.Context, role scheduler.Role, engineURL string, rank int) {
	var jobs []abortJob
	t.mu.Lock()
	reason := ReasonPrefillEjected
	if role == scheduler.RoleDecode {
		reason = ReasonDecodeEjected
	}
	for _, r := range t.reqs {
		on := r.leg(role)
		if on.done || on.url != engineURL || (rank != scheduler.NoRank && on.rank != rank) {
			continue
		}
		jobs = append(jobs, *r.abortLeg(role, reason))
		if other := partner(role); !r.leg(other).done {
			jobs = append(jobs, *r.abortLeg(other, reason))
		}
	}
	t.mu.Unlock()
	for _, j := range jobs {
		t.abort(ctx, j, accesslog.Completion{})
	}
}

// Sweep forgets requests older than the TTL and returns how many.
func (t *Tracker) Sweep() int {
	cutoff := t.now().Add(-t.opts.TTL)
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for id, r := range t.reqs {
		if r.started.Before(cutoff) {
			delete(t.reqs, id)
			n++
		}
	}
	return n
}

// Run sweeps every minute until ctx ends, then waits for the aborts in
// flight.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			t.wg.Wait()
			return
		case <-tick.C:
			if n := t.Sweep(); n > 0 {
				t.log.Info("forgot requests whose legs never reported", zap.Int("requests", n), zap.Duration("ttl", t.opts.TTL))
			}
		}
	}
}

// abort carries out job in the background, bounded by MaxInFlight; cause is
// the entry that called for it (zero for an ejection). It is sent again
// after each of abortRetries while the aborted leg has not ended.
func (t *Tracker) abort(ctx context.Context, job abortJob, cause accesslog.Completion) {
	t.abortAttempt(ctx, job, cause, 0)
}

// retry sends job again after Options.AbortRetries[attempt-1] unless the
// aborted leg has ended (or the request is gone) by then.
func (t *Tracker) retry(ctx context.Context, job abortJob, attempt int) {
	if attempt > len(t.opts.AbortRetries) {
		return
	}
	t.wg.Add(1)
	time.AfterFunc(t.opts.AbortRetries[attempt-1], func() {
		defer t.wg.Done()
		t.mu.Lock()
		r, ok := t.reqs[job.id]
		pending := ok && !r.leg(job.role).ended
		t.mu.Unlock()
		if pending {
			t.abortAttempt(ctx, job, accesslog.Completion{}, attempt)
		}
	})
}

// abortAttempt is one try of abort.
func (t *Tracker) abortAttempt(ctx context.Context, job abortJob, cause accesslog.Completion, attempt int) {
	log := t.log.With(zap.String("duet_request_id", job.id), zap.String("aborted_role", string(job.role)),
		zap.String("engine", job.url), zap.String("reason", job.reason))
	if cause.Leg != "" {
		log = log.With(zap.String("failed_leg", string(cause.Leg)), zap.Int("status", cause.Status),
			zap.String("flags", cause.ResponseFlags), zap.String("upstream", cause.Upstream))
	}
	if job.url == "" {
		// A decode leg retried on a host Envoy's fallback policy chose.
		t.aborts.WithLabelValues(string(job.role), job.reason, "failed").Inc()
		log.Warn("abort failed: the leg was retried on an engine duet did not choose")
		return
	}
	select {
	case t.sem <- struct{}{}:
	default:
		t.aborts.WithLabelValues(string(job.role), job.reason, "dropped").Inc()
		log.Warn("abort dropped: too many aborts in flight", zap.Int("max_in_flight", t.opts.MaxInFlight))
		return
	}
	// The feedback stream's context ends with the stream; the abort must not.
	actx := context.WithoutCancel(ctx)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer func() { <-t.sem }()
		start := t.now()
		err := t.opts.Aborter.Abort(actx, job.url, job.rids)
		if attempt > 0 {
			log = log.With(zap.Int("attempt", attempt+1))
		}
		if err != nil {
			t.aborts.WithLabelValues(string(job.role), job.reason, "failed").Inc()
			log.Warn("abort failed", zap.Error(err))
		} else {
			if attempt == 0 {
				t.aborts.WithLabelValues(string(job.role), job.reason, "ok").Inc()
			} else {
				t.retries.WithLabelValues(string(job.role), job.reason).Inc()
			}
			log.Warn("aborted the surviving leg", zap.Duration("took", t.now().Sub(start)))
		}
		t.retry(ctx, job, attempt+1)
	}()
}

// Wait blocks until the aborts in flight have finished (for tests and
// shutdown).
func (t *Tracker) Wait() { t.wg.Wait() }
