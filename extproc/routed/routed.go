// Package routed remembers the requests duet routed, and for each of their
// legs the hosts and rank Envoy may report, so that duet believes only
// access-log entries about requests it started. A Book's Gate sits in front
// of every consumer of completion feedback (reservations, health and
// ejection, aborts): an entry whose request id duet did not mint or no
// longer tracks, or whose upstream or rank is not what duet chose for that
// leg, is counted in duet_feedback_untrusted_total and goes no further.
//
// The one upstream duet did not name first that a decode leg may report is
// the fallback duet listed second: Envoy retries a decode attempt that could
// not connect there (docs/envoy-contract.md, claim 24).
package routed

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/duet-router/duet/extproc/accesslog"
)

// NoRank is Route's rank of a leg that carries no rank header.
const NoRank = accesslog.NoRank

// DefaultTTL is how long a Book keeps a request whose feedback has not all
// arrived: longer than any generation it should still believe feedback of.
const DefaultTTL = 30 * time.Minute

// logEvery is how often an untrusted entry of one kind is logged at most.
const logEvery = 10 * time.Second

// Reasons an entry is not believed, the "reason" label of
// duet_feedback_untrusted_total.
const (
	ReasonNoRequestID   = "no_request_id"   // an upstream entry without duet's request id
	ReasonUnknown       = "unknown_request" // an id duet did not mint, or no longer tracks
	ReasonNoSuchLeg     = "no_such_leg"     // a prefill entry for a request without a prefill leg
	ReasonWrongUpstream = "wrong_upstream"  // a host duet did not choose for the leg
	ReasonWrongRank     = "wrong_rank"      // a rank duet did not choose for the leg
	ReasonRepeated      = "repeated"        // a leg (or request) already reported
)

// Route is what duet chose for one request: the hosts ("ip:port", as Envoy
// reports them) and ranks its legs may report.
type Route struct {
	// Pool is the pool the request was routed to (its model's engines).
	Pool string
	// Decode is the decode (or aggregated) host; DecodeFallback the host
	// listed second for Envoy's connect-failure retry, or "".
	Decode, DecodeFallback string
	// DecodeRank is the rank header the decode leg carries, or NoRank.
	DecodeRank int
	// Prefill is the prefill host, or "" when the request has no prefill leg.
	Prefill string
	// PrefillRank is the rank header the prefill leg carries, or NoRank.
	PrefillRank int
}

// Options configure a Book.
type Options struct {
	// TTL forgets requests whose feedback never all arrived; default DefaultTTL.
	TTL time.Duration
	// Logger; nil means none.
	Logger *zap.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
	// Orphans, when positive, keeps up to this many entries about requests
	// the Book does not know yet, for OrphanTTL, so that Adopt can admit
	// them once their route arrives: among replicas, another replica's
	// route can come after an entry about its request (package
	// cmd/duet/internal/replicas). An entry of the Gate that waits is
	// counted as untrusted (unknown_request) only when it expires. 0
	// refuses unknown entries at once, and counts them then.
	Orphans int
	// OrphanTTL is how long an orphan waits for its route; default
	// DefaultOrphanTTL.
	OrphanTTL time.Duration
}

// DefaultOrphanTTL is how long an entry about an unknown request waits for
// its route (Options.Orphans).
const DefaultOrphanTTL = 2 * time.Minute

// orphan is an entry about a request the Book did not know when it came.
type orphan struct {
	c  accesslog.Completion
	at time.Time
	// gated: it came through the Book's Gate (from this replica's Envoy),
	// so it is counted as untrusted if its route never comes.
	gated bool
}

// Book is the record of routed requests. Its methods are safe for
// concurrent use.
type Book struct {
	ttl time.Duration
	log *zap.Logger
	now func() time.Time

	mu   sync.Mutex
	reqs map[string]*entry

	maxOrphans int
	orphanTTL  time.Duration
	orphans    map[string][]orphan
	nOrphans   int

	untrusted *prometheus.CounterVec
	adopted   prometheus.Counter
}

// entry is one routed request and the feedback that arrived for it.
type entry struct {
	route   Route
	at      time.Time
	request bool // the whole-request entry arrived
	prefill bool // the prefill leg's entry arrived
	// decodes counts the decode leg's entries: one, or two when Envoy
	// retried an attempt that could not connect.
	decodes     int
	unreachable bool // the decode leg's first attempt could not connect
	decodeDone  bool // no further decode entry is expected
}

// New returns an empty Book.
func New(opts Options) *Book {
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.OrphanTTL <= 0 {
		opts.OrphanTTL = DefaultOrphanTTL
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	b := &Book{
		ttl: opts.TTL,
		// The sampler keys on the message, which names the reason.
		log: log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, logEvery, 1, 0)
		})),
		now:        time.Now,
		reqs:       map[string]*entry{},
		maxOrphans: opts.Orphans,
		orphanTTL:  opts.OrphanTTL,
		orphans:    map[string][]orphan{},
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "duet_feedback_adopted_total",
			Help: "Access-log entries about a request duet did not know when they came (counted then as unknown_request), believed once the request's route arrived from the replica that routed it.",
		}),
		untrusted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_feedback_untrusted_total",
			Help: "Access-log entries duet did not believe, by leg and reason: not about a request duet routed and still tracks, or naming a host or rank duet did not choose for that leg.",
		}, []string{"leg", "reason"}),
	}
	if opts.Registerer != nil {
		tracked := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "duet_routes_tracked",
			Help: "Routed requests whose access-log feedback duet still expects.",
		}, func() float64 { return float64(b.Len()) })
		opts.Registerer.MustRegister(b.untrusted, b.adopted, tracked)
	}
	return b
}

// Record notes that duet routed request id along r. Call it before the
// routing decision reaches Envoy, so that no entry can precede it.
func (b *Book) Record(id string, r Route) {
	e := &entry{route: r, at: b.now()}
	b.mu.Lock()
	b.reqs[id] = e
	b.mu.Unlock()
}

// Len returns how many requests the Book tracks.
func (b *Book) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.reqs)
}

// Admit reports whether c is feedback duet may believe, and if not why;
// an admitted entry is marked as arrived, and c gets its request's pool.
func (b *Book) Admit(c *accesslog.Completion) (ok bool, reason string) {
	ok, reason, _ = b.admitEntry(c, false)
	return ok, reason
}

// admitEntry is Admit; kept reports that an entry about an unknown request
// waits for its route (Options.Orphans), gated that it came through the
// Gate.
func (b *Book) admitEntry(c *accesslog.Completion, gated bool) (ok bool, reason string, kept bool) {
	if c.RequestID == "" {
		return false, ReasonNoRequestID, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e, found := b.reqs[c.RequestID]
	if !found {
		if b.nOrphans < b.maxOrphans {
			b.orphans[c.RequestID] = append(b.orphans[c.RequestID], orphan{c: *c, at: b.now(), gated: gated})
			b.nOrphans++
			kept = true
		}
		return false, ReasonUnknown, kept
	}
	reason = e.admit(c)
	if reason != "" {
		return false, reason, false
	}
	b.forgetIfDone(c.RequestID, e)
	return true, "", false
}

// forgetIfDone forgets request id once every entry it expects arrived.
// Caller holds the Book's lock.
func (b *Book) forgetIfDone(id string, e *entry) {
	if e.request && e.decodeDone && (e.prefill || e.route.Prefill == "") {
		delete(b.reqs, id)
	}
}

// Adopt records request id's route, as Record does, and returns the
// entries about it that came before the route (Options.Orphans) and that
// the route makes believable, marked as arrived: the caller applies them.
func (b *Book) Adopt(id string, r Route) []accesslog.Completion {
	e := &entry{route: r, at: b.now()}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.reqs[id]; ok {
		e = old // routed here, or announced twice
	} else {
		b.reqs[id] = e
	}
	waiting := b.orphans[id]
	if len(waiting) == 0 {
		return nil
	}
	delete(b.orphans, id)
	b.nOrphans -= len(waiting)
	var out []accesslog.Completion
	for _, o := range waiting {
		if e.admit(&o.c) == "" {
			out = append(out, o.c)
		}
	}
	b.forgetIfDone(id, e)
	b.adopted.Add(float64(len(out)))
	return out
}

// admit checks c against e and marks it arrived; it returns the reason
// c is not believed, or "" (c then gets its request's pool). Caller holds
// the Book's lock.
func (e *entry) admit(c *accesslog.Completion) string {
	reason := e.check(c)
	if reason == "" {
		c.Pool = e.route.Pool
	}
	return reason
}

// check is admit without the pool.
func (e *entry) check(c *accesslog.Completion) string {
	r := e.route
	switch c.Leg {
	case accesslog.LegRequest:
		if e.request {
			return ReasonRepeated
		}
		e.request = true
	case accesslog.LegPrefill:
		switch {
		case r.Prefill == "":
			return ReasonNoSuchLeg
		case c.Upstream != "" && c.Upstream != r.Prefill:
			return ReasonWrongUpstream
		case c.DPRank != r.PrefillRank:
			return ReasonWrongRank
		case e.prefill:
			return ReasonRepeated
		}
		e.prefill = true
	case accesslog.LegDecode:
		switch {
		case e.decodeDone:
			return ReasonRepeated
		case c.DPRank != r.DecodeRank:
			return ReasonWrongRank
		}
		if e.decodes == 0 {
			// The first attempt goes to the host duet named first.
			if c.Upstream != "" && c.Upstream != r.Decode {
				return ReasonWrongUpstream
			}
			e.decodes, e.unreachable = 1, c.Unreachable
			e.decodeDone = !c.Unreachable
			return ""
		}
		// The one retry, after an attempt that could not connect: on the
		// fallback duet listed.
		if !e.unreachable || c.Upstream == "" || c.Upstream != r.DecodeFallback {
			return ReasonWrongUpstream
		}
		e.decodes, e.decodeDone = 2, true
	}
	return ""
}

// Gate returns a Sink that passes to next only the completions Admit
// believes. Whole-request entries without duet's request id (requests duet
// or Envoy answered itself) are dropped without being counted: they are
// not feedback about anything duet routed.
func (b *Book) Gate(next accesslog.Sink) accesslog.Sink { return gate{book: b, next: next} }

type gate struct {
	book *Book
	next accesslog.Sink
}

// Complete implements accesslog.Sink.
func (g gate) Complete(ctx context.Context, c accesslog.Completion) {
	if c.RequestID == "" && c.Leg == accesslog.LegRequest {
		return
	}
	ok, reason, kept := g.book.admitEntry(&c, true)
	if ok {
		g.next.Complete(ctx, c)
		return
	}
	if kept {
		// Counted when it expires, if its route never comes (Sweep).
		return
	}
	g.book.distrust(c, reason)
}

// distrust counts and logs an entry that is not believed.
func (b *Book) distrust(c accesslog.Completion, reason string) {
	b.untrusted.WithLabelValues(string(c.Leg), reason).Inc()
	b.log.Warn("ignored an access-log entry duet cannot vouch for ("+reason+"); further ones for this reason are logged at most every "+logEvery.String(),
		zap.String("duet_request_id", c.RequestID), zap.String("leg", string(c.Leg)), zap.String("upstream", c.Upstream),
		zap.Int("dp_rank", c.DPRank), zap.Bool("failed", c.Failed))
}

// Sweep forgets requests recorded more than the TTL ago and returns how many.
func (b *Book) Sweep() int {
	cutoff := b.now().Add(-b.ttl)
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for id, e := range b.reqs {
		if e.at.Before(cutoff) {
			delete(b.reqs, id)
			n++
		}
	}
	orphanCutoff := b.now().Add(-b.orphanTTL)
	var expired []accesslog.Completion
	for id, os := range b.orphans {
		if os[0].at.Before(orphanCutoff) {
			delete(b.orphans, id)
			b.nOrphans -= len(os)
			for _, o := range os {
				if o.gated {
					expired = append(expired, o.c)
				}
			}
		}
	}
	for _, c := range expired {
		b.distrust(c, ReasonUnknown)
	}
	return n
}

// Run sweeps every minute until ctx ends.
func (b *Book) Run(ctx context.Context) {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if n := b.Sweep(); n > 0 {
				b.log.Info("forgot routed requests whose feedback never all arrived", zap.Int("requests", n), zap.Duration("ttl", b.ttl))
			}
		}
	}
}
