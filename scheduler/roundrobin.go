package scheduler

import (
	"context"
	"fmt"
	"sync/atomic"
)

// roundRobin hands out the candidates in turn. With a stable candidate list
// every target gets the same number of picks, give or take one.
type roundRobin struct {
	next atomic.Uint64
}

func newRoundRobin() *roundRobin { return &roundRobin{} }

// Name implements Policy.
func (*roundRobin) Name() string { return policyRoundRobin }

// Pick implements Policy.
func (p *roundRobin) Pick(_ context.Context, _ *Request, cands []Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, fmt.Errorf("round_robin: %w", ErrNoEndpoints)
	}
	n := p.next.Add(1) - 1
	return int(n % uint64(len(cands))), nil
}
