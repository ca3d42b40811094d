package scheduler

import (
	"context"
	"math"
	"time"
)

// least_cost prices each candidate by what this request would cost there
// and picks the cheapest. It weighs a prefix hit against the queue it
// joins, where cache_aware follows a rule (a match threshold and a balance
// gate) that long prompts defeat.
//
// On the prefill role the price is in prompt tokens of prefill work:
//
//	cost = queued + 3 × uncached + 2 × reuse × uncached × evicted
//
// queued is the prefill work already sent to the rank: the larger of
// duet's own work in flight there (Load.ReservedWork: its reservations less
// the prefixes it believed cached; they end with each leg's feedback) and
// the engine's reported pending tokens less the cached part of duet's own
// reservations (SGLang counts a waiting prompt whole, cached prefix
// included; what remains also counts traffic duet did not send). uncached
// is the prompt less the prefix duet believes the rank caches
// (Candidate.CachedTokens): queued + uncached is the work the request waits
// for, its time to first token on a rank that computes tokens at a steady
// rate. uncached counts more than once because it is also work that
// requests arriving after this one wait for on that rank, and because with
// DP attention it costs more than its tokens: a rank computes at most a
// chunk per step (1024 tokens on the dsv3 profile), every step costs a
// fixed 30 ms besides its tokens, and the engine's other ranks step in
// lockstep with it, so a history recomputed on another rank stretches the
// steps of every request on that engine. Counted once, the policy moved
// conversations off their cache to save this request a few tokens of queue
// and lost the hits later (multi-turn mean TTFT 208 against 195 ms counted
// twice, hit rate 78.5 % against 80.2 %). Counted twice, it still moved
// 3-8 % of later turns on issue 28's real-path shape (multi-turn at 6
// conversations/s, 2 prefill and 2 decode engines of dp 2, seeds 1-5;
// simquality -crosscheck multiturn:6 -crosscheck-dp 2 -crosscheck-window
// 60s -crosscheck-seeds 5 -crosscheck-parts): those turns hit 51-57 % of
// their prompt against 78 %, took 234-327 ms against 185-203 ms, and the
// pool computed 5-7 % more prompt tokens than under SMG's cache_aware,
// whose conversations never move (351k against 327k on seed 2). Mean TTFT
// over the five seeds by weight: 2: 178.8 ms, 3: 172.7, 4: 174.0, 6: 172.1,
// 10 and above (no turn moves): 173.6. With the tie-break below, 3 gave
// 170.0 ms and 6 gave 167.6, but 6 kept conversations on ranks that a
// burst had loaded: the matrix's bursty scenario lost 3-6 % of mean TTFT on
// every seed and production_high 3 % (paired means); 3 lost neither.
//
// The last term prices what the pick costs later requests too. The uncached
// tokens enter the rank's cache; where the cache has no room left they
// evict as many tokens of other prefixes, which later requests recompute
// as often as prompts are reused. evicted is the share of the uncached
// tokens beyond that room (Load.Capacity less the tokens the prefix index
// believes the rank holds, Candidate.IndexedTokens; all of them when the
// capacity is unknown), and reuse is the reuse rate, learned from the
// workload: an average, over picks, of the best share of the prompt any
// candidate caches.
//
// Ties (mostly a new conversation between idle ranks that all hold its
// system prompt) go to the rank that was sent the least prefill work
// lately: the uncached tokens of the picks made there, decayed with a time
// constant of 30 s (recentWorkTau). Conversations stay on their rank, so
// the work a rank was sent lately is the work its conversations will bring
// back, and with DP attention two busy conversations on one engine stretch
// each other's steps. Then to the rank whose cache holds the least, so that
// new conversations spread over every rank's cache; the cache's size alone
// also counts conversations that ended minutes ago. On the multi-turn case
// above the recent work took the mean TTFT from 172.7 to 170.0 ms at weight
// 3 and from 172.1 to 167.6 ms at 6 (time constants of 3, 10, 30 and 120 s
// at 6: 171.4, 169.0, 167.6 and 167.9 ms); at weight 2 it changed little
// (178.4 ms): moving turns, not placing new ones, was most of the gap.
//
// The price stays in tokens, not seconds. Converting it with each engine's
// speed learned from its legs' durations (a low quantile of leg time per
// token, per engine, used when 1.5x, 2x or even 3x from the pool's) made
// every simulated scenario worse: on one kind of engine a leg's duration
// measures the queue and the lockstep steps it met, not the engine, and the
// policy moved work away from engines that only looked slow (the trace
// replayed 1.5x faster: p99 TTFT 60 s against 19 s in tokens). See
// docs/scheduling.md.
//
// On the decode role the price is in tokens too:
//
//	after = Load.Tokens + prompt + max_tokens
//	cost  = max(after, heaviest rank of the engine) + after + 4 × overflow
//
// With DP attention an engine's ranks step in lockstep, so every request on
// an engine generates at the pace of its heaviest rank: the first term is
// the request's own time per token, the second keeps the ranks balanced,
// and overflow (after beyond the rank's KV capacity) is what must drain
// before the engine can admit the request at all.
//
// A decode engine with a decode radix cache (SGLang's
// --disaggregation-decode-enable-radix-cache, Endpoint.DecodeCache) matches
// each request against the prompts and answers its rank served before and
// has the prefill send only the KV beyond the match. On such a target the
// price is lower by what the match saves:
//
//	cost -= decodeCacheWeight × cached
//
// cached (Candidate.CachedTokens) is the prefix duet believes the rank
// holds, an earlier turn's prompt and answer included: tokens whose KV is
// neither transferred nor allocated again. One token of it weighs as eight
// tokens of the rank's load (decodeCacheWeight), whose price counts twice:
// a conversation stays on its rank until that rank carries about four times
// its history more than another (beyond what a rank holds, the overflow
// term moves it first). On docs/benchmarks/decode-cache.md's agentic
// sessions and multi-turn chat, a weight of 1 kept 73-87 % of the decode
// hits a cache holding everything would get, 2 kept 84-94 %, 4 kept
// 96-98 % (multi-turn 88 %), 8 kept 99 % (multi-turn 94 %), for 1-3 % more
// time per output token. Without the cache on any engine, cached is 0 and
// the price is the load price above, bit for bit.
//
// Decode ties go to the candidate with fewer tokens, then to the earliest.
type leastCost struct {
	role Role
	// ignoreDecodeCache prices decode by load alone
	// (PolicySpec.IgnoreDecodeCache).
	ignoreDecodeCache bool
	// reuse is the learned share of prompt tokens that is reusable.
	reuse float64
	// recent is the prefill work sent to each target lately (decayed;
	// see recentWork), for ties.
	recent map[TargetKey]recentWork
	// engineMax is decode scratch: the heaviest rank's tokens per engine.
	engineMax map[*Endpoint]int64
}

// Constants of least_cost.
const (
	// ownWorkWeight counts the request's uncached work for itself, for the
	// requests that will queue behind it and for the lockstep steps it
	// stretches on its engine.
	ownWorkWeight = 3
	// recentWorkTau is the time constant of the recent prefill work that
	// breaks prefill ties.
	recentWorkTau = 30 * time.Second
	// reuseAlpha is the weight of one pick in the learned reuse rate.
	reuseAlpha = 0.02
	// reuseWeight scales the learned reuse rate into the price of the
	// prefixes a pick evicts.
	reuseWeight = 2
	// decodeOverflowWeight prices KV beyond a decode rank's capacity: it
	// must drain before the request is admitted.
	decodeOverflowWeight = 4
	// decodeCacheWeight is the decode price of one token a decode target's
	// radix cache holds, in tokens of the rank's load.
	decodeCacheWeight = 8
)

func newLeastCost(spec PolicySpec) (Policy, error) {
	return &leastCost{role: spec.Role, ignoreDecodeCache: spec.IgnoreDecodeCache, engineMax: map[*Endpoint]int64{}}, nil
}

// Name implements Policy.
func (*leastCost) Name() string { return policyLeastCost }

// ReadsPrefix implements PrefixReader: the prefill price reads the cached
// prefix; the decode price does not (decode receives the whole KV).
func (p *leastCost) ReadsPrefix() bool { return p.role != RoleDecode }

// ReadsDecodeCache implements DecodeCacheReader: the decode price reads the
// prefix a decode engine's own radix cache holds.
func (p *leastCost) ReadsDecodeCache() bool { return p.role == RoleDecode && !p.ignoreDecodeCache }

// Pick implements Policy.
func (p *leastCost) Pick(_ context.Context, req *Request, cands []Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noEndpoints(policyLeastCost)
	}
	if req == nil {
		req = &Request{}
	}
	if p.role == RoleDecode {
		return p.pickDecode(req, cands), nil
	}
	return p.pickPrefill(req, cands), nil
}

// pickPrefill returns the cheapest prefill candidate.
func (p *leastCost) pickPrefill(req *Request, cands []Candidate) int {
	var bestCached int64
	for i := range cands {
		bestCached = max(bestCached, cands[i].CachedTokens)
	}
	if req.PromptTokens > 0 {
		p.reuse += reuseAlpha * (float64(bestCached)/float64(req.PromptTokens) - p.reuse)
	}
	best, bestCost, bestRecent := -1, 0.0, 0.0
	for i := range cands {
		c := &cands[i]
		queued, own, evict := p.prefillCost(req, c)
		cost := queued + own + evict
		recent := p.recentWork(c.Key(), req.Now)
		if best < 0 || cost < bestCost || cost == bestCost &&
			(recent < bestRecent || recent == bestRecent && c.IndexedTokens < cands[best].IndexedTokens) {
			best, bestCost, bestRecent = i, cost, recent
		}
	}
	c := &cands[best]
	if p.recent == nil {
		p.recent = map[TargetKey]recentWork{}
	}
	p.recent[c.Key()] = recentWork{work: bestRecent + float64(max(req.PromptTokens-c.CachedTokens, 1)), at: req.Now}
	// Targets that left the pool (a Kubernetes rollout replaces every
	// endpoint) would stay in the map: once it holds many more than the
	// pool, forget those whose work has decayed below a token.
	if len(p.recent) > 2*len(cands)+64 {
		for k := range p.recent {
			if p.recentWork(k, req.Now) < 1 {
				delete(p.recent, k)
			}
		}
	}
	return best
}

// prefillCost is the prefill price of c for req in its three parts: the
// queued work, the request's own work (ownWorkWeight × uncached) and the
// price of what it evicts. The price is their sum.
func (p *leastCost) prefillCost(req *Request, c *Candidate) (queued, own, evict float64) {
	uncached := max(req.PromptTokens-c.CachedTokens, 1)
	compute := float64(uncached)
	return float64(queuedWork(c)), ownWorkWeight * compute, reuseWeight * p.reuse * compute * evictedShare(uncached, c)
}

// Names of least_cost's cost parts (CostTerm.Name).
const (
	// CostQueued is the prefill work already sent to the rank.
	CostQueued = "queued"
	// CostOwnWork is the request's own uncached prefill work, weighted.
	CostOwnWork = "own_work"
	// CostEviction prices the cached prefixes the request's new blocks
	// would evict.
	CostEviction = "eviction"
	// CostPace is the decode rank's tokens after the request, or its
	// engine's heaviest rank's when that is more: the pace of the
	// engine's lockstep steps.
	CostPace = "pace"
	// CostBalance is the decode rank's tokens after the request again,
	// which keeps an engine's ranks balanced.
	CostBalance = "balance"
	// CostOverflow prices the tokens beyond the decode rank's KV capacity.
	CostOverflow = "overflow"
	// CostDecodeCache is what the decode engine's radix cache saves
	// (negative: it lowers the price).
	CostDecodeCache = "decode_cache"
)

// ExplainCost implements CostExplainer: the parts of the price Pick gave
// cands[i], the prefill role's (CostQueued, CostOwnWork, CostEviction) or
// the decode role's (CostPace, CostBalance, CostOverflow,
// CostDecodeCache). Pick has already learned the reuse rate from req, as it
// priced the candidates with it.
func (p *leastCost) ExplainCost(req *Request, cands []Candidate, i int) []CostTerm {
	if i < 0 || i >= len(cands) {
		return nil
	}
	if req == nil {
		req = &Request{}
	}
	c := &cands[i]
	if p.role == RoleDecode {
		p.heaviestRanks(cands)
		pace, balance, overflow, cache := p.decodeCost(c, decodeNeed(req))
		return []CostTerm{
			{CostPace, float64(pace)}, {CostBalance, float64(balance)},
			{CostOverflow, float64(overflow)}, {CostDecodeCache, float64(cache)},
		}
	}
	queued, own, evict := p.prefillCost(req, c)
	return []CostTerm{{CostQueued, queued}, {CostOwnWork, own}, {CostEviction, evict}}
}

// recentWork is the prefill work (uncached prompt tokens) picks sent to a
// target, decayed exponentially with recentWorkTau, as of at.
type recentWork struct {
	work float64
	at   time.Time
}

// recentWork returns the work sent to k lately, decayed to now.
func (p *leastCost) recentWork(k TargetKey, now time.Time) float64 {
	r, ok := p.recent[k]
	if !ok {
		return 0
	}
	if dt := now.Sub(r.at); dt > 0 {
		return r.work * math.Exp(-float64(dt)/float64(recentWorkTau))
	}
	return r.work
}

// queuedWork is the prefill work already sent to c, in tokens: duet's own
// work in flight there, or what the engine reports pending less the cached
// part of duet's reservations (which the engine counts while they wait),
// whichever is larger.
func queuedWork(c *Candidate) int64 {
	cachedOwn := c.Load.Reserved - c.Load.ReservedWork
	return max(c.Load.ReservedWork, c.Load.Scraped-cachedOwn)
}

// evictedShare is the part of uncached (the tokens a pick would add to
// c's cache, at least 1) that would push other prefixes out: those beyond the room
// between what duet's index believes the cache holds and the rank's KV
// capacity. Without a known capacity every token is priced as evicting.
func evictedShare(uncached int64, c *Candidate) float64 {
	if c.Load.Capacity <= 0 {
		return 1
	}
	evicted := max(0, c.IndexedTokens+uncached-c.Load.Capacity)
	return float64(min(evicted, uncached)) / float64(uncached)
}

// pickDecode returns the candidate with the lowest decode price.
func (p *leastCost) pickDecode(req *Request, cands []Candidate) int {
	p.heaviestRanks(cands)
	need := decodeNeed(req)
	best := -1
	var bestCost int64
	for i := range cands {
		c := &cands[i]
		pace, balance, overflow, cache := p.decodeCost(c, need)
		cost := pace + balance + overflow + cache
		if best < 0 || cost < bestCost || cost == bestCost && c.Load.Tokens < cands[best].Load.Tokens {
			best, bestCost = i, cost
		}
	}
	return best
}

// heaviestRanks sets engineMax to each engine's heaviest rank's tokens
// among cands.
func (p *leastCost) heaviestRanks(cands []Candidate) {
	clear(p.engineMax)
	for i := range cands {
		c := &cands[i]
		if c.Load.Tokens > p.engineMax[c.Endpoint] {
			p.engineMax[c.Endpoint] = c.Load.Tokens
		}
	}
}

// decodeNeed is the tokens req adds to a decode rank: its prompt and its
// requested output, per item.
func decodeNeed(req *Request) int64 {
	return req.PromptTokens + int64(max(req.Items, 1))*int64(max(req.MaxTokens, 0))
}

// decodeCost is the decode price of c for a request that adds need tokens,
// in its parts (heaviestRanks has run over the candidates): the engine's
// pace, the rank's balance, the overflow beyond its KV capacity and the
// saving of the engine's decode radix cache (0 or negative). The price is
// their sum.
func (p *leastCost) decodeCost(c *Candidate, need int64) (pace, balance, overflow, cache int64) {
	after := c.Load.Tokens + need
	pace, balance = max(after, p.engineMax[c.Endpoint]), after
	if c.Load.Capacity > 0 && after > c.Load.Capacity {
		overflow = decodeOverflowWeight * (after - c.Load.Capacity)
	}
	if c.Endpoint.DecodeCache.Radix && !p.ignoreDecodeCache {
		cache = -decodeCacheWeight * c.CachedTokens
	}
	return pace, balance, overflow, cache
}
