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
//	cost = wait + (1 + 2 × reuse) × compute
//	wait    = steps(max(Load.ReservedWork, Load.Scraped)) × step
//	compute = max(1, steps(uncached)) × step
//
// wait is how long the rank stays busy with work already sent to it: the
// prefill work duet has in flight there (its reservations less the
// prefixes it believed cached; they end with each leg's feedback) or the
// engine's reported pending tokens (which also count traffic duet did not
// send), whichever is larger. uncached is the prompt less the prefix duet believes the rank caches
// (Candidate.CachedTokens). steps(n) is ⌈n / chunk⌉ with the engine's
// chunked_prefill_size from /server_info (an engine that reports none is
// priced per token), and step is the engine's time per step, learned
// online from the prefill legs' feedback (see ObserveLeg and stepTime):
// the pool's estimate stands for every engine whose own (after 8 samples)
// is within 1.5× of it, and before the pool has any, every engine is
// priced alike.
//
// The reuse term prices what computing the request's uncached tokens costs
// later. They enter the rank's cache and evict as many tokens of other
// prefixes; and when the prompt's prefix is cached elsewhere, the copy left
// there no longer serves the conversation's next turn. Later requests
// recompute both as often as prompts are reused. reuse is that rate,
// learned from the workload: an average, over picks, of the best share of
// the prompt any candidate caches. Without it, a pick that avoids a short
// queue by moving a conversation to an idle rank looks free, and
// conversations scatter until no cache holds them (on the simulator's
// multi-turn workloads a weight of 1 × reuse lost 3-8 points of hit rate
// and 5-20 % of mean TTFT against 2 × reuse).
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
// Ties go to the candidate with fewer tokens, then to the earliest.
type leastCost struct {
	role Role
	// chunk remembers each engine's chunk size from its candidates, for
	// pricing the legs ObserveLeg reports (which name only the target).
	chunk map[string]int
	// speed is the learned step time per engine URL; pool is all engines'.
	speed map[string]*stepTime
	pool  *stepTime
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
	// taken as an engine's step time.
	costQuantile = 0.2
	// engineSamples and poolSamples are how many samples an engine's and
	// the pool's estimate keep.
	engineSamples = 32
	poolSamples   = 128
	// reuseAlpha is the weight of one pick in the learned reuse rate.
	reuseAlpha = 0.02
	// engineApart is how far an engine's estimate must be from the pool's
	// to be used instead of it: engines of one kind measure a little apart
	// by chance, and pricing that noise moved conversations between them
	// (multi-turn hit rate -3 points), while a different kind of engine is
	// apart by much more.
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
		chunk:     map[string]int{},
		speed:     map[string]*stepTime{},
		pool:      newStepTime(poolSamples),
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
		wait, compute := p.prefillSeconds(req, c)
		cost := wait + (1+2*p.reuse)*compute
		if best < 0 || cost < bestCost || cost == bestCost && c.Load.Tokens < cands[best].Load.Tokens {
			best, bestCost = i, cost
		}
	}
	return best
}

// prefillSeconds returns how long c stays busy before req's prefill could
// start there, and how long the prefill itself would take.
func (p *leastCost) prefillSeconds(req *Request, c *Candidate) (wait, compute float64) {
	chunk := int64(1)
	if c.Endpoint != nil && c.Endpoint.ChunkTokens > 0 {
		chunk = int64(c.Endpoint.ChunkTokens)
		p.chunk[c.Endpoint.URL] = c.Endpoint.ChunkTokens
	}
	step := p.stepSeconds(c)
	wait = float64(ceilDiv(max(c.Load.Scraped, c.Load.ReservedWork), chunk)) * step
	uncached := max(req.PromptTokens-c.CachedTokens, 1)
	return wait, float64(max(1, ceilDiv(uncached, chunk))) * step
}

// stepSeconds is the step time of c's engine: its own estimate, else the
// pool's, else 1 (every engine alike).
func (p *leastCost) stepSeconds(c *Candidate) float64 {
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

// ObserveLeg implements LegObserver. A prefill leg's service time,
// divided by the steps its work took, is a sample of its engine's step
// time; the service time runs from the pick, or from the end
// of the target's previous leg if that came later (the rank was busy until
// then). Failed legs teach nothing about speed.
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
	if r.Failed || service <= 0 {
		return
	}
	chunk := int64(max(p.chunk[r.Target.URL], 1))
	sample := service / float64(max(1, ceilDiv(r.Work, chunk)))
	s := p.speed[r.Target.URL]
	if s == nil {
		s = newStepTime(engineSamples)
		p.speed[r.Target.URL] = s
	}
	s.add(sample)
	p.pool.add(sample)
}

// stepTime estimates the seconds one prefill step (one chunk, or one token
// on an unchunked engine) takes, as a low quantile of the latest samples. A
// leg's service time can only be inflated, never shortened, by what it
// waits for besides compute (its KV transfer, a decode rank without room
// for it, a rank that idled), so the low quantile tracks the compute. An
// average did not: on the trace replay, decode waits made engines of one
// pool look up to several times slower than each other, and the policy
// piled work onto whichever looked fastest (mean TTFT 2x least_tokens').
type stepTime struct {
	ring []float64 // the latest samples, oldest overwritten first
	next int
	n    int // samples seen, up to len(ring)
	// scratch sorts a copy of ring.
	scratch []float64
}

// newStepTime returns an estimator over the latest size samples.
func newStepTime(size int) *stepTime { return &stepTime{ring: make([]float64, size)} }

// add records one sample.
func (s *stepTime) add(sample float64) {
	s.ring[s.next] = sample
	s.next = (s.next + 1) % len(s.ring)
	s.n = min(s.n+1, len(s.ring))
}

// estimate returns the costQuantile of the samples held; n must be > 0.
func (s *stepTime) estimate() float64 {
	s.scratch = append(s.scratch[:0], s.ring[:s.n]...)
	slices.Sort(s.scratch)
	return s.scratch[int(costQuantile*float64(s.n-1))]
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}
