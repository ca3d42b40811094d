package extproc

import (
	"math"
	"math/rand/v2"
)

// MintRoom returns a random bootstrap room in [0, 2^63-1] with
// room % prefillDPSize == prefillRank. SGLang prefill servers under the
// default follow_bootstrap_room balancing dispatch by room % dp_size (and
// reject a conflicting explicit rank), and decode servers fall back to the
// same rule, so the room itself carries the prefill rank to both legs. A
// negative prefillRank returns a uniformly random room.
func MintRoom(prefillRank, prefillDPSize int) uint64 {
	if prefillDPSize < 1 {
		prefillDPSize = 1
	}
	if prefillRank < 0 {
		return rand.Uint64N(math.MaxInt64 + 1) // any rank: the engine's room % dp decides
	}
	if prefillRank >= prefillDPSize {
		prefillRank = 0
	}
	dp := uint64(prefillDPSize)
	p := uint64(prefillRank)
	maxK := (math.MaxInt64 - p) / dp
	return rand.Uint64N(maxK+1)*dp + p
}
