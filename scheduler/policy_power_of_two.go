package scheduler

import "context"

// powerOfTwo is the power-of-two-choices policy: it samples two distinct
// candidates uniformly at random and picks the one with fewer tokens (on a
// tie, the earlier candidate). With a single candidate it picks that one.
// PolicySpec.Seed makes the sampling reproducible (0: a random seed).
//
// Unlike SMG's power_of_two, which compares the mean token_usage of whole
// engines, the comparison is per target and uses duet's load (last scrape
// plus duet's reservations), so the sample is never judged on numbers that
// are a whole monitor interval old.
type powerOfTwo struct {
	rng *lockedRand
}

func newPowerOfTwo(spec PolicySpec) (Policy, error) {
	return &powerOfTwo{rng: newLockedRand(spec.Seed)}, nil
}

// Name implements Policy.
func (*powerOfTwo) Name() string { return policyPowerOfTwo }

// Pick implements Policy.
func (p *powerOfTwo) Pick(_ context.Context, _ *Request, cands []Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noEndpoints(policyPowerOfTwo)
	}
	if len(cands) == 1 {
		return 0, nil
	}
	i, j := p.rng.pair(len(cands)) // i < j
	if cands[j].Load.Tokens < cands[i].Load.Tokens {
		return j, nil
	}
	return i, nil
}
