package scheduler

import (
	"strconv"
	"strings"
)

// Feedback is what duet learns when a request, or one of its legs, ends.
type Feedback struct {
	// RequestID is the request's ID as given to Pick.
	RequestID string
	// Role is the leg that ended (RolePrefill or RoleDecode), or "" when
	// the whole request ended.
	Role Role
	// Target names the target that served the leg (Target.String()); used
	// for failure counts and health. Empty when unknown.
	Target string
	// Failed reports that the leg failed (error status, reset, timeout, or
	// Unreachable).
	Failed bool
	// Unreachable reports that the leg got no response from the engine's
	// host at all: the connection was refused or failed, or Envoy had no
	// healthy host. It implies Failed.
	Unreachable bool
	// PromptTokens is the engine-reported prompt length (usage), 0 when
	// not reported.
	PromptTokens int64
}

// Complete records feedback: it ends the request's reservations for the
// leg (or all of them), counts failures per target, feeds passive health
// (see docs/scheduling.md) and corrects the token estimate with the
// engine-reported prompt length. A leg whose Target names no known target is
// ignored for health.
func (s *Scheduler) Complete(f Feedback) {
	model, promptBytes, ok := s.ledger.release(f.RequestID, f.Role)
	if ok && f.PromptTokens > 0 {
		s.tokens.Observe(model, promptBytes, f.PromptTokens)
	}
	if f.Role != "" && f.Target != "" {
		s.legHealth(f)
	}
	if s.metrics == nil {
		return
	}
	if f.Failed && f.Role != "" {
		s.metrics.failures.WithLabelValues(string(f.Role), f.Target).Inc()
	}
	outcome := "released"
	if !ok {
		outcome = "unknown_request"
	}
	s.metrics.feedback.WithLabelValues(roleLabel(f.Role), outcome).Inc()
}

// legHealth applies one leg's outcome to its endpoint's and its target's
// health. An unreachable leg counts against the endpoint; a leg that reached
// the engine ends the endpoint's run of unreachable legs and, if it failed,
// counts against its target; a successful leg ends both runs and recovers
// them from half-open.
func (s *Scheduler) legHealth(f Feedback) {
	host, rank, ok := parseTarget(f.Target)
	if !ok {
		return
	}
	snap := s.snap.Load()
	p := snap.pool(f.Role)
	now := s.now()
	var evs []healthEvent
	// Endpoints that share an address are one engine as far as Envoy can
	// tell, so the leg speaks for each of them.
	for _, i := range snap.byHost[hostKey{role: f.Role, host: host}] {
		ep := &snap.endpoints[i]
		epRec := s.health.endpoint(ep.URL)
		var tRec *healthState
		if j, ok := p.index[TargetKey{URL: ep.URL, Rank: rank}]; ok {
			tRec = p.states[j].health
		}
		switch {
		case f.Unreachable:
			evs = s.health.fail(epRec, sigUnreachable, now, evs)
		case f.Failed:
			s.health.reset(epRec, sigUnreachable)
			if tRec != nil {
				evs = s.health.fail(tRec, sigFailures, now, evs)
			}
		default:
			evs = s.health.succeed(epRec, sigUnreachable, now, evs)
			if tRec != nil {
				evs = s.health.succeed(tRec, sigFailures, now, evs)
			}
		}
	}
	s.report(evs)
}

// parseTarget splits a Target.String() into the host part (address, or
// URL while unresolved) and the rank; ok is false if s is not in that form.
func parseTarget(s string) (host string, rank int, ok bool) {
	i := strings.LastIndex(s, "/dp")
	if i <= 0 {
		return "", 0, false
	}
	host, r := s[:i], s[i+len("/dp"):]
	if r == "-" {
		return host, NoRank, true
	}
	n, err := strconv.Atoi(r)
	if err != nil || n < 0 || n >= maxDPSize || strconv.Itoa(n) != r {
		return "", 0, false
	}
	return host, n, true
}

func roleLabel(r Role) string {
	if r == "" {
		return "request"
	}
	return string(r)
}
