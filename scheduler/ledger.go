package scheduler

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TargetKey identifies a target across snapshots: the endpoint's configured
// URL and the rank (NoRank for a single-rank decode engine).
type TargetKey struct {
	URL  string
	Rank int
}

// Key returns the target's key.
func (t Target) Key() TargetKey { return TargetKey{URL: t.Endpoint.URL, Rank: t.Rank} }

// Ledger defaults.
const (
	defaultCoverDelay     = 100 * time.Millisecond
	defaultStaleAfter     = 5 * time.Second
	defaultReservationTTL = 10 * time.Minute
	// finishedGrace is how long a request's record outlives its last hold,
	// so that the whole-request log entry, which may arrive after both legs'
	// entries, still finds its model and prompt size.
	finishedGrace = 30 * time.Second
)

// ledger keeps, per target, the load the engine last reported and the
// tokens duet reserved there since. Its mutex is also the pick lock:
// reading the loads, choosing and reserving happen under it, so two
// concurrent picks never see the same minimum.
//
// A reservation ends when completion feedback releases it, when a scrape
// that started after the request reached the engine covers it (the engine's
// own numbers then include the request), or, as a safety net against lost
// feedback, after ttl.
type ledger struct {
	mu         sync.Mutex
	targets    map[TargetKey]*targetState
	requests   map[string]*reservation
	coverDelay time.Duration // time for a request to reach the engine after the pick
	staleAfter time.Duration // scraped numbers older than this are not used
	ttl        time.Duration
	now        func() time.Time // the scheduler's clock
	// prefillInFlight keeps prefill holds until their leg's feedback and
	// counts a prefill target's load as the larger of its scraped pending
	// tokens and its holds (unless LoadConfig.PrefillCovered).
	prefillInFlight bool
	// legEnded, if set, is told of every leg that ends (its feedback, the
	// whole request's, or the ttl), once per leg, with mu held.
	legEnded func(LegReport)
	// ended remembers, for finishedGrace, when each request that the
	// whole-request entry released was released: a leg's entry that Envoy
	// flushes after the request's (they travel on separate access-log
	// streams) is then told from one about a request duet never knew.
	// endedOrder holds the same ids oldest first, so that forgetting them
	// needs no sweep (nor the scrape loop that runs expire).
	ended      map[string]time.Time
	endedOrder []endedRequest
}

// endedRequest is one entry of ledger.endedOrder.
type endedRequest struct {
	id string
	at time.Time
}

// Release outcomes: what a completion's release found (the outcome label
// of duet_feedback_total).
const (
	// OutcomeReleased: the request's reservation was found and the leg's
	// (or the whole request's) holds ended.
	OutcomeReleased = "released"
	// OutcomeAlreadyReleased: the whole-request entry had already ended the
	// request's reservation, less than finishedGrace ago. Benign: Envoy
	// flushes its upstream (leg) and downstream (request) logs separately,
	// in either order.
	OutcomeAlreadyReleased = "already_released"
	// OutcomeUnknownRequest: the ledger does not know the request: it never
	// reserved anything for it (not routed by this scheduler, or a pick that
	// reserved no tokens), or forgot it (the ttl ended it, or it ended more
	// than finishedGrace ago).
	OutcomeUnknownRequest = "unknown_request"
)

// targetState is one target's entry. Snapshots point at it, so it lives
// as long as the target is schedulable.
type targetState struct {
	key       TargetKey
	role      Role
	label     string             // Target.String(), for metrics
	picks     prometheus.Counter // nil without metrics
	scraped   int64              // engine-reported tokens (num_total_tokens, else num_used_tokens)
	capacity  int64
	running   int
	waiting   int
	scrapedAt int64 // when the last successful scrape finished, Unix ns; 0: never
	reserved  int64
	// reservedWork is the part of reserved that duet expects the engine to
	// compute: each hold's tokens less the prefix duet believed cached.
	reservedWork int64
	picked       uint64 // times chosen since the entry was created (Status)
	holds        map[*hold]struct{}
	removed      bool // dropped from the ledger; stale snapshots may still point here
	// health is the target's own health record and endpoint its endpoint's
	// (see health.go); picks skip the target while either is ejected.
	health, endpoint *healthState
	// turnTokens is what the turn ends of the target hold in all
	// (turnEnds.counter), read without their lock; nil until a pick needs
	// it. Guarded by mu.
	turnTokens *atomic.Int64
	// indexedBlocks is how many blocks the prefix index holds for the
	// target, as of the last insert or bound (not guarded by mu: the index
	// changes outside the pick lock).
	indexedBlocks atomic.Int64
}

// indexedTokens is indexedBlocks in tokens, perBlock tokens each.
func (ts *targetState) indexedTokens(perBlock float64) int64 {
	return int64(float64(ts.indexedBlocks.Load()) * perBlock)
}

// ejected reports whether picks skip ts at now (Unix ns): the target or
// its endpoint is ejected.
func (ts *targetState) ejected(now int64) bool {
	return ts.health.ejected(now) || ts.endpoint.ejected(now)
}

// reservation is one request's holds on its targets (prefill and decode).
type reservation struct {
	id          string
	at          time.Time
	model       string
	promptBytes int
	holds       []*hold
	emptySince  time.Time // when the last hold ended; zero while holds remain
	// legs remember each role's target until its leg is reported to
	// legEnded, even after a covering scrape ended the hold.
	legs []legRecord
	// end is where the request's prompt ended on a decode target with a
	// decode radix cache, and endSum the prompt's checksum (turnEnds); nil
	// otherwise.
	end    *turnEnd
	endSum uint64
}

// legRecord is one leg of a reservation, kept for LegReport.
type legRecord struct {
	role         Role
	target       *targetState
	tokens, work int64
	reported     bool
}

// hold is a reservation's tokens on one target.
type hold struct {
	res    *reservation
	target *targetState
	role   Role
	tokens int64
	work   int64 // tokens less the believed cached prefix (<= tokens)
}

func newLedger(coverDelay, staleAfter, ttl time.Duration) *ledger {
	if coverDelay <= 0 {
		coverDelay = defaultCoverDelay
	}
	if staleAfter <= 0 {
		staleAfter = defaultStaleAfter
	}
	if ttl <= 0 {
		ttl = defaultReservationTTL
	}
	return &ledger{
		targets:    map[TargetKey]*targetState{},
		requests:   map[string]*reservation{},
		ended:      map[string]time.Time{},
		coverDelay: coverDelay,
		staleAfter: staleAfter,
		ttl:        ttl,
		now:        time.Now,
	}
}

// state returns key's entry, creating it. Caller holds mu.
func (l *ledger) state(key TargetKey) *targetState {
	ts, ok := l.targets[key]
	if !ok {
		ts = &targetState{key: key, holds: map[*hold]struct{}{}}
		l.targets[key] = ts
	}
	return ts
}

// load returns what a policy sees of ts at now. Caller holds mu.
func (l *ledger) load(ts *targetState, now time.Time) Load {
	return l.loadSince(ts, l.freshSince(now))
}

// freshSince is the oldest scrape time (Unix ns) still fresh at now.
func (l *ledger) freshSince(now time.Time) int64 {
	return now.Add(-l.staleAfter).UnixNano()
}

// loadSince is load with the freshness cutoff computed once per pick.
// Caller holds mu.
func (l *ledger) loadSince(ts *targetState, freshSince int64) Load {
	ld := Load{Tokens: ts.reserved, Reserved: ts.reserved, ReservedWork: ts.reservedWork}
	if ts.scrapedAt != 0 && ts.scrapedAt >= freshSince {
		ld.Fresh = true
		ld.Scraped = ts.scraped
		if l.prefillInFlight && ts.role == RolePrefill {
			ld.Tokens = max(ts.reserved, ts.scraped)
		} else {
			ld.Tokens += ts.scraped
		}
		ld.Capacity = ts.capacity
		ld.Running, ld.Waiting = ts.running, ts.waiting
	}
	return ld
}

// reserve adds tokens on ts for request id, all of them work. Caller
// holds mu.
func (l *ledger) reserve(ts *targetState, id string, role Role, tokens int64, now time.Time, model string, promptBytes int) {
	l.reserveWork(ts, id, role, tokens, tokens, now, model, promptBytes)
}

// reserveWork adds tokens on ts for request id, of which work (clamped to
// [0, tokens]) are expected to be computed there. Caller holds mu.
func (l *ledger) reserveWork(ts *targetState, id string, role Role, tokens, work int64, now time.Time, model string, promptBytes int) {
	if ts.removed || tokens <= 0 {
		return
	}
	work = min(max(work, 0), tokens)
	res, ok := l.requests[id]
	if !ok {
		res = &reservation{id: id, at: now, model: model, promptBytes: promptBytes}
		l.requests[id] = res
	}
	h := &hold{res: res, target: ts, role: role, tokens: tokens, work: work}
	res.holds = append(res.holds, h)
	res.legs = append(res.legs, legRecord{role: role, target: ts, tokens: tokens, work: work})
	res.emptySince = time.Time{}
	ts.holds[h] = struct{}{}
	ts.reserved += tokens
	ts.reservedWork += work
}

// release ends request id's holds of role, or with role "" all of them and
// the request's record. It reports the request's model and prompt size; ok
// is false when the request is unknown (never reserved, or long finished).
func (l *ledger) release(id string, role Role) (model string, promptBytes int, ok bool) {
	model, promptBytes, outcome := l.releaseLeg(id, role, false)
	return model, promptBytes, outcome == OutcomeReleased
}

// releaseLeg is release for a leg (or request) that ended, failed or not:
// the ended legs are reported to legEnded. outcome is OutcomeReleased when
// the request was known, OutcomeAlreadyReleased when the whole-request
// entry released it less than finishedGrace ago, else
// OutcomeUnknownRequest.
func (l *ledger) releaseLeg(id string, role Role, failed bool) (model string, promptBytes int, outcome string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	res, found := l.requests[id]
	now := l.now()
	if !found {
		l.forgetEnded(now)
		if _, ok := l.ended[id]; ok {
			return "", 0, OutcomeAlreadyReleased
		}
		return "", 0, OutcomeUnknownRequest
	}
	l.reportLegs(res, role, failed, now)
	model, promptBytes, _ = l.releaseLocked(id, role)
	if role == "" {
		l.forgetEnded(now)
		l.ended[id] = now
		l.endedOrder = append(l.endedOrder, endedRequest{id: id, at: now})
	}
	return model, promptBytes, OutcomeReleased
}

// forgetEnded forgets the ended requests released more than finishedGrace
// before now. Caller holds mu.
func (l *ledger) forgetEnded(now time.Time) {
	for len(l.endedOrder) > 0 && now.Sub(l.endedOrder[0].at) > finishedGrace {
		e := l.endedOrder[0]
		if at, ok := l.ended[e.id]; ok && at.Equal(e.at) {
			delete(l.ended, e.id)
		}
		l.endedOrder = l.endedOrder[1:]
	}
}

// reportLegs tells legEnded of res's unreported legs of role (all with
// role ""). Caller holds mu.
func (l *ledger) reportLegs(res *reservation, role Role, failed bool, now time.Time) {
	if l.legEnded == nil {
		return
	}
	for i := range res.legs {
		g := &res.legs[i]
		if g.reported || role != "" && g.role != role {
			continue
		}
		g.reported = true
		l.legEnded(LegReport{
			RequestID: res.id, Role: g.role, Target: g.target.key,
			Picked: res.at, Ended: now, Tokens: g.tokens, Work: g.work, Failed: failed,
		})
	}
}

// releaseLocked ends request id's holds of role (all with role "") without
// reporting legs. Caller holds mu.
func (l *ledger) releaseLocked(id string, role Role) (model string, promptBytes int, ok bool) {
	res, found := l.requests[id]
	if !found {
		return "", 0, false
	}
	for _, h := range append([]*hold(nil), res.holds...) {
		if role == "" || h.role == role {
			l.drop(h, l.now())
		}
	}
	if role == "" {
		delete(l.requests, id)
	}
	return res.model, res.promptBytes, true
}

// drop ends one hold at now. Caller holds mu.
func (l *ledger) drop(h *hold, now time.Time) {
	ts := h.target
	if _, ok := ts.holds[h]; ok {
		delete(ts.holds, h)
		ts.reserved -= h.tokens
		ts.reservedWork -= h.work
	}
	res := h.res
	for i, x := range res.holds {
		if x == h {
			res.holds = append(res.holds[:i], res.holds[i+1:]...)
			break
		}
	}
	if len(res.holds) == 0 && res.emptySince.IsZero() {
		res.emptySince = now
	}
}

// setTurnEnd records where request id's prompt, of checksum sum, ended on
// its decode target. Caller holds mu.
func (l *ledger) setTurnEnd(id string, end *turnEnd, sum uint64) {
	if res, ok := l.requests[id]; ok {
		res.end, res.endSum = end, sum
	}
}

// turnEndOf returns request id's decode turn end and its prompt's
// checksum, if it has one.
func (l *ledger) turnEndOf(id string) (turnEnd, uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	res, ok := l.requests[id]
	if !ok || res.end == nil {
		return turnEnd{}, 0, false
	}
	return *res.end, res.endSum, true
}

// rankLoad is one rank's numbers from a scrape, already keyed.
type rankLoad struct {
	key      TargetKey
	tokens   int64
	capacity int64
	running  int
	waiting  int
}

// observe records a successful scrape that started at started and finished
// at finished, and ends the holds it covers. Ranks the ledger does not know
// (not schedulable) are ignored.
func (l *ledger) observe(ranks []rankLoad, started, finished time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range ranks {
		ts, ok := l.targets[r.key]
		if !ok {
			continue
		}
		ts.scraped, ts.capacity, ts.running, ts.waiting = r.tokens, r.capacity, r.running, r.waiting
		ts.scrapedAt = finished.UnixNano()
		for h := range ts.holds {
			if l.prefillInFlight && h.role == RolePrefill {
				continue // ends with its leg's feedback
			}
			if h.res.at.Add(l.coverDelay).Before(started) {
				l.drop(h, finished)
			}
		}
	}
}

// setIndexed records that the prefix index holds blocks for key.
func (l *ledger) setIndexed(key TargetKey, blocks int) {
	l.mu.Lock()
	ts := l.targets[key]
	l.mu.Unlock()
	if ts != nil {
		ts.indexedBlocks.Store(int64(blocks))
	}
}

// expire ends reservations older than the ttl (lost feedback) and forgets
// requests whose holds all ended, or that the whole-request entry
// released, more than finishedGrace ago. It returns
// how many reservations the ttl ended.
func (l *ledger) expire(now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id, res := range l.requests {
		switch {
		case now.Sub(res.at) > l.ttl:
			if len(res.holds) > 0 {
				n++
			}
			l.reportLegs(res, "", true, now)
			for _, h := range append([]*hold(nil), res.holds...) {
				l.drop(h, now)
			}
			delete(l.requests, id)
		case !res.emptySince.IsZero() && now.Sub(res.emptySince) > finishedGrace:
			delete(l.requests, id)
		}
	}
	l.forgetEnded(now)
	return n
}

// retain drops every target whose key keep rejects, with its holds.
// Caller holds mu.
func (l *ledger) retain(keep func(TargetKey) bool) {
	for key, ts := range l.targets {
		if keep(key) {
			continue
		}
		for h := range ts.holds {
			l.drop(h, l.now())
		}
		ts.removed = true
		delete(l.targets, key)
	}
}
