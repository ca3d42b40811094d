package scheduler

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/duet-router/duet/scheduler/prefix"
)

// Pick chooses the targets for one request: a decode target with the decode
// policy and, when a prefill pool is configured (and req is not
// DecodeOnly), a prefill target with the prefill policy. Ejected targets
// (and the targets of ejected endpoints) are not candidates. If a needed
// role has no ready endpoint, or all its targets are ejected, the error
// wraps ErrNoEndpoints and names the role (with no ready endpoint, it also
// counts the role's engines that report the wrong disaggregation_mode and
// those not reached yet); no policy runs and nothing is reserved.
//
// Choosing and reserving are atomic: under the ledger's lock each chosen
// target is charged the request's estimated tokens (prompt tokens on the
// prefill target; prompt plus expected output on the decode target) before
// any other pick reads the loads. Pick fills req.PromptTokens and req.Blocks.
func (s *Scheduler) Pick(ctx context.Context, req *Request) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("scheduler: pick: %w", err)
	}
	start := time.Now()
	if req == nil {
		req = &Request{}
	}
	pd := s.pd && !req.DecodeOnly
	snap := s.snap.Load()
	// Check both roles before asking any policy, so that a failed pick
	// leaves the policies' state untouched.
	if len(snap.decode.targets) == 0 {
		err := fmt.Errorf("scheduler: pick %s: %w: %s", RoleDecode, ErrNoEndpoints, unavailable(snap.endpoints, RoleDecode))
		s.recordFailure(req, err)
		return Decision{}, err
	}
	if pd && len(snap.prefill.targets) == 0 {
		err := fmt.Errorf("scheduler: pick %s: %w: %s", RolePrefill, ErrNoEndpoints, unavailable(snap.endpoints, RolePrefill))
		s.recordFailure(req, err)
		return Decision{}, err
	}
	id := req.ID
	if id == "" {
		id = "anonymous-" + strconv.FormatUint(s.anonymous.Add(1), 10)
	}
	var prefillTokens, decodeTokens int64
	if !req.DecodeOnly {
		s.prepare(req)
		prefillTokens = req.PromptTokens
		decodeTokens = s.decodeTokens(req)
	}

	// Match the prefix once for both roles, outside the pick lock (the index
	// has its own); a concurrent insert at worst shows up in the next pick.
	// Only roles whose policy reads prefix matches use the index.
	prefillIndexed := pd && readsPrefix(s.prefillPolicy)
	decodeIndexed := readsPrefix(s.decodePolicy)
	// Decode engines with a decode radix cache are indexed for a policy
	// that reads them, and only while the pool has one.
	decodeCache := !decodeIndexed && !req.DecodeOnly && snap.decode.decodeCache && readsDecodeCache(s.decodePolicy)
	turns := req.Items <= 1 && !req.DecodeOnly // turn ends: see turnEnds
	var matches []prefixMatch
	var perBlock float64
	if len(req.Blocks) > 0 && (prefillIndexed || decodeIndexed || decodeCache) {
		n := float64(len(req.Blocks))
		perBlock = s.tokensPerBlock(req)
		s.index.Match(req.Blocks, func(key TargetKey, matched int) {
			cached := min(int64(float64(matched)*perBlock), req.PromptTokens-1)
			matches = append(matches, prefixMatch{key: key, fraction: float64(matched) / n, tokens: max(cached, 0), blocks: matched})
		})
		if turns {
			s.extendToTurnEnds(req, matches)
		}
	}

	var d Decision
	var chosen [2]*targetState
	var prefillCands []Candidate
	var prefillFiltered bool
	var prefillCost, decodeCost []CostTerm // explained prices (req.Explain)
	s.ledger.mu.Lock()
	now := s.now()
	req.Now = now
	// The decision is recorded for Status in place, under the pick lock.
	rec := s.decisions.record(now, id, req.Path, req.Model)
	fail := func(err error) (Decision, error) {
		rec.err = err
		e := *rec
		s.ledger.mu.Unlock()
		s.explain(req, e, nil, nil)
		return Decision{}, err
	}
	if pd {
		prefillCands, prefillFiltered = s.candidates(&snap.prefill, matches, perBlock, now, &s.prefillScratch)
		if len(prefillCands) == 0 {
			return fail(allEjected(RolePrefill, len(snap.prefill.targets)))
		}
	}
	decodeCands, decodeFiltered := s.candidates(&snap.decode, matches, perBlock, now, &s.decodeScratch)
	if len(decodeCands) == 0 {
		return fail(allEjected(RoleDecode, len(snap.decode.targets)))
	}
	// The engines' word, where the view has one: token blocks only.
	viewed := s.cacheView != nil && len(req.TokenIDs) > 0 && perBlock > 0
	if viewed {
		if prefillIndexed {
			s.applyView(req, prefillCands, matches, perBlock)
		}
		if decodeIndexed || decodeCache {
			s.applyView(req, decodeCands, matches, perBlock)
		}
	}
	if pd {
		i, c, cost, err := s.choose(ctx, &snap.prefill, s.prefillPolicy, req, prefillCands, prefillFiltered)
		prefillCost = cost
		if err != nil {
			return fail(fmt.Errorf("scheduler: pick %s with %s: %w", RolePrefill, s.prefillPolicy.Name(), err))
		}
		t := snap.prefill.targets[i]
		d.Prefill = &t
		chosen[0] = snap.prefill.states[i]
		chosen[0].picked++
		s.ledger.reserveWork(chosen[0], id, RolePrefill, prefillTokens, prefillTokens-c.CachedTokens, now, req.Model, len(req.Prompt))
		rec.prefill = choice{target: t, candidates: len(prefillCands), load: c.Load.Tokens, prefix: c.Prefix, cached: c.CachedTokens, tokens: prefillTokens}
	}
	i, c, decodeCost, err := s.choose(ctx, &snap.decode, s.decodePolicy, req, decodeCands, decodeFiltered)
	if err != nil {
		if pd {
			s.ledger.releaseLocked(id, RolePrefill)
		}
		rec.prefill = choice{}
		return fail(fmt.Errorf("scheduler: pick %s with %s: %w", RoleDecode, s.decodePolicy.Name(), err))
	}
	d.Decode = snap.decode.targets[i]
	chosen[1] = snap.decode.states[i]
	chosen[1].picked++
	s.ledger.reserve(chosen[1], id, RoleDecode, decodeTokens, now, req.Model, len(req.Prompt))
	rec.decode = choice{target: d.Decode, candidates: len(decodeCands), load: c.Load.Tokens, prefix: c.Prefix, cached: c.CachedTokens, tokens: decodeTokens}
	indexed := [2]bool{prefillIndexed, decodeIndexed || decodeCache && d.Decode.Endpoint.DecodeCache.Radix}
	// Where the prompt ends on the targets whose caches keep it: the
	// prefill target of an indexed role, and a decode target with a
	// decode radix cache (which keeps the answer too, once reported).
	var ends, replaces [2]*turnEnd
	var chain turnChain
	if turns && len(req.Blocks) > 0 && (indexed[0] || indexed[1] && decodeCache) {
		chain = chainOf(req, s.unitsPerBlock(req))
		last := req.Blocks[len(req.Blocks)-1]
		if indexed[0] {
			ends[0] = &turnEnd{target: chosen[0].key, block: last}
		}
		if indexed[1] && decodeCache {
			ends[1] = &turnEnd{target: chosen[1].key, block: last}
			s.ledger.setTurnEnd(id, ends[1], chain.sum)
		}
		for i, e := range ends {
			if e != nil {
				replaces[i] = extended(req, matches, e.target)
			}
		}
	}
	var picked Picked
	if s.onPicked != nil {
		picked = s.picked(id, req, chosen, indexed)
		for i, e := range ends {
			if e != nil {
				pe := PickedTurnEnd{Target: e.target, Block: e.block,
					Tokens: chain.tokens, Units: chain.units, Sum: chain.sum, Answered: i == 1}
				if r := replaces[i]; r != nil {
					pe.Replaces = &r.block
				}
				picked.TurnEnds = append(picked.TurnEnds, pe)
			}
		}
	}
	var explained decisionEntry // the decision, for req.Explain
	if req.Explain != nil {
		explained = *rec
	}
	s.ledger.mu.Unlock()
	s.explain(req, explained, prefillCost, decodeCost)
	if s.onPicked != nil {
		s.onPicked(picked)
	}
	for i, e := range ends {
		if e != nil {
			s.turnEnds.put(*e, chain, replaces[i])
		}
	}

	for i, ts := range chosen {
		if ts == nil {
			continue
		}
		if len(req.Blocks) > 0 && indexed[i] {
			ts.indexedBlocks.Store(int64(s.index.Insert(ts.key, req.Blocks)))
			if viewed {
				s.cacheView.Routed(ts.key, req.Blocks, now)
			}
		}
		if ts.picks != nil {
			ts.picks.Inc()
		}
	}
	if s.metrics != nil {
		s.metrics.pickSeconds.Observe(time.Since(start).Seconds())
	}
	return d, nil
}

// prepare estimates the prompt's tokens and hashes its prefix blocks.
func (s *Scheduler) prepare(req *Request) {
	if req.prepared {
		return
	}
	req.prepared = true
	items := int64(max(req.Items, 1))
	if len(req.TokenIDs) > 0 {
		req.PromptTokens = int64(len(req.TokenIDs)) * items
		req.Blocks = s.hasher.Tokens(req.TokenIDs, req.Blocks[:0])
		return
	}
	// Never zero: a request without text still occupies the engine.
	req.PromptTokens = s.tokens.Estimate(req.Model, len(req.Prompt)) * items
	req.Blocks = s.hasher.Text(req.Prompt, req.Blocks[:0])
}

// Cost is the tokens req will occupy the engines with, as Pick will
// reserve them on its decode target: its prompt's estimated tokens plus
// its expected output (0 for a DecodeOnly request). It fills
// req.PromptTokens and req.Blocks, which Pick then reuses.
func (s *Scheduler) Cost(req *Request) int64 {
	if req.DecodeOnly {
		return 0
	}
	s.prepare(req)
	return s.decodeTokens(req)
}

// decodeTokens is the decode reservation of a prepared request.
func (s *Scheduler) decodeTokens(req *Request) int64 {
	return req.PromptTokens + int64(max(req.Items, 1))*int64(s.outputTokens(req))
}

// outputTokens is the decode reservation's expected output per item: the
// requested maximum, capped by the configured default (clients often ask
// for far more than they get; scrapes correct the estimate soon anyway).
func (s *Scheduler) outputTokens(req *Request) int {
	if req.MaxTokens > 0 {
		return min(req.MaxTokens, s.defaultMaxTokens)
	}
	return s.defaultMaxTokens
}

// prefixMatch is one target's share of the request's prompt blocks that the
// prefix index believes it caches, and the same in tokens and blocks.
type prefixMatch struct {
	key      TargetKey
	fraction float64
	tokens   int64
	blocks   int
	// extends reports that the prompt extends the earlier turn that ended
	// on key at its last matched block (see extendToTurnEnds).
	extends bool
}

// extendToTurnEnds raises each match that ends where an earlier turn routed
// to the same target ended, if the request's prompt starts with that
// turn's whole prompt (same checksum over its length), to what that turn
// left in the target's cache: its whole prompt, beyond the hashed blocks,
// and on a decode target with a decode radix cache, once reported, its
// answer (see turnEnds). At most the prompt less one token counts, as
// everywhere: the engine always computes the last token.
func (s *Scheduler) extendToTurnEnds(req *Request, matches []prefixMatch) {
	units, per := promptUnits(req), s.unitsPerBlock(req)
	var sumFrom, sumTo int
	var sum uint64
	var summed bool
	for i := range matches {
		m := &matches[i]
		if m.blocks == 0 {
			continue
		}
		c, ok := s.turnEnds.lookup(turnEnd{target: m.key, block: req.Blocks[m.blocks-1]})
		from := m.blocks * per
		if !ok || c.units > units || from > c.units {
			continue
		}
		if !summed || from != sumFrom || c.units != sumTo {
			sumFrom, sumTo, sum, summed = from, c.units, promptSum(req, from, c.units), true
		}
		if sum == c.sum {
			m.tokens = max(m.tokens, min(c.tokens, req.PromptTokens-1))
			m.extends = true
		}
	}
}

// unitsPerBlock is how many prompt units (bytes of text, or token ids)
// one hashed block covers.
func (s *Scheduler) unitsPerBlock(req *Request) int {
	if len(req.TokenIDs) > 0 {
		return orPositive(s.hasher.BlockTokens, prefix.DefaultBlockTokens)
	}
	return orPositive(s.hasher.BlockBytes, prefix.DefaultBlockBytes)
}

// extended returns the earlier turn end that req's prompt extends on
// target (prefixMatch.extends), or nil.
func extended(req *Request, matches []prefixMatch, target TargetKey) *turnEnd {
	for _, m := range matches {
		if m.key == target && m.extends {
			return &turnEnd{target: target, block: req.Blocks[m.blocks-1]}
		}
	}
	return nil
}

// tokensPerBlock is the estimated prompt tokens one hashed block stands
// for: the prompt's tokens spread over its length in block units.
func (s *Scheduler) tokensPerBlock(req *Request) float64 {
	if len(req.TokenIDs) > 0 {
		return float64(orPositive(s.hasher.BlockTokens, prefix.DefaultBlockTokens)) * float64(req.PromptTokens) / float64(len(req.TokenIDs))
	}
	if len(req.Prompt) == 0 {
		return 0
	}
	return float64(orPositive(s.hasher.BlockBytes, prefix.DefaultBlockBytes)) * float64(req.PromptTokens) / float64(len(req.Prompt))
}

// orPositive returns v, or def when v is not positive.
func orPositive(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// allEjected is Pick's error when every target of role is ejected.
func allEjected(role Role, n int) error {
	return fmt.Errorf("scheduler: pick %s: all %d targets are ejected: %w", role, n, ErrNoEndpoints)
}

// candidates lists p's targets with their current loads and prefix
// matches, leaving out ejected ones; filtered reports whether any was left
// out (the candidates' positions then differ from the pool's). perBlock
// converts the index's blocks to tokens (0 when the request was not
// matched). Caller holds s.ledger.mu (which also guards the scratch
// slices).
func (s *Scheduler) candidates(p *pool, matches []prefixMatch, perBlock float64, now time.Time, scratch *[]Candidate) (cands []Candidate, filtered bool) {
	cands = (*scratch)[:0]
	since := s.ledger.freshSince(now)
	// While no record is ejected or half-open, no target is skipped and a
	// candidate's position is its position in the pool.
	if s.health.count.Load() == 0 {
		for i, t := range p.targets {
			cands = append(cands, Candidate{Target: t, Load: s.ledger.loadSince(p.states[i], since), IndexedTokens: s.indexedTokens(p.states[i], perBlock)})
		}
		for _, m := range matches {
			if i, ok := p.index[m.key]; ok {
				cands[i].Prefix, cands[i].CachedTokens = m.fraction, m.tokens
			}
		}
		*scratch = cands
		return cands, false
	}
	at := now.UnixNano()
	pos := s.posScratch[:0] // pool position -> candidate position, or -1
	for i, t := range p.targets {
		ts := p.states[i]
		if ts.ejected(at) {
			pos = append(pos, -1)
			continue
		}
		pos = append(pos, int32(len(cands)))
		cands = append(cands, Candidate{Target: t, Load: s.ledger.loadSince(ts, since), IndexedTokens: s.indexedTokens(ts, perBlock)})
	}
	for _, m := range matches {
		if i, ok := p.index[m.key]; ok && pos[i] >= 0 {
			cands[pos[i]].Prefix, cands[pos[i]].CachedTokens = m.fraction, m.tokens
		}
	}
	s.posScratch = pos
	*scratch = cands
	return cands, len(cands) < len(p.targets)
}

// indexedTokens is what duet believes ts's cache holds: its blocks in the
// prefix index, perBlock tokens each, or the chains of the turns routed
// there (turnEnds), which count whole prompts beyond the hashed blocks,
// whichever is more. Without a matched request (perBlock 0) it is 0.
// Caller holds s.ledger.mu, which guards ts.turnTokens.
func (s *Scheduler) indexedTokens(ts *targetState, perBlock float64) int64 {
	if perBlock == 0 {
		return 0
	}
	if ts.turnTokens == nil {
		ts.turnTokens = s.turnEnds.counter(ts.key)
	}
	return max(ts.indexedTokens(perBlock), ts.turnTokens.Load())
}

// choose runs policy over cands, built from p by candidates, and returns
// the chosen target's position in p and its candidate, and, for a request
// that asks for an explanation (Request.Explain) and a policy that gives
// one (CostExplainer), the parts of its price. Caller holds s.ledger.mu.
func (s *Scheduler) choose(ctx context.Context, p *pool, policy Policy, req *Request, cands []Candidate, filtered bool) (int, Candidate, []CostTerm, error) {
	i, err := policy.Pick(ctx, req, cands)
	if err != nil {
		return 0, Candidate{}, nil, err
	}
	if i < 0 || i >= len(cands) {
		return 0, Candidate{}, nil, fmt.Errorf("policy returned index %d of %d candidates", i, len(cands))
	}
	var cost []CostTerm
	if req.Explain != nil {
		if e, ok := policy.(CostExplainer); ok {
			cost = e.ExplainCost(req, cands, i)
		}
	}
	c := cands[i]
	if filtered {
		i = p.index[c.Key()]
	}
	return i, c, cost, nil
}
