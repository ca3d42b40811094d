package peers

import (
	"context"
	"math/rand/v2"

	"github.com/duet-router/duet/scheduler"
)

// SMG's cache_aware parameters, as SMG's CLI defaults them
// (smg-project/smg@f8daa8835a8b model_gateway/src/main.rs, "Routing
// Policy" group: --cache-threshold 0.3, --balance-abs-threshold 64,
// --balance-rel-threshold 1.5). The struct defaults in
// model_gateway/src/policies/mod.rs (0.5, 32, 1.1) apply only to
// programmatic use and are not ported.
const (
	smgCacheThreshold = 0.3
	smgBalanceAbs     = 64 // requests in flight, not tokens
	smgBalanceRel     = 1.5
)

// smgPolicy is SMG's cache_aware worker selection, ported for both SMG
// peers:
//
//   - smg_cache_aware: every candidate target is a worker, as with SMG's
//     --dp-aware, which registers one worker per DP rank ("{url}@{rank}",
//     model_gateway/src/worker/builder.rs) and so keeps one cache tenant
//     and one in-flight count per rank;
//   - smg_dp_min_tokens (dpMin): every engine is a worker (SMG without
//     --dp-aware); cache_aware chooses the engine and MinimumTokensPolicy
//     then chooses its rank (see smg_dp_min_tokens.go).
//
// The selection, from CacheAwarePolicy::select_worker and
// select_worker_with_text in model_gateway/src/policies/cache_aware.rs
// (smg-project/smg@f8daa8835a8b), for one request:
//
//  1. Over the workers, gather each one's router-side load (requests in
//     flight), the mean load, and the least-loaded worker, ties broken by
//     fewer requests processed so far, then by position
//     (select_worker: "Min-load worker, (load, processed_requests, idx)").
//  2. match_rate is the longest cached prefix's share of the request. If
//     match_rate > cache_threshold (strictly), the candidates are the
//     workers holding that longest match (the tree's matched tenants); the
//     least loaded of them wins, exact ties at random
//     (select_matched_candidate, argmax_with_random_ties: with the default
//     overlap_decay 0 every holder scores 1.0, so only the load orders
//     them). Otherwise the least-loaded worker of step 1 wins.
//  3. The spill gate (gate_selected_candidate): a cache holder whose load
//     is above balance_rel x mean AND above mean + balance_abs gives the
//     request to the least-loaded worker of step 1 instead.
//  4. The chosen worker's processed count and load go up by one; the load
//     comes down when the request ends.
//
// This is SMG's current gate: the per-request spill gate against the
// healthy-fleet mean, introduced by smg-project/smg@e19055424 ("pressure-
// select among matched cache tenants with a per-request load gate", #2161,
// 2026-08-16). The older gate, still described in the file's header
// comment and ported as duet's own cache_aware policy, was pool-wide:
// (max - min) > abs AND max > rel x min over all workers sent every
// request to the least-loaded worker. SMG now abandons affinity
// fleet-wide only on backend KV pressure (is_kv_imbalanced), whose two
// triggers (--balance-token-usage-threshold, --overload-token-usage-
// threshold) default to 1.0, i.e. off; they are not ported.
//
// Adapted to duet's signals:
//   - match_rate: SMG walks a radix tree over the characters of the
//     prompts it routed (HTTP), evicted down to --max-tree-size 64 Mi
//     characters every --eviction-interval 120 s. The port reads
//     Candidate.Prefix instead: the share of the prompt's 64-byte blocks
//     (first 1024 blocks only) that duet's prefix index, an LRU of the
//     blocks routed to each target, holds. The matched tenants are the
//     workers whose Prefix equals the best. For an engine-level worker
//     (dpMin), the match is the best over the engine's ranks, since SMG's
//     tenant there is the engine URL and duet records the chosen rank.
//   - load: SMG's Worker::load() is a router-side counter of requests in
//     flight (WorkerLoadGuard). The port keeps its own: up on its pick, down
//     when the scheduler reports the leg's end (ObserveLeg). In PD, SMG
//     holds the prefill worker's count until the decode response ends;
//     NewPair links the two roles' instances to do the same, New releases
//     at the prefill leg's end.
//   - ties on (load, processed): SMG orders workers by registration (with
//     --dp-aware, one engine's ranks after another); duet lists candidates
//     rank-major, and the port breaks the last tie by that order.
//   - matched tenants: SMG's string tree returns at most 8 holders of the
//     deepest matched node (crates/kv_index MATCHED_TENANTS_CAP), in map
//     order; the port considers every candidate with the best match.
type smgPolicy struct {
	name  string
	dpMin bool
	rng   *rand.Rand

	// load and processed are SMG's per-worker counters, keyed by worker:
	// the target for smg_cache_aware, {engine URL, NoRank} for
	// smg_dp_min_tokens.
	load      map[scheduler.TargetKey]int
	processed map[scheduler.TargetKey]int
	// holds maps each pick (by request, and the leg's target) to the
	// worker whose load it holds.
	holds holds[smgHold]

	// paired marks the prefill half of NewPair: its holds end with the
	// request's decode leg (released by the decode half), except for picks
	// without a request ID, which end with the prefill leg.
	paired bool
	// releasedEarly lists, on a paired prefill half, the requests whose
	// hold the decode half released before the prefill leg was reported.
	releasedEarly map[string]struct{}
	// pairedPrefill is, on the decode half of NewPair, the prefill half.
	pairedPrefill *smgPolicy

	// ranks is MinimumTokensPolicy's per-rank token cache (dpMin only).
	ranks dpRankCache

	workers []smgWorker // scratch, reused across picks
}

// smgHold is the load one pick holds: on worker, until the leg ends (or,
// on a paired prefill half, until the request's decode leg ends; legEnded
// then records that the prefill leg itself has been reported).
type smgHold struct {
	worker   scheduler.TargetKey
	legEnded bool
}

// smgWorker is one worker as a pick sees it.
type smgWorker struct {
	key       scheduler.TargetKey
	cand      int // a candidate of this worker (its only one unless dpMin)
	load      int
	processed int
	prefix    float64
}

func newSMG(name string, role scheduler.Role, dpMin bool) *smgPolicy {
	return &smgPolicy{
		name:          name,
		dpMin:         dpMin,
		rng:           newRand(name, role),
		load:          make(map[scheduler.TargetKey]int),
		processed:     make(map[scheduler.TargetKey]int),
		holds:         newHolds[smgHold](),
		releasedEarly: make(map[string]struct{}),
		ranks:         newDPRankCache(),
	}
}

// Name implements scheduler.Policy.
func (p *smgPolicy) Name() string { return p.name }

// ReadsPrefix implements scheduler.PrefixReader: the cache match is
// cache_aware's main input.
func (*smgPolicy) ReadsPrefix() bool { return true }

// workerKey is the worker a target belongs to.
func (p *smgPolicy) workerKey(t scheduler.TargetKey) scheduler.TargetKey {
	if p.dpMin {
		return scheduler.TargetKey{URL: t.URL, Rank: scheduler.NoRank}
	}
	return t
}

// Pick implements scheduler.Policy.
func (p *smgPolicy) Pick(_ context.Context, req *scheduler.Request, cands []scheduler.Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noCandidates(p.name)
	}
	ws := p.gather(cands)
	w := ws[smgSelect(ws, p.rng)]
	i := w.cand
	if p.dpMin {
		i = p.ranks.pick(req, cands, w.key.URL)
	}
	p.load[w.key]++
	p.processed[w.key]++
	p.holds.add(req.ID, cands[i].Key(), smgHold{worker: w.key})
	return i, nil
}

// gather builds the workers of one pick: one per candidate, or one per
// engine (in order of first appearance) when dpMin.
func (p *smgPolicy) gather(cands []scheduler.Candidate) []smgWorker {
	ws := p.workers[:0]
	for i := range cands {
		c := &cands[i]
		key := p.workerKey(c.Key())
		if p.dpMin {
			found := false
			for j := range ws {
				if ws[j].key == key {
					ws[j].prefix = max(ws[j].prefix, c.Prefix)
					found = true
					break
				}
			}
			if found {
				continue
			}
		}
		ws = append(ws, smgWorker{key: key, cand: i, load: p.load[key], processed: p.processed[key], prefix: c.Prefix})
	}
	p.workers = ws
	return ws
}

// smgSelect is cache_aware's choice among ws (not empty): steps 1 to 3 of
// smgPolicy's comment. It returns an index in ws.
func smgSelect(ws []smgWorker, rng *rand.Rand) int {
	// Step 1 (CacheAwarePolicy::select_worker): mean load and the
	// least-loaded worker by (load, processed, position).
	least, sum := 0, 0
	best := ws[0].prefix
	for i := range ws {
		w := &ws[i]
		sum += w.load
		if l := &ws[least]; w.load < l.load || w.load == l.load && w.processed < l.processed {
			least = i
		}
		best = max(best, w.prefix)
	}
	avg := float64(sum) / float64(len(ws))
	// Step 2 (select_worker_with_text): below the threshold, the
	// least-loaded worker; "match_rate > self.config.cache_threshold".
	if !(best > smgCacheThreshold) {
		return least
	}
	// select_matched_candidate + argmax_with_random_ties: the least-loaded
	// holder of the longest match, exact ties at random.
	sel, ties := -1, 0
	for i := range ws {
		w := &ws[i]
		if w.prefix != best {
			continue
		}
		switch {
		case sel < 0 || w.load < ws[sel].load:
			sel, ties = i, 1
		case w.load == ws[sel].load:
			ties++
			if tieBreak(rng, ties) {
				sel = i
			}
		}
	}
	// Step 3 (gate_selected_candidate): both margins must clear.
	if l := float64(ws[sel].load); l > avg*smgBalanceRel && l > avg+smgBalanceAbs {
		return least
	}
	return sel
}

// ObserveLeg implements scheduler.LegObserver: the leg's end releases the
// worker load its pick added (SMG's WorkerLoadGuard drop; the count
// saturates at zero as in Worker::decrement_load).
func (p *smgPolicy) ObserveLeg(r scheduler.LegReport) {
	if p.paired {
		if _, ok := p.releasedEarly[r.RequestID]; ok {
			delete(p.releasedEarly, r.RequestID)
			return
		}
		if e, ok := p.holds.byID[r.RequestID]; ok && e.target == r.Target {
			// The decode half releases it with the request's decode leg.
			e.v.legEnded = true
			p.holds.byID[r.RequestID] = e
			return
		}
		if h, ok := p.holds.takeAnon(r.Target); ok {
			p.release(h.worker)
		}
		return
	}
	if h, ok := p.holds.take(r); ok {
		p.release(h.worker)
	}
	if pp := p.pairedPrefill; pp != nil {
		if e, ok := pp.holds.takeID(r.RequestID); ok {
			pp.release(e.v.worker)
			if !e.v.legEnded {
				pp.releasedEarly[r.RequestID] = struct{}{}
			}
		}
	}
}

// release takes one request off worker w's load.
func (p *smgPolicy) release(w scheduler.TargetKey) {
	switch n := p.load[w]; {
	case n > 1:
		p.load[w] = n - 1
	case n == 1:
		delete(p.load, w)
	}
}
