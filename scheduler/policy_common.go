package scheduler

import "fmt"

// Helpers shared by the policies. The hashes are fixed functions (no
// per-process seed) so that every duet replica, and every restart, maps the
// same prefix to the same target.

// noEndpoints is the error a policy returns for an empty candidate list.
func noEndpoints(policy string) error {
	return fmt.Errorf("%s: %w", policy, ErrNoEndpoints)
}

// argminTokens returns the index of the candidate with the fewest tokens;
// ties go to the earliest. cands must not be empty.
func argminTokens(cands []Candidate) int {
	best, low := 0, cands[0].Load.Tokens
	for i := 1; i < len(cands); i++ {
		if t := cands[i].Load.Tokens; t < low {
			best, low = i, t
		}
	}
	return best
}

// policyGolden is 2^64 divided by the golden ratio, the splitmix64 step.
const policyGolden = 0x9e3779b97f4a7c15

// policyMix64 is the splitmix64 finalizer: a cheap bijective mixer with
// full avalanche.
func policyMix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// policyHashString is 64-bit FNV-1a over s, finished with policyMix64. It
// does not allocate.
func policyHashString(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return policyMix64(h)
}
