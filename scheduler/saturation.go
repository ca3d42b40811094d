package scheduler

import "time"

// SaturationConfig says when a target is saturated: so full that one more
// request would only wait in the engine's own queue. A pool is saturated
// while every target of one of its roles is (see Saturated); package
// scheduler/admit then queues requests in duet. A zero field takes its
// default; a negative one turns that measure off.
type SaturationConfig struct {
	// PrefillTokens saturates a prefill target (and, in an aggregated pool,
	// a decode one) whose pending prompt tokens reach it: the engine's
	// reported queue, or the prompt work duet reserved there that no leg
	// has ended yet. Default DefaultSaturationPrefillTokens.
	PrefillTokens int64
	// KVFraction saturates a decode target whose token load (tokens in use
	// and queued, plus duet's reservations) reaches this share of its KV
	// capacity. Default DefaultSaturationKVFraction.
	KVFraction float64
	// Waiting saturates a target whose engine reports this many requests
	// waiting. Default DefaultSaturationWaiting.
	Waiting int
}

// Saturation defaults, chosen by the routing-quality simulator's sweep
// (docs/admission-sim.md): 8192 pending prompt tokens is about 1.5 s of a
// DeepSeek-V3-class rank's prefill; a decode rank's reported load leaves
// out what its running requests will still claim, so 0.8 of its KV.
const (
	DefaultSaturationPrefillTokens = 8192
	DefaultSaturationKVFraction    = 0.8
	DefaultSaturationWaiting       = 16
)

// withDefaults fills the zero fields.
func (c SaturationConfig) withDefaults() SaturationConfig {
	if c.PrefillTokens == 0 {
		c.PrefillTokens = DefaultSaturationPrefillTokens
	}
	if c.KVFraction == 0 {
		c.KVFraction = DefaultSaturationKVFraction
	}
	if c.Waiting == 0 {
		c.Waiting = DefaultSaturationWaiting
	}
	return c
}

// RoleSaturation is how saturated one role of the pool is.
type RoleSaturation struct {
	Role Role
	// Targets counts the role's targets that picks may choose (not
	// ejected); Saturated how many of them are saturated.
	Targets, Saturated int
}

// Full reports whether the role can take no request: it has targets, and
// every one is saturated.
func (r RoleSaturation) Full() bool { return r.Targets > 0 && r.Saturated == r.Targets }

// Saturated reports whether the pool is saturated: every target of one of
// its roles is. A role with no target to pick is not saturated (a pick
// then fails at once, which is better than a wait).
func (s *Scheduler) Saturated() bool { return s.SaturatedAt(1) }

// SaturatedAt is Saturated with every threshold scaled by share (0 < share
// ≤ 1): where an admission class of lower priority stops going through,
// so that its requests leave the engines' queues short for the classes
// above it.
func (s *Scheduler) SaturatedAt(share float64) bool {
	var roles [2]RoleSaturation // on the stack: every admitted request asks
	for _, r := range s.saturationAt(share, roles[:0]) {
		if r.Full() {
			return true
		}
	}
	return false
}

// Saturation returns each role's saturation now: prefill first, when the
// pool has a prefill role.
func (s *Scheduler) Saturation() []RoleSaturation {
	return s.saturationAt(1, make([]RoleSaturation, 0, 2))
}

// saturationAt appends to out Saturation with the thresholds scaled by
// share.
func (s *Scheduler) saturationAt(share float64, out []RoleSaturation) []RoleSaturation {
	snap := s.snap.Load()
	s.ledger.mu.Lock()
	defer s.ledger.mu.Unlock()
	now := s.now()
	c := s.saturation.scaled(share)
	if s.pd {
		out = append(out, s.roleSaturation(RolePrefill, &snap.prefill, now, c))
	}
	return append(out, s.roleSaturation(RoleDecode, &snap.decode, now, c))
}

// scaled is c with every threshold that is on scaled by share (in (0, 1];
// anything else leaves c as it is). Counts stay at least 1.
func (c SaturationConfig) scaled(share float64) SaturationConfig {
	if !(share > 0 && share < 1) {
		return c
	}
	if c.PrefillTokens > 0 {
		c.PrefillTokens = max(int64(float64(c.PrefillTokens)*share), 1)
	}
	if c.KVFraction > 0 {
		c.KVFraction *= share
	}
	if c.Waiting > 0 {
		c.Waiting = max(int(float64(c.Waiting)*share), 1)
	}
	return c
}

// roleSaturation counts p's targets that picks may choose and those that
// are saturated. Caller holds s.ledger.mu.
func (s *Scheduler) roleSaturation(role Role, p *pool, now time.Time, c SaturationConfig) RoleSaturation {
	r := RoleSaturation{Role: role}
	since := s.ledger.freshSince(now)
	at := now.UnixNano()
	checkEjected := s.health.count.Load() > 0
	for _, ts := range p.states {
		if checkEjected && ts.ejected(at) {
			continue
		}
		r.Targets++
		if s.saturatedBy(c, ts, s.ledger.loadSince(ts, since)) {
			r.Saturated++
		}
	}
	return r
}

// saturated reports whether a target with load ld is saturated.
func (s *Scheduler) saturated(ts *targetState, ld Load) bool {
	return s.saturatedBy(s.saturation, ts, ld)
}

// saturatedBy reports whether a target with load ld is saturated by c.
func (s *Scheduler) saturatedBy(c SaturationConfig, ts *targetState, ld Load) bool {
	if c.Waiting > 0 && ld.Fresh && ld.Waiting >= c.Waiting {
		return true
	}
	computes := ts.role == RolePrefill || !s.pd
	if computes && c.PrefillTokens > 0 && s.pendingPrompt(ts, ld) >= c.PrefillTokens {
		return true
	}
	if ts.role == RoleDecode && c.KVFraction > 0 && ld.Capacity > 0 {
		return float64(ld.Tokens) >= c.KVFraction*float64(ld.Capacity)
	}
	return false
}

// pendingPrompt is the prompt work a target has yet to compute: for a
// prefill target, its reported pending tokens, or the work duet reserved
// there (whichever is larger when reservations last until the leg ends:
// the engine's figure then includes them); for an aggregated engine,
// which reports its whole token load, the reserved work alone.
func (s *Scheduler) pendingPrompt(ts *targetState, ld Load) int64 {
	if ts.role != RolePrefill {
		return ld.ReservedWork
	}
	if s.ledger.prefillInFlight {
		return max(ld.ReservedWork, ld.Scraped)
	}
	return ld.ReservedWork + ld.Scraped
}

// EnginePriority reports whether every ready engine of the pool, of both
// roles, schedules by a request's priority field, and in the same order:
// only then may duet write the field, for both legs get the same body and
// an engine without priority scheduling may refuse it.
func (s *Scheduler) EnginePriority() (ps PriorityScheduling, ok bool) {
	snap := s.snap.Load()
	n := 0
	for _, ep := range snap.endpoints {
		if !ep.Ready {
			continue
		}
		if !ep.Priority.Enabled || n > 0 && ep.Priority != ps {
			return PriorityScheduling{}, false
		}
		ps = ep.Priority
		n++
	}
	return ps, n > 0
}
