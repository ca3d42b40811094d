package scheduler

import (
	"net"
	"strconv"
	"time"

	"github.com/duet-router/duet/scheduler/kvevents"
)

// CacheView is the engines' own account of what their prefix caches hold,
// per target: their KV events (a *kvevents.Tracker[TargetKey]), or in the
// routing-quality simulator the engine model's cache. Where it has a word
// for a target, that word replaces the prefix index's estimate for
// requests hashed in token blocks (Request.TokenIDs); where it has none
// (no events, or they stopped), the estimate stays.
type CacheView interface {
	// SetTargets names the targets to follow, after every change of the
	// pools: those of ready engines that advertise events.
	SetTargets(targets []kvevents.Target[TargetKey])
	// Match reports how many of blocks (a request's token block hashes,
	// from block 0) key's cache holds; false when the view has no word
	// for key.
	Match(key TargetKey, blocks []uint64) (kvevents.Match, bool)
	// Routed records that blocks were routed to key at now, so that they
	// count as cached there before the engine reports them.
	Routed(key TargetKey, blocks []uint64, now time.Time)
}

// hostTierWeight is the share of a prefill a block held only in a slower
// tier (HiCache's host memory, disk, a remote pool) saves: loading it back
// costs a transfer the GPU tier does not. Not tuned; see
// docs/scheduling.md.
const hostTierWeight = 0.75

// cacheTargets lists the targets of the ready endpoints that advertise KV
// events, with the socket each rank publishes on.
func cacheTargets(eps []Endpoint) []kvevents.Target[TargetKey] {
	var out []kvevents.Target[TargetKey]
	for i := range eps {
		ep := &eps[i]
		ev := ep.KVEvents
		if !ep.Ready || ev.Port == 0 || ep.DPSize <= 0 {
			continue
		}
		host := ev.Host
		switch host {
		case "", "*", "0.0.0.0", "::", "[::]":
			host = ep.BootstrapHost
			if h, _, err := net.SplitHostPort(ep.Address); err == nil {
				host = h
			}
		}
		for r := range ep.DPSize {
			src := kvevents.Source{Endpoint: "tcp://" + net.JoinHostPort(trimBrackets(host), strconv.Itoa(ev.Port+r)), Topic: ev.Topic}
			if ev.ReplayPort > 0 {
				src.Replay = "tcp://" + net.JoinHostPort(trimBrackets(host), strconv.Itoa(ev.ReplayPort+r))
			}
			key := TargetKey{URL: ep.URL, Rank: r}
			out = append(out, kvevents.Target[TargetKey]{Key: key, Name: ep.URL + "#" + strconv.Itoa(r), Source: src})
		}
	}
	return out
}

// trimBrackets drops the brackets of an IPv6 literal.
func trimBrackets(host string) string {
	if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		return host[1 : len(host)-1]
	}
	return host
}

// applyView replaces the prefix index's estimate in cands with what the
// cache view says each target holds of req's blocks. A warming view (one
// that started mid-stream) may miss what the engine held before: the
// larger of view and estimate counts. Where the view holds every hashed
// block and an earlier turn's whole prompt ended there (the index's
// extended match), the turn's checksum counts beyond the hashed blocks, as
// without the view.
//
// IndexedTokens, what least_cost prices evictions against, is the smaller
// of what the view holds and what the estimate believes. An engine's LRU
// cache is always full of something, much of it stale; the estimate
// counts duet's recent routes, some of them evicted already. Either alone
// overstates the occupancy worth keeping, and each cost a scenario of the
// simulator: the view's alone made agentic sessions 1.4-1.5x slower (new
// sessions no longer spread over the ranks' caches), the estimate's alone
// lost the multi-tenant gain (docs/kv-events.md). Caller holds
// s.ledger.mu.
func (s *Scheduler) applyView(req *Request, cands []Candidate, matches []prefixMatch, perBlock float64) {
	n := len(req.Blocks)
	for i := range cands {
		c := &cands[i]
		key := c.Key()
		m, ok := s.cacheView.Match(key, req.Blocks)
		if !ok {
			continue
		}
		held := float64(m.GPU) + hostTierWeight*float64(m.Any-m.GPU)
		tokens := min(int64(held*perBlock), req.PromptTokens-1)
		prefix := float64(m.Any) / float64(n)
		indexed := int64(float64(m.Blocks) * perBlock)
		if m.Any == n && m.GPU == n {
			for _, pm := range matches {
				if pm.key == key && pm.extends {
					tokens = max(tokens, pm.tokens)
				}
			}
		}
		if m.Partial {
			tokens, prefix, indexed = max(tokens, c.CachedTokens), max(prefix, c.Prefix), max(indexed, c.IndexedTokens)
		}
		c.CachedTokens, c.Prefix, c.IndexedTokens = max(tokens, 0), prefix, min(indexed, c.IndexedTokens)
	}
}
