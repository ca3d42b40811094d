package scheduler

import (
	"github.com/duet-router/duet/scheduler/kvevents"
	"strings"
	"time"
)

// decisionHistory is how many recent decisions the scheduler keeps for
// Status.
const decisionHistory = 64

// Health states in HealthStatus.State.
const (
	// HealthHealthy: picks use the endpoint or target.
	HealthHealthy = "healthy"
	// HealthEjected: picks skip it until HealthStatus.Until.
	HealthEjected = "ejected"
	// HealthHalfOpen: pickable again, on probation: the next failure
	// ejects it again, the next success recovers it.
	HealthHalfOpen = "half_open"
)

// Status is a read-only view of the scheduler at one instant, for status
// pages. Nothing in it is shared with the scheduler: callers may keep and
// modify it.
type Status struct {
	// At is when the view was taken (the scheduler's clock).
	At time.Time
	// Ready is Scheduler.Ready.
	Ready bool
	// PD reports whether a prefill pool is configured.
	PD bool
	// EngineRanks reports whether engines, not duet, choose DP ranks.
	EngineRanks bool
	// PrefillPolicy and DecodePolicy name the pools' policies;
	// PrefillPolicy is empty in aggregated mode.
	PrefillPolicy, DecodePolicy string
	// Endpoints lists every configured endpoint: prefill first, then
	// decode, each in configuration order.
	Endpoints []EndpointStatus
	// Decisions are the most recent picks, newest first; at most 64.
	Decisions []DecisionStatus
	// Reservations counts the requests the ledger holds (with tokens
	// reserved, or recently finished).
	Reservations int
	// Saturation is each role's saturation, as Saturation returns it.
	Saturation []RoleSaturation
}

// EndpointStatus is one endpoint and its schedulable targets.
type EndpointStatus struct {
	// Endpoint is the endpoint as discovery knows it.
	Endpoint Endpoint
	// Health is the health of the endpoint as a whole.
	Health HealthStatus
	// Targets are the endpoint's schedulable targets in rank order; none
	// while the endpoint is not ready.
	Targets []TargetStatus
}

// HealthStatus is the state of one health record.
type HealthStatus struct {
	// State is HealthHealthy, HealthEjected or HealthHalfOpen.
	State string
	// Reason is the last ejection's reason (ReasonUnreachable, ...) while
	// State is not healthy; empty otherwise.
	Reason string
	// Until is when the ejection ends; zero unless State is HealthEjected.
	Until time.Time
	// Ejections counts the ejections in a row without a recovery.
	Ejections int
}

// TargetStatus is one target's numbers.
type TargetStatus struct {
	// Rank is the DP rank, or NoRank when the engine picks it.
	Rank int
	// Name is Target.String(), e.g. "127.0.0.1:30001/dp1".
	Name string
	// Health is the target's own health; its endpoint's is in
	// EndpointStatus.Health. Picks skip the target while either is ejected.
	Health HealthStatus
	// Load is what a policy would see now: the last fresh scrape plus
	// duet's reservations not yet covered by one.
	Load Load
	// ScrapedAt is when the last successful scrape of the rank finished;
	// zero if none has. Load carries its numbers only while they are fresh.
	ScrapedAt time.Time
	// Picks counts the requests sent to the target since it became
	// schedulable (it starts over if the target leaves and comes back).
	Picks uint64
	// PrefixBlocks is the number of prompt blocks the prefix index
	// believes the target caches.
	PrefixBlocks int
	// Events is what the target's KV events say, beside the prefix
	// index's estimate; nil when the pool does not follow them.
	Events *EventsStatus
	// Saturated reports that the target is saturated (SaturationConfig).
	Saturated bool
}

// EventsStatus is one target's view from its KV events.
type EventsStatus struct {
	// State is "live", "warming" or "fallback" (kvevents.State).
	State string
	// Blocks is how many prefix blocks the events say the target holds.
	Blocks int
	// Lag is how long ago the engine stamped the last batch; zero before
	// one arrived (HasBatch false).
	Lag      time.Duration
	HasBatch bool
}

// rankStatuser is a CacheView that reports per-target status
// (kvevents.Tracker does).
type rankStatuser interface {
	RankStatus(key TargetKey) (kvevents.RankStatus[TargetKey], bool)
}

// DecisionStatus is one recent pick, successful or not.
type DecisionStatus struct {
	// At is when the pick ran.
	At time.Time
	// RequestID is the request's ID as given to Pick.
	RequestID string
	// Path is the request's HTTP path; Model its model.
	Path, Model string
	// Prefill is the prefill choice; nil in aggregated mode, for requests
	// that need no prefill, and when the pick failed before it.
	Prefill *ChoiceStatus
	// Decode is the decode choice; nil when the pick failed before it.
	Decode *ChoiceStatus
	// Err is why the pick failed; empty on success.
	Err string
}

// ChoiceStatus is one role's part of a decision.
type ChoiceStatus struct {
	// URL is the chosen endpoint's URL; Target its Target.String().
	URL, Target string
	// Rank is the chosen rank, or NoRank.
	Rank int
	// Policy is the policy that chose.
	Policy string
	// Candidates is the number of targets the policy chose among (ejected
	// targets are not candidates).
	Candidates int
	// LoadTokens is the chosen target's token load when the policy ran.
	LoadTokens int64
	// Prefix is the fraction of the prompt's blocks the prefix index
	// believed the chosen target cached.
	Prefix float64
	// CachedTokens is the prompt tokens duet believed the chosen target
	// caches (Candidate.CachedTokens): on a decode engine with a decode
	// radix cache, earlier turns' answers included.
	CachedTokens int64
	// Tokens is what the pick reserved on the target (0 for requests that
	// are not inference).
	Tokens int64
	// Cost is the parts of the price the policy gave the chosen target,
	// for policies that explain it (CostExplainer: least_cost); filled
	// only for a pick asked to explain itself (Request.Explain), never in
	// Status.
	Cost []CostTerm
}

// CostTerm is one part of the price a policy gave a candidate: least_cost's
// queued work, own work and eviction on prefill, its pace, balance,
// overflow and decode cache terms on decode. A price is the sum of its
// parts.
type CostTerm struct {
	// Name names the part, e.g. "queued".
	Name string
	// Value is the part, in the policy's unit (tokens for least_cost).
	Value float64
}

// decisionRing keeps the latest decisionHistory decisions. It is guarded
// by ledger.mu, which every pick holds anyway.
type decisionRing struct {
	entries [decisionHistory]decisionEntry
	n       uint64 // decisions recorded so far
}

// decisionEntry is one recorded decision. It holds what the pick already
// has at hand; formatting waits for Status, off the pick path.
type decisionEntry struct {
	at              time.Time
	id, path, model string
	prefill, decode choice // a role's Endpoint is nil when it has no choice
	err             error
}

// choice is one role's part of a decisionEntry.
type choice struct {
	target     Target
	candidates int
	load       int64
	prefix     float64
	cached     int64
	tokens     int64
}

// maxShownBytes bounds the path and model a decision keeps.
const maxShownBytes = 256

// record starts the entry of the next decision, overwriting the oldest,
// and returns it for the pick to fill in. Caller holds ledger.mu.
//
// The entry keeps its own copies of path and model, cut to maxShownBytes:
// the request's strings may share memory with its whole body, which the
// ring must not keep alive. A copy is made only when the string differs
// from the previous decision's, so a steady stream of requests for one
// model and path records without allocating.
func (r *decisionRing) record(at time.Time, id, path, model string) *decisionEntry {
	var prevPath, prevModel string
	if r.n > 0 {
		prev := &r.entries[(r.n-1)%decisionHistory]
		prevPath, prevModel = prev.path, prev.model
	}
	e := &r.entries[r.n%decisionHistory]
	r.n++
	*e = decisionEntry{at: at, id: id, path: kept(path, prevPath), model: kept(model, prevModel)}
	return e
}

// kept returns s cut to maxShownBytes: prev if that is equal, else a copy.
func kept(s, prev string) string {
	s = s[:min(len(s), maxShownBytes)]
	if s == prev {
		return prev
	}
	return strings.Clone(s)
}

// newest returns copies of the recorded entries, newest first. Caller
// holds ledger.mu.
func (r *decisionRing) newest() []decisionEntry {
	k := min(r.n, decisionHistory)
	out := make([]decisionEntry, 0, k)
	for i := range k {
		out = append(out, r.entries[(r.n-1-i)%decisionHistory])
	}
	return out
}

// recordFailure records a pick that failed before taking the pick lock.
func (s *Scheduler) recordFailure(req *Request, err error) {
	s.ledger.mu.Lock()
	rec := s.decisions.record(s.now(), req.ID, req.Path, req.Model)
	rec.err = err
	e := *rec
	s.ledger.mu.Unlock()
	s.explain(req, e, nil, nil)
}

// explain fills req.Explain, when it is set, with the recorded decision e
// (a copy taken under ledger.mu: the ring's entry is overwritten by later
// picks) and the chosen candidates' cost parts (nil for a role whose
// policy does not explain its price). It formats outside the pick lock.
func (s *Scheduler) explain(req *Request, e decisionEntry, prefillCost, decodeCost []CostTerm) {
	if req.Explain == nil {
		return
	}
	*req.Explain = s.decisionView(e)
	if req.Explain.Prefill != nil {
		req.Explain.Prefill.Cost = prefillCost
	}
	if req.Explain.Decode != nil {
		req.Explain.Decode.Cost = decodeCost
	}
}

// Status returns a view of the endpoints, their targets' loads, health and
// picks, and the recent decisions. It copies what it needs under the
// scheduler's locks, one at a time, so it never holds up picks for long;
// the view is consistent per lock, not across them.
func (s *Scheduler) Status() Status {
	snap := s.snap.Load()
	st := Status{
		Ready:        s.Ready(),
		PD:           s.pd,
		EngineRanks:  s.engineRanks,
		DecodePolicy: s.decodePolicy.Name(),
		Endpoints:    make([]EndpointStatus, len(snap.endpoints)),
	}
	if s.pd {
		st.PrefillPolicy = s.prefillPolicy.Name()
	}
	byEndpoint := make(map[*Endpoint]int, len(snap.endpoints))
	for i := range snap.endpoints {
		st.Endpoints[i].Endpoint = snap.endpoints[i]
		byEndpoint[&snap.endpoints[i]] = i
	}

	// Loads, picks and decisions, under the pick lock.
	type pending struct {
		ep, pos int
		rec     *healthState
	}
	var targets []pending
	var entries []decisionEntry
	s.ledger.mu.Lock()
	now := s.now()
	st.At = now
	since := s.ledger.freshSince(now)
	for _, p := range []*pool{&snap.prefill, &snap.decode} {
		for i, t := range p.targets {
			ts := p.states[i]
			e, ok := byEndpoint[t.Endpoint] // targets point into their snapshot's endpoints
			if !ok {
				continue
			}
			view := TargetStatus{Rank: t.Rank, Load: s.ledger.loadSince(ts, since), Picks: ts.picked}
			view.Saturated = s.saturated(ts, view.Load)
			if ts.scrapedAt != 0 {
				view.ScrapedAt = time.Unix(0, ts.scrapedAt)
			}
			targets = append(targets, pending{ep: e, pos: len(st.Endpoints[e].Targets), rec: ts.health})
			st.Endpoints[e].Targets = append(st.Endpoints[e].Targets, view)
		}
	}
	st.Reservations = len(s.ledger.requests)
	entries = s.decisions.newest()
	s.ledger.mu.Unlock()

	// Health, under the health lock.
	at := now.UnixNano()
	s.health.mu.Lock()
	for i := range st.Endpoints {
		st.Endpoints[i].Health = healthView(s.health.endpoint(st.Endpoints[i].Endpoint.URL), at)
	}
	for _, p := range targets {
		st.Endpoints[p.ep].Targets[p.pos].Health = healthView(p.rec, at)
	}
	s.health.mu.Unlock()

	// Names and prefix sizes, outside every scheduler lock but the index's.
	for i := range st.Endpoints {
		es := &st.Endpoints[i]
		for j := range es.Targets {
			t := Target{Endpoint: &es.Endpoint, Rank: es.Targets[j].Rank}
			es.Targets[j].Name = t.String()
			es.Targets[j].PrefixBlocks = s.index.Blocks(t.Key())
			if rs, ok := s.cacheView.(rankStatuser); ok {
				if r, ok := rs.RankStatus(t.Key()); ok {
					es.Targets[j].Events = &EventsStatus{State: r.State.String(), Blocks: r.Blocks, Lag: r.Lag, HasBatch: !r.LastBatch.IsZero()}
				}
			}
		}
		sortByRank(es.Targets)
	}
	st.Decisions = make([]DecisionStatus, len(entries))
	for i, e := range entries {
		st.Decisions[i] = s.decisionView(e)
	}
	st.Saturation = s.Saturation()
	return st
}

// healthView describes rec at now (Unix ns). Caller holds health.mu. A nil
// record is healthy.
func healthView(rec *healthState, now int64) HealthStatus {
	if rec == nil || rec.phase == phaseHealthy {
		return HealthStatus{State: HealthHealthy}
	}
	hs := HealthStatus{State: HealthHalfOpen, Reason: rec.reason.reason(), Ejections: rec.ejections}
	if until := rec.until.Load(); until > now {
		hs.State, hs.Until = HealthEjected, time.Unix(0, until)
	}
	return hs
}

// sortByRank sorts one endpoint's targets by rank (insertion sort: an
// endpoint has few ranks, and buildTargets lists them nearly in order).
func sortByRank(ts []TargetStatus) {
	for i := 1; i < len(ts); i++ {
		for j := i; j > 0 && ts[j].Rank < ts[j-1].Rank; j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
}

// decisionView formats a recorded decision.
func (s *Scheduler) decisionView(e decisionEntry) DecisionStatus {
	d := DecisionStatus{At: e.at, RequestID: e.id, Path: e.path, Model: e.model}
	if e.err != nil {
		d.Err = e.err.Error()
	}
	if e.prefill.target.Endpoint != nil {
		d.Prefill = choiceView(e.prefill, s.prefillPolicy.Name())
	}
	if e.decode.target.Endpoint != nil {
		d.Decode = choiceView(e.decode, s.decodePolicy.Name())
	}
	return d
}

// choiceView formats one role's choice.
func choiceView(c choice, policy string) *ChoiceStatus {
	return &ChoiceStatus{
		URL: c.target.Endpoint.URL, Target: c.target.String(), Rank: c.target.Rank,
		Policy: policy, Candidates: c.candidates, LoadTokens: c.load, Prefix: c.prefix, CachedTokens: c.cached, Tokens: c.tokens,
	}
}
