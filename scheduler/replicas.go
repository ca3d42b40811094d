package scheduler

// Several duet replicas route for one gateway. Each keeps its own view of
// the cluster: reservations, prefill holds, the prefix index and health.
// So that every replica sees the work the others sent, a replica tells the
// others what each pick changed (Config.OnPicked) and what each leg's
// feedback was (a Feedback, as Complete takes it), and applies theirs:
// ApplyPicked for a pick, Complete for a leg. Scrapes and probes need no
// sharing: every replica scrapes and probes every engine itself. The
// transport (NATS) is outside this package.

// Picked is what one pick changed in a scheduler's state: the holds it
// reserved and the prefix blocks it indexed.
type Picked struct {
	// RequestID is duet's id of the request (Request.ID).
	RequestID string `json:"id"`
	// Pool is the scheduler's pool (Config.Pool): ApplyPicked belongs to
	// the scheduler of the same pool.
	Pool string `json:"pool,omitempty"`
	// Model and PromptBytes are kept with the reservation for the token
	// estimate's correction when the request's usage is reported.
	Model       string `json:"model,omitempty"`
	PromptBytes int    `json:"prompt_bytes,omitempty"`
	// Holds are the tokens reserved on each chosen target.
	Holds []PickedHold `json:"holds"`
	// Blocks are the prompt's prefix block hashes, and Indexed the targets
	// whose prefix index got them.
	Blocks  []uint64    `json:"blocks,omitempty"`
	Indexed []TargetKey `json:"indexed,omitempty"`
	// TurnEnds are where the prompt ended on the chosen targets whose
	// caches keep it (see Scheduler's turn ends).
	TurnEnds []PickedTurnEnd `json:"turn_ends,omitempty"`
}

// PickedTurnEnd is where a prompt ended on a target: its last hashed
// block, its tokens, its length (bytes of text, or token ids) and
// checksum. Answered marks a decode target with a decode radix cache,
// whose chain grows by the answer once the request's usage is reported.
type PickedTurnEnd struct {
	Target   TargetKey `json:"target"`
	Block    uint64    `json:"block"`
	Tokens   int64     `json:"tokens"`
	Units    int       `json:"units"`
	Sum      uint64    `json:"sum"`
	Answered bool      `json:"answered,omitempty"`
	// Replaces is the last block of the earlier turn this prompt extends
	// on the target, whose end it replaces; nil when none.
	Replaces *uint64 `json:"replaces,omitempty"`
}

// PickedHold is one reservation of a pick.
type PickedHold struct {
	Role   Role      `json:"role"`
	Target TargetKey `json:"target"`
	// Tokens are reserved on the target, of which Work are expected to be
	// computed there (the rest was believed cached).
	Tokens int64 `json:"tokens"`
	Work   int64 `json:"work"`
}

// ApplyPicked applies another replica's pick: its holds are reserved here
// as if this scheduler had made them (they end as local holds do: with the
// legs' feedback, a covering scrape, or the reservation TTL), and its
// prefix blocks are indexed on the same targets. Targets this scheduler
// does not know (not schedulable here, or gone) are skipped, and a pick
// of a request the ledger already holds is applied once.
func (s *Scheduler) ApplyPicked(p Picked) {
	l := s.ledger
	l.mu.Lock()
	if _, known := l.requests[p.RequestID]; known {
		l.mu.Unlock()
		return // applied already (an event sent twice)
	}
	now := s.now()
	for _, h := range p.Holds {
		if ts, ok := l.targets[h.Target]; ok {
			l.reserveWork(ts, p.RequestID, h.Role, h.Tokens, h.Work, now, p.Model, p.PromptBytes)
		}
	}
	indexed := make([]*targetState, 0, len(p.Indexed))
	for _, key := range p.Indexed {
		if ts, ok := l.targets[key]; ok {
			indexed = append(indexed, ts)
		}
	}
	var ends []PickedTurnEnd
	for _, e := range p.TurnEnds {
		if _, ok := l.targets[e.Target]; ok {
			ends = append(ends, e)
			if e.Answered {
				l.setTurnEnd(p.RequestID, &turnEnd{target: e.Target, block: e.Block}, e.Sum)
			}
		}
	}
	l.mu.Unlock()
	for _, e := range ends {
		var replaces *turnEnd
		if e.Replaces != nil {
			replaces = &turnEnd{target: e.Target, block: *e.Replaces}
		}
		s.turnEnds.put(turnEnd{target: e.Target, block: e.Block}, turnChain{tokens: e.Tokens, units: e.Units, sum: e.Sum}, replaces)
	}
	if len(p.Blocks) == 0 {
		return
	}
	for _, ts := range indexed {
		ts.indexedBlocks.Store(int64(s.index.Insert(ts.key, p.Blocks)))
	}
}

// picked builds the Picked of a pick of request id that chose the targets
// in chosen (prefill, decode; nil where none) with their reservations.
// Caller holds s.ledger.mu.
func (s *Scheduler) picked(id string, req *Request, chosen [2]*targetState, indexed [2]bool) Picked {
	p := Picked{RequestID: id, Pool: s.pool, Model: req.Model, PromptBytes: len(req.Prompt)}
	if res, ok := s.ledger.requests[id]; ok {
		for _, h := range res.holds {
			p.Holds = append(p.Holds, PickedHold{Role: h.role, Target: h.target.key, Tokens: h.tokens, Work: h.work})
		}
	}
	if len(req.Blocks) > 0 {
		for i, ts := range chosen {
			if ts != nil && indexed[i] {
				p.Indexed = append(p.Indexed, ts.key)
			}
		}
		if len(p.Indexed) > 0 {
			// req.Blocks is the caller's memory, reused after Pick.
			p.Blocks = append([]uint64(nil), req.Blocks...)
		}
	}
	return p
}
