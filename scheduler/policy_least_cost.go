package scheduler

import (
	"context"
	"slices"
	"time"
)

// least_cost prices each candidate by what this request would cost there
// and picks the cheapest. It weighs a prefix hit against the queue it
// joins, where cache_aware follows a rule (a match threshold and a balance
// gate) that long prompts defeat.
//
// On the prefill role the price is in seconds:
//
//	cost    = wait + compute + 2 × reuse × compute × evicted
//	wait    = queued × t
//	compute = uncached × t
//
// queued is the prefill work already sent to the rank: the larger of
// duet's own work in flight there (Load.ReservedWork: its reservations less
// the prefixes it believed cached; they end with each leg's feedback) and
// the engine's reported pending tokens less the cached part of duet's own
// reservations (SGLang counts a waiting prompt whole, cached prefix
// included; what remains also counts traffic duet did not send). uncached
// is the prompt less the prefix duet believes the rank caches
// (Candidate.CachedTokens). t is the engine's time per prefill token,
// learned online from the prefill legs' feedback (see ObserveLeg and
// speedEstimate): the pool's estimate stands for every engine whose own is
// within 1.5× of it, and before the pool has any, every engine is priced
// alike. With one kind of engine t scales every price alike and the choice
// is made in tokens; it decides between engines of different speeds.
//
// The third term prices what the pick costs later requests. The uncached
// tokens enter the rank's cache; where the cache has no room left they
// evict as many tokens of other prefixes, which later requests recompute
// as often as prompts are reused. evicted is the share of the uncached
// tokens beyond that room (Load.Capacity less the tokens the prefix index
// believes the rank holds, Candidate.IndexedTokens; all of them when the
// capacity is unknown), and reuse is the reuse rate, learned from the
// workload: an average, over picks, of the best share of the prompt any
// candidate caches. Ties go to the rank whose cache holds the least, so
// that new conversations spread over every rank's cache.
//
// Why these terms (the simulator's production-shaped scenario, 4x8 + 4x8
// ranks, 2.9 requests/s; docs/scheduling.md): pricing eviction only where
// the cache is full, rather than every uncached token, and spreading ties
// by cache room took the prefix hit rate from 17 % to 33 % and mean TTFT
// from 2.9 s to 2.4 s; per-engine speeds learned from every leg, small ones
// included, priced noise (a small leg's time is mostly fixed overhead) and
// cost multi-turn traffic half its speed, hence the minimum leg size and
// the 1.5x margin.
//
// On the decode role the price is in tokens, the unit of decode cost:
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
// Decode ties go to the candidate with fewer tokens, then to the earliest.
type leastCost struct {
	role Role
	// speed is the learned time per prefill token per engine URL; pool is
	// all engines'.
	speed map[string]*speedEstimate
	pool  *speedEstimate
	// lastEnd is when each target's previous prefill leg ended: a leg's
	// service time runs from its pick or that end, whichever is later.
	lastEnd map[TargetKey]time.Time
	// reuse is the learned share of prompt tokens that is reusable.
	reuse float64
	// engineMax is decode scratch: the heaviest rank's tokens per engine.
	engineMax map[*Endpoint]int64
}

// Learning constants of least_cost.
const (
	// costQuantile is the quantile of the latest service-time samples
	// taken as an engine's time per token.
	costQuantile = 0.2
	// engineSamples and poolSamples are how many samples an engine's and
	// the pool's estimate keep.
	engineSamples = 32
	poolSamples   = 128
	// minSampleWork is the least prefill work (uncached tokens) a leg must
	// carry to be a speed sample: a smaller leg's time is mostly fixed
	// overhead (the step's base cost, the KV transfer, the response), and
	// pricing it as speed made engines of one kind look apart.
	minSampleWork = 2048
	// reuseAlpha is the weight of one pick in the learned reuse rate.
	reuseAlpha = 0.02
	// reuseWeight scales the learned reuse rate into the price of the
	// prefixes a pick evicts.
	reuseWeight = 2
	// engineApart is how far an engine's estimate must be from the pool's
	// to be used instead of it: engines of one kind measure a little apart
	// by chance, and pricing that noise moves conversations between them,
	// while a different kind of engine is apart by much more.
	engineApart = 1.5
	// costWarmSamples is how many samples an engine's estimate takes
	// before it replaces the pool's.
	costWarmSamples = 8
	// decodeOverflowWeight prices KV beyond a decode rank's capacity: it
	// must drain before the request is admitted.
	decodeOverflowWeight = 4
)

func newLeastCost(spec PolicySpec) (Policy, error) {
	return &leastCost{
		role:      spec.Role,
		speed:     map[string]*speedEstimate{},
		pool:      newSpeedEstimate(poolSamples),
		lastEnd:   map[TargetKey]time.Time{},
		engineMax: map[*Endpoint]int64{},
	}, nil
}

// Name implements Policy.
func (*leastCost) Name() string { return policyLeastCost }

// ReadsPrefix implements PrefixReader: the prefill price reads the cached
// prefix; the decode price does not (decode receives the whole KV).
func (p *leastCost) ReadsPrefix() bool { return p.role != RoleDecode }

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
	best, bestCost := -1, 0.0
	for i := range cands {
		c := &cands[i]
		t := p.tokenSeconds(c)
		uncached := max(req.PromptTokens-c.CachedTokens, 1)
		wait, compute := float64(queuedWork(c))*t, float64(uncached)*t
		cost := wait + compute + reuseWeight*p.reuse*compute*evictedShare(uncached, c)
		if best < 0 || cost < bestCost || cost == bestCost && c.IndexedTokens < cands[best].IndexedTokens {
			best, bestCost = i, cost
		}
	}
	return best
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
// c's cache) that would push other prefixes out: those beyond the room
// between what duet's index believes the cache holds and the rank's KV
// capacity. Without a known capacity every token is priced as evicting.
func evictedShare(uncached int64, c *Candidate) float64 {
	if c.Load.Capacity <= 0 {
		return 1
	}
	evicted := max(0, c.IndexedTokens+uncached-c.Load.Capacity)
	return float64(min(evicted, uncached)) / float64(uncached)
}

// tokenSeconds is the time per prefill token of c's engine: its own
// estimate where it differs enough from the pool's, else the pool's, else 1
// (every engine alike).
func (p *leastCost) tokenSeconds(c *Candidate) float64 {
	if p.pool.n == 0 {
		return 1
	}
	pool := p.pool.estimate()
	if c.Endpoint != nil {
		if s := p.speed[c.Endpoint.URL]; s != nil && s.n >= costWarmSamples {
			if own := s.estimate(); own > pool*engineApart || own < pool/engineApart {
				return own
			}
		}
	}
	return pool
}

// pickDecode returns the candidate with the lowest decode price.
func (p *leastCost) pickDecode(req *Request, cands []Candidate) int {
	clear(p.engineMax)
	for i := range cands {
		c := &cands[i]
		if c.Load.Tokens > p.engineMax[c.Endpoint] {
			p.engineMax[c.Endpoint] = c.Load.Tokens
		}
	}
	need := req.PromptTokens + int64(max(req.Items, 1))*int64(max(req.MaxTokens, 0))
	best := -1
	var bestCost int64
	for i := range cands {
		c := &cands[i]
		after := c.Load.Tokens + need
		cost := max(after, p.engineMax[c.Endpoint]) + after
		if c.Load.Capacity > 0 && after > c.Load.Capacity {
			cost += decodeOverflowWeight * (after - c.Load.Capacity)
		}
		if best < 0 || cost < bestCost || cost == bestCost && c.Load.Tokens < cands[best].Load.Tokens {
			best, bestCost = i, cost
		}
	}
	return best
}

// ObserveLeg implements LegObserver. A prefill leg's service time, divided
// by its work (the uncached tokens), is a sample of its engine's time per
// token; the service time runs from the pick, or from the end of the
// target's previous leg if that came later (the rank was busy until then).
// Failed legs and legs of less than minSampleWork teach nothing about
// speed.
func (p *leastCost) ObserveLeg(r LegReport) {
	if p.role == RoleDecode || r.Role != RolePrefill {
		return
	}
	start := r.Picked
	if prev := p.lastEnd[r.Target]; prev.After(start) {
		start = prev
	}
	p.lastEnd[r.Target] = r.Ended
	service := r.Ended.Sub(start).Seconds()
	if r.Failed || service <= 0 || r.Work < minSampleWork {
		return
	}
	sample := service / float64(r.Work)
	s := p.speed[r.Target.URL]
	if s == nil {
		s = newSpeedEstimate(engineSamples)
		p.speed[r.Target.URL] = s
	}
	s.add(sample)
	p.pool.add(sample)
}

// speedEstimate estimates the seconds one prefill token takes, as a low
// quantile of the latest samples. A leg's service time can only be
// inflated, never shortened, by what it waits for besides compute (its KV
// transfer, a decode rank without room for it, a rank that idled), so the
// low quantile tracks the compute. An average did not: on the trace replay,
// decode waits made engines of one pool look up to several times slower
// than each other, and the policy piled work onto whichever looked fastest
// (mean TTFT 2x least_tokens').
type speedEstimate struct {
	ring []float64 // the latest samples, oldest overwritten first
	next int
	n    int // samples seen, up to len(ring)
	// scratch sorts a copy of ring.
	scratch []float64
}

// newSpeedEstimate returns an estimator over the latest size samples.
func newSpeedEstimate(size int) *speedEstimate { return &speedEstimate{ring: make([]float64, size)} }

// add records one sample.
func (s *speedEstimate) add(sample float64) {
	s.ring[s.next] = sample
	s.next = (s.next + 1) % len(s.ring)
	s.n = min(s.n+1, len(s.ring))
}

// estimate returns the costQuantile of the samples held; n must be > 0.
func (s *speedEstimate) estimate() float64 {
	s.scratch = append(s.scratch[:0], s.ring[:s.n]...)
	slices.Sort(s.scratch)
	return s.scratch[int(costQuantile*float64(s.n-1))]
}
