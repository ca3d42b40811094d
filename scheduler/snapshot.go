package scheduler

// snapshot is an immutable view of the endpoints and the targets built from
// them. Discovery publishes a new one whenever an endpoint's state changes;
// picks read whichever is current. Nothing in a published snapshot is ever
// modified (the ledger entries it points at change under the ledger's lock).
type snapshot struct {
	endpoints []Endpoint // both roles: prefill first, then decode, in configuration order
	prefill   pool       // targets of ready prefill endpoints
	decode    pool       // targets of ready decode endpoints
	// byAddress maps a role and an "ip:port" address, as Envoy reports the
	// host a leg reached, to the endpoints (positions in endpoints) with
	// that Address.
	byAddress map[addressKey][]int
}

// addressKey is the key of snapshot.byAddress.
type addressKey struct {
	role    Role
	address string
}

// pool returns role's pool.
func (s *snapshot) pool(role Role) *pool {
	if role == RolePrefill {
		return &s.prefill
	}
	return &s.decode
}

// pool is one role's schedulable targets with their ledger entries.
type pool struct {
	targets []Target
	states  []*targetState    // states[i] is targets[i]'s ledger entry
	index   map[TargetKey]int // target key -> position in targets
	// decodeCache reports that some target's engine runs a decode radix
	// cache (Endpoint.DecodeCache).
	decodeCache bool
}

// newSnapshot builds a snapshot from the endpoints' states (it copies eps),
// creates ledger entries for new targets and drops those of targets that
// are no longer schedulable, with their reservations, prefix entries and
// target health records.
// Each target's entry is bound to its endpoint's health record in h.
func newSnapshot(eps []Endpoint, engineRanks bool, l *ledger, m *metrics, h *health, forget func(TargetKey)) *snapshot {
	s := &snapshot{endpoints: append([]Endpoint(nil), eps...), byAddress: make(map[addressKey][]int, len(eps))}
	var prefill, decode []*Endpoint
	for i := range s.endpoints {
		ep := &s.endpoints[i]
		if ep.Address != "" {
			k := addressKey{ep.Role, ep.Address}
			s.byAddress[k] = append(s.byAddress[k], i)
		}
		if !ep.Ready {
			continue
		}
		if ep.Role == RolePrefill {
			prefill = append(prefill, ep)
		} else {
			decode = append(decode, ep)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.prefill = newPool(buildTargets(prefill, engineRanks), l, m, h)
	s.decode = newPool(buildTargets(decode, engineRanks), l, m, h)
	l.retain(func(k TargetKey) bool {
		_, inPrefill := s.prefill.index[k]
		_, inDecode := s.decode.index[k]
		if !inPrefill && !inDecode {
			forget(k)
			h.forgetTarget(l.targets[k].health)
			return false
		}
		return true
	})
	return s
}

// newPool binds targets to their ledger entries, and those to the health
// records of the target and its endpoint. Caller holds l.mu.
func newPool(targets []Target, l *ledger, m *metrics, h *health) pool {
	p := pool{targets: targets, states: make([]*targetState, len(targets)), index: make(map[TargetKey]int, len(targets))}
	for i, t := range targets {
		key := t.Key()
		ts := l.state(key)
		ts.role, ts.label = t.Endpoint.Role, t.String()
		if m != nil && ts.picks == nil {
			ts.picks = m.picksFor(ts.role, ts.label)
		}
		if ts.health == nil {
			ts.health = newTargetHealth(t)
		}
		// Written only when it changes: DecodeFallback reads it without a
		// lock. A kept entry's endpoint record never changes (an endpoint
		// removed and added again gets new entries: it is undiscovered in
		// between, so its targets leave the ledger).
		if rec := h.endpoint(key.URL); ts.endpoint != rec {
			ts.endpoint = rec
		}
		p.states[i] = ts
		p.index[key] = i
		p.decodeCache = p.decodeCache || t.Endpoint.DecodeCache.Radix
	}
	return p
}

// buildTargets lists the targets of eps rank-major: rank 0 of every
// endpoint, then rank 1 of every endpoint with at least two ranks, and so
// on. A policy that walks the list in order therefore spreads consecutive
// requests over engines before it repeats one.
//
// An engine with a single rank has one target. Its rank is NoRank for a
// decode engine, which then keeps its own dispatch, and 0 for a prefill
// engine, whose rank is always known (bootstrap_room % 1 == 0).
//
// With engineRanks every engine has one target with NoRank: duet chooses
// engines only and leaves ranks to the engines' own dispatch.
func buildTargets(eps []*Endpoint, engineRanks bool) []Target {
	if engineRanks {
		targets := make([]Target, len(eps))
		for i, ep := range eps {
			targets[i] = Target{Endpoint: ep, Rank: NoRank}
		}
		return targets
	}
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
