package scheduler

// snapshot is an immutable view of the endpoints and the targets built from
// them. Discovery publishes a new one whenever an endpoint's state changes;
// picks read whichever is current. Nothing in a published snapshot is ever
// modified.
type snapshot struct {
	endpoints []Endpoint // both roles: prefill first, then decode, in configuration order
	prefill   []Target   // targets of ready prefill endpoints
	decode    []Target   // targets of ready decode endpoints
}

// newSnapshot builds a snapshot from the endpoints' states. It copies eps.
func newSnapshot(eps []Endpoint) *snapshot {
	s := &snapshot{endpoints: append([]Endpoint(nil), eps...)}
	var prefill, decode []*Endpoint
	for i := range s.endpoints {
		ep := &s.endpoints[i]
		if !ep.Ready {
			continue
		}
		if ep.Role == RolePrefill {
			prefill = append(prefill, ep)
		} else {
			decode = append(decode, ep)
		}
	}
	s.prefill = buildTargets(prefill)
	s.decode = buildTargets(decode)
	return s
}

// buildTargets lists the targets of eps rank-major: rank 0 of every
// endpoint, then rank 1 of every endpoint with at least two ranks, and so
// on. A policy that walks the list in order therefore spreads consecutive
// requests over engines before it repeats one.
//
// An engine with a single rank has one target. Its rank is NoRank for a
// decode engine, which then keeps its own dispatch, and 0 for a prefill
// engine, whose rank is always known (bootstrap_room % 1 == 0).
func buildTargets(eps []*Endpoint) []Target {
	n, maxDP := 0, 0
	for _, ep := range eps {
		n += ep.DPSize
		maxDP = max(maxDP, ep.DPSize)
	}
	if n == 0 {
		return nil
	}
	targets := make([]Target, 0, n)
	for r := range maxDP {
		for _, ep := range eps {
			if r >= ep.DPSize {
				continue
			}
			rank := r
			if ep.DPSize == 1 && ep.Role == RoleDecode {
				rank = NoRank
			}
			targets = append(targets, Target{Endpoint: ep, Rank: rank})
		}
	}
	return targets
}
