package scheduler

// Feedback is what duet learns when a request, or one of its legs, ends.
type Feedback struct {
	// RequestID is the request's ID as given to Pick.
	RequestID string
	// Role is the leg that ended (RolePrefill or RoleDecode), or "" when
	// the whole request ended.
	Role Role
	// Target names the target that served the leg (Target.String()); used
	// for failure counts. Empty when unknown.
	Target string
	// Failed reports that the leg failed (error status, reset, timeout).
	Failed bool
	// PromptTokens is the engine-reported prompt length (usage), 0 when
	// not reported.
	PromptTokens int64
}

// Complete records feedback: it ends the request's reservations for the
// leg (or all of them), counts failures per target, and corrects the token
// estimate with the engine-reported prompt length.
func (s *Scheduler) Complete(f Feedback) {
	model, promptBytes, ok := s.ledger.release(f.RequestID, f.Role)
	if ok && f.PromptTokens > 0 {
		s.tokens.Observe(model, promptBytes, f.PromptTokens)
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

func roleLabel(r Role) string {
	if r == "" {
		return "request"
	}
	return string(r)
}
