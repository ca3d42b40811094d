package scheduler

import (
	"context"
	"math/rand/v2"
	"sync"
)

// policySeedStream is the PCG stream (increment) used with a spec's seed.
const policySeedStream = 0xda3e39cb94b95bdb

// lockedRand is a seeded PCG generator safe for concurrent use.
type lockedRand struct {
	mu  sync.Mutex
	rng *rand.Rand
}

// newLockedRand seeds a generator with seed, or with a random seed when seed
// is 0.
func newLockedRand(seed uint64) *lockedRand {
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &lockedRand{rng: rand.New(rand.NewPCG(seed, policySeedStream))}
}

// intN returns a uniform integer in [0, n); n must be positive.
func (r *lockedRand) intN(n int) int {
	r.mu.Lock()
	v := r.rng.IntN(n)
	r.mu.Unlock()
	return v
}

// pair returns two distinct uniform integers in [0, n), the smaller first;
// n must be at least 2.
func (r *lockedRand) pair(n int) (int, int) {
	r.mu.Lock()
	i := r.rng.IntN(n)
	j := r.rng.IntN(n - 1)
	r.mu.Unlock()
	if j >= i {
		j++
	} else {
		i, j = j, i
	}
	return i, j
}

// randomPolicy picks a candidate uniformly at random, ignoring loads.
// PolicySpec.Seed makes the sequence reproducible (0: a random seed).
type randomPolicy struct {
	rng *lockedRand
}

func newRandom(spec PolicySpec) (Policy, error) {
	return &randomPolicy{rng: newLockedRand(spec.Seed)}, nil
}

// Name implements Policy.
func (*randomPolicy) Name() string { return policyRandom }

// Pick implements Policy.
func (p *randomPolicy) Pick(_ context.Context, _ *Request, cands []Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noEndpoints(policyRandom)
	}
	if len(cands) == 1 {
		return 0, nil
	}
	return p.rng.intN(len(cands)), nil
}
