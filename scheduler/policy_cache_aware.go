package scheduler

import (
	"context"
	"fmt"
	"math"
)

// cache_aware defaults, as SMG's CLI defaults except for the absolute
// imbalance bound, which is in tokens here (SMG counts requests, default 64).
const (
	defaultCacheThreshold   = 0.3
	defaultBalanceAbsTokens = 16384
	defaultBalanceRel       = 1.5
)

// cacheAware is SMG's cache_aware policy in its per-request form.
//
// Let min and max be the smallest and largest Load.Tokens over the
// candidates. If max-min > BalanceAbsTokens and max > BalanceRel*min (both
// must hold), the pool is imbalanced and the least-loaded candidate wins, as
// in least_tokens. Otherwise, if the best prefix match is at least
// CacheThreshold, the candidate with the highest Prefix wins (ties: fewer
// tokens, then the earliest); else the least-loaded one does.
//
// "Per-request form" means the policy keeps no state: SMG walks and inserts
// into its own radix tree inside the policy and gates on router-side
// in-flight request counts, while here the prefix match comes precomputed in
// Candidate.Prefix (duet's prefix index, which the scheduler updates with the
// chosen target) and the gate reads each target's tokens at the moment of
// the pick, reservations included. The gate is SMG's original pool-wide
// one, evaluated afresh for every request, not SMG's newer spill gate
// against the fleet mean.
type cacheAware struct {
	threshold float64
	absTokens int64
	rel       float64
}

func newCacheAware(spec PolicySpec) (Policy, error) {
	p := &cacheAware{
		threshold: defaultCacheThreshold,
		absTokens: defaultBalanceAbsTokens,
		rel:       defaultBalanceRel,
	}
	switch t := spec.CacheThreshold; {
	case t == 0:
	case math.IsNaN(t) || t < 0 || t > 1:
		return nil, fmt.Errorf("cache threshold %v: must be between 0 and 1", t)
	default:
		p.threshold = t
	}
	switch a := spec.BalanceAbsTokens; {
	case a == 0:
	case a < 0:
		return nil, fmt.Errorf("balance abs tokens %d: must not be negative", a)
	default:
		p.absTokens = a
	}
	switch r := spec.BalanceRel; {
	case r == 0:
	case math.IsNaN(r) || r < 1:
		return nil, fmt.Errorf("balance rel %v: must be at least 1", r)
	default:
		p.rel = r
	}
	return p, nil
}

// Name implements Policy.
func (*cacheAware) Name() string { return policyCacheAware }

// ReadsPrefix implements PrefixReader: cache_aware is the prefix index's
// main reader.
func (*cacheAware) ReadsPrefix() bool { return true }

// Pick implements Policy.
func (p *cacheAware) Pick(_ context.Context, _ *Request, cands []Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noEndpoints(policyCacheAware)
	}
	least, low, high := 0, cands[0].Load.Tokens, cands[0].Load.Tokens
	cached, best := 0, cands[0].Prefix
	for i := 1; i < len(cands); i++ {
		c := &cands[i]
		t := c.Load.Tokens
		if t < low {
			least, low = i, t
		} else if t > high {
			high = t
		}
		if c.Prefix > best || c.Prefix == best && t < cands[cached].Load.Tokens {
			cached, best = i, c.Prefix
		}
	}
	if high-low > p.absTokens && float64(high) > p.rel*float64(low) {
		return least, nil
	}
	if best >= p.threshold {
		return cached, nil
	}
	return least, nil
}
