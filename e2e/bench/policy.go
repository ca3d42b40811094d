package bench

import (
	"fmt"
	"strings"
)

// Policy is one routing configuration under test.
type Policy struct {
	// Name labels the policy in reports.
	Name string
	// EngineRanks leaves DP ranks to the engines (duet's engine_ranks):
	// prefill ranks follow a random bootstrap room (room % dp), decode
	// ranks are the engine's round robin.
	EngineRanks bool
	// Prefill and Decode are duet's policy sections (YAML flow form).
	Prefill, Decode string
}

// PolicyEngineDefault is the baseline: duet picks engines round robin and
// SGLang's own dispatch picks the ranks.
const PolicyEngineDefault = "engine_default"

// Policies returns the policies compared, baseline first.
func Policies() []Policy {
	out := []Policy{{Name: PolicyEngineDefault, EngineRanks: true, Prefill: "round_robin", Decode: "round_robin"}}
	for _, name := range []string{"round_robin", "least_tokens", "cache_aware", "weighted", "least_cost"} {
		out = append(out, Policy{Name: name, Prefill: name, Decode: name})
	}
	return out
}

// SelectPolicies returns the named policies from Policies, in that order;
// an empty list selects every policy. A name of the form PREFILL/DECODE
// (e.g. round_robin/least_tokens) runs one duet policy per role.
func SelectPolicies(names []string) ([]Policy, error) {
	all := Policies()
	if len(names) == 0 {
		return all, nil
	}
	var out []Policy
	for _, n := range names {
		if prefill, decode, ok := strings.Cut(n, "/"); ok && prefill != "" && decode != "" {
			out = append(out, Policy{Name: n, Prefill: prefill, Decode: decode})
			continue
		}
		found := false
		for _, p := range all {
			if p.Name == n {
				out = append(out, p)
				found = true
			}
		}
		if !found {
			var known []string
			for _, p := range all {
				known = append(known, p.Name)
			}
			return nil, fmt.Errorf("unknown policy %q (want %s)", n, strings.Join(known, ", "))
		}
	}
	return out, nil
}
