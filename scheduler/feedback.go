package scheduler

// Feedback is what duet learns when a request, or one of its legs, ends.
type Feedback struct {
	// RequestID is the request's ID as given to Pick.
	RequestID string
	// Role is the leg that ended (RolePrefill or RoleDecode), or "" when
	// the whole request ended.
	Role Role
	// Address is the host ("ip:port") Envoy reached for the leg; "" when
	// none or for the whole request. With Rank it names the leg's target
	// for failure counts and health.
	Address string
	// Rank is the DP rank the leg carried, or NoRank.
	Rank int
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
	// CompletionTokens is the engine-reported answer length (usage) of
	// the whole request, 0 when not reported. A decode engine with a
	// decode radix cache keeps the answer on the rank that served it, and
	// the next turn's prompt starts with it. Usage's cached_tokens is never
	// read: SGLang's decode radix cache has reported it above prompt_tokens
	// (prefill and decode hits added up).
	CompletionTokens int64
}

// Complete records feedback: it ends the request's reservations for the
// leg (or all of them), counts failures per target, feeds passive health
// (see docs/scheduling.md) and corrects the token estimate with the
// engine-reported prompt length; a whole request's answer length extends
// what its decode target's cache is believed to hold. A leg whose Address and Rank name no known
// target is ignored for health. duet_feedback_total counts the feedback by
// leg and outcome: OutcomeReleased, OutcomeAlreadyReleased or
// OutcomeUnknownRequest.
//
// It returns the ejections the leg caused, each also passed to
// Config.OnEject (nil, as a rule), so that the caller can show them on the
// leg's trace.
func (s *Scheduler) Complete(f Feedback) (ejected []Ejection) {
	if f.Role == "" && f.CompletionTokens > 0 && !f.Failed {
		if end, sum, ok := s.ledger.turnEndOf(f.RequestID); ok {
			s.turnEnds.answered(end, sum, f.CompletionTokens)
		}
	}
	model, promptBytes, outcome := s.ledger.releaseLeg(f.RequestID, f.Role, f.Failed)
	ok := outcome == OutcomeReleased
	if ok {
		s.released()
	}
	if ok && f.PromptTokens > 0 {
		s.tokens.Observe(model, promptBytes, f.PromptTokens)
	}
	if f.Role != "" && f.Address != "" {
		ejected = s.legHealth(f)
	}
	if s.metrics == nil {
		return ejected
	}
	if f.Failed && f.Role != "" {
		target := ""
		if f.Address != "" {
			target = targetName(f.Address, f.Rank)
		}
		s.metrics.failures.WithLabelValues(string(f.Role), target).Inc()
	}
	s.metrics.feedback.WithLabelValues(roleLabel(f.Role), outcome).Inc()
	return ejected
}

// legHealth applies one leg's outcome to its endpoint's and its target's
// health. An unreachable leg counts against the endpoint; a leg that reached
// the engine ends the endpoint's run of unreachable legs and, if it failed,
// counts against its target; a successful leg ends both runs and recovers
// them from half-open. It returns the ejections it caused.
func (s *Scheduler) legHealth(f Feedback) []Ejection {
	snap := s.snap.Load()
	p := snap.pool(f.Role)
	now := s.now()
	var evs []healthEvent
	// Endpoints that share an address are one engine as far as Envoy can
	// tell, so the leg speaks for each of them.
	for _, i := range snap.byAddress[addressKey{role: f.Role, address: f.Address}] {
		ep := &snap.endpoints[i]
		epRec := s.health.endpoint(ep.URL)
		var tRec *healthState
		if j, ok := p.index[TargetKey{URL: ep.URL, Rank: f.Rank}]; ok {
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
	return s.report(evs)
}

func roleLabel(r Role) string {
	if r == "" {
		return "request"
	}
	return string(r)
}

// released tells OnRelease that the pool may have room again.
func (s *Scheduler) released() {
	if s.onRelease != nil {
		s.onRelease()
	}
}
