package scheduler

// DecodeFallback returns the decode engine that should take a request
// routed to d if d's engine refuses the connection (Envoy retries once on
// the next host duet lists, before any byte reached an engine): another
// ready engine that is not ejected and can serve d's rank (its DP size is
// larger than the rank, or d pins none). Consecutive calls rotate over the
// eligible engines. It returns nil when there is none.
//
// The fallback is not reserved: it is used only when the chosen engine is
// dead, and then completion feedback releases the chosen target's
// reservation and ejects it.
func (s *Scheduler) DecodeFallback(d Target) *Endpoint {
	if d.Endpoint == nil {
		return nil
	}
	snap := s.snap.Load()
	p := &snap.decode
	n := len(p.targets)
	if n < 2 {
		return nil
	}
	now := s.now().UnixNano()
	start := int(s.fallbackTurn.Add(1) % uint64(n))
	for k := range n {
		i := (start + k) % n
		t := p.targets[i]
		ep := t.Endpoint
		if ep.URL == d.Endpoint.URL || ep.Address == "" || p.states[i].ejected(now) {
			continue
		}
		if d.Rank != NoRank && ep.DPSize <= d.Rank {
			continue
		}
		return ep
	}
	return nil
}
