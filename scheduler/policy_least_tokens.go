package scheduler

import "context"

// policyLeastTokens is SMG's minimum-tokens DP scheduler
// (--dp-minimum-tokens-scheduler) applied to targets: the candidate with the
// fewest tokens wins, ties go to the earliest candidate.
//
// The policy itself is stateless. What makes consecutive picks spread is the
// scheduler: it reserves the request's estimated tokens on the chosen target
// under the pool lock before the next pick reads the loads, the way SMG's
// select_and_increment_lowest_dp_load adds the estimated cost to the cached
// load of the rank it returns.
type leastTokens struct{}

func newLeastTokens(PolicySpec) (Policy, error) { return leastTokens{}, nil }

// Name implements Policy.
func (leastTokens) Name() string { return policyLeastTokens }

// Pick implements Policy.
func (leastTokens) Pick(_ context.Context, _ *Request, cands []Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noEndpoints(policyLeastTokens)
	}
	return argminTokens(cands), nil
}
