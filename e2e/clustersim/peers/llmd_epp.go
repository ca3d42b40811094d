package peers

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/duet-router/duet/scheduler"
)

// llmdWeights are one llm-d scheduling profile's scorer weights.
type llmdWeights struct {
	prefix, queue, kv float64
}

// The profiles ported.
var (
	// llmdDefaultProfile is the profile the EPP runs when no configuration
	// is given (llm-d/llm-d-router@ebab68792 pkg/epp/config/loader/
	// defaults.go, loadDefaultConfig): queue-scorer 2,
	// kv-cache-utilization-scorer 2, prefix-cache-scorer 3, with the
	// max-score picker injected by ensureSchedulingLayer.
	llmdDefaultProfile = llmdWeights{prefix: 3, queue: 2, kv: 2}
	// llmdPDProfile is both the prefill and the decode profile of the
	// repository's P/D configuration (llm-d/llm-d-router@ebab68792
	// deploy/config/pd-epp-config.yaml and sim-pd-epp-config.yaml; the same
	// in llm-d/llm-d guides/pd-disaggregation/gaie-pd/values_sglang.yaml):
	// prefix-cache-scorer 2, queue-scorer 1, max-score picker, behind a
	// prefill-filter or decode-filter. The EPP has no built-in P/D default:
	// P/D needs a configuration, and this is the one the project ships.
	llmdPDProfile = llmdWeights{prefix: 2, queue: 1}
)

// llmdEPP is one llm-d EPP scheduling profile: every candidate gets the
// weighted sum of its scorers' scores, each clamped to [0, 1]
// (llm-d/llm-d-router@ebab68792 pkg/epp/scheduling/scheduler_profile.go,
// runScorerPlugins: "+= enforceScoreRange(score) * scorer.Weight()"), and
// the max-score picker takes the highest total, exact ties at random (it
// shuffles the candidates, then sorts them stably by score: pkg/epp/
// framework/plugins/scheduling/picker/maxscore/picker.go Pick,
// picker/common.go ShuffleScoredEndpoints).
//
// The scorers (pkg/epp/framework/plugins/scheduling/scorer/...):
//   - prefix-cache-scorer (prefix/plugin.go Score): with the default
//     matchLengthWeight 0, the match ratio, matched blocks / prompt blocks,
//     from the approx-prefix-cache-producer, which the EPP creates
//     automatically for the scorer (cmd/epp/runner/runner.go,
//     RegisterAsDefaultProducer): an LRU per endpoint of the token blocks
//     routed there.
//   - queue-scorer (queuedepth/queue.go Score): min-max normalized waiting
//     queue, (max - q)/(max - min) over the candidates, 1 for all when all
//     queues are equal. For SGLang the queue is sglang:num_queue_reqs.
//   - kv-cache-utilization-scorer (kvcacheutilization/kvcache_utilization.go
//     Score): 1 - KV-cache usage (sglang:token_usage for SGLang); default
//     profile only.
//
// Adapted to duet's signals:
//   - match ratio: Candidate.Prefix, the share of the prompt's 64-byte blocks
//     (first 1024) that duet's prefix index, an LRU of the blocks routed to
//     each target, holds. llm-d hashes token blocks of at least 64 tokens,
//     up to 131,072 tokens (16,384 in the P/D configuration), 31,250
//     blocks per endpoint.
//   - queue: Load.Waiting, the engine-reported waiting requests from duet's
//     last fresh scrape (0 when stale); llm-d scrapes every 50 ms by
//     default, duet every load.interval (1 s by default).
//   - KV usage: Load.Tokens / Load.Capacity clamped to [0, 1]: the engine's
//     reported tokens plus duet's reservations since, over the rank's KV
//     capacity (on a decode rank, KV in use and pending; on a prefill rank,
//     the prefill work in flight). An unknown capacity reads as usage 0, as
//     llm-d reads a missing metric as 0.
//   - endpoints: an llm-d endpoint is an ip:port. For vLLM, data-parallel
//     ranks are separate ports, hence endpoints, which is what duet's
//     rank-level candidates are. An SGLang DP engine serves all its ranks
//     on one port, so llm-d scores the engine and SGLang picks the rank
//     (llm-d-router issue #2293, open); the faithful comparison on SGLang
//     DP is this policy with the scheduler's EngineRanks.
//
// Left out: the prefix-based P/D decider (the P/D configuration lets a
// request skip the prefill stage when fewer than 16 of its tokens are
// uncached on the chosen decode endpoint; duet always disaggregates), flow
// control and the saturation detector (admission, not selection), and the
// role filters (duet's pools are already split).
type llmdEPP struct {
	w   llmdWeights
	rng *rand.Rand
}

func newLLMDEPP(role scheduler.Role) *llmdEPP {
	w := llmdPDProfile
	if role == roleAggregated {
		w = llmdDefaultProfile
	}
	return &llmdEPP{w: w, rng: newRand(nameLLMDEPP, role)}
}

// Name implements scheduler.Policy.
func (*llmdEPP) Name() string { return nameLLMDEPP }

// ReadsPrefix implements scheduler.PrefixReader.
func (*llmdEPP) ReadsPrefix() bool { return true }

// Pick implements scheduler.Policy.
func (p *llmdEPP) Pick(_ context.Context, _ *scheduler.Request, cands []scheduler.Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noCandidates(nameLLMDEPP)
	}
	minQ, maxQ := cands[0].Load.Waiting, cands[0].Load.Waiting
	for i := 1; i < len(cands); i++ {
		minQ = min(minQ, cands[i].Load.Waiting)
		maxQ = max(maxQ, cands[i].Load.Waiting)
	}
	best, bestScore, ties := 0, math.Inf(-1), 0
	for i := range cands {
		c := &cands[i]
		s := p.w.prefix*clamp01(c.Prefix) + p.w.queue*llmdQueueScore(c.Load.Waiting, minQ, maxQ)
		if p.w.kv > 0 {
			s += p.w.kv * clamp01(1-llmdKVUsage(&c.Load))
		}
		switch {
		case s > bestScore:
			best, bestScore, ties = i, s, 1
		case s == bestScore:
			ties++
			if tieBreak(p.rng, ties) {
				best = i
			}
		}
	}
	return best, nil
}

// llmdQueueScore is the queue-scorer's min-max normalization.
func llmdQueueScore(q, minQ, maxQ int) float64 {
	if maxQ == minQ {
		return 1
	}
	return float64(maxQ-q) / float64(maxQ-minQ)
}

// llmdKVUsage is the rank's KV-cache usage as the port reads it.
func llmdKVUsage(l *scheduler.Load) float64 {
	if l.Capacity <= 0 {
		return 0
	}
	return clamp01(float64(l.Tokens) / float64(l.Capacity))
}

// clamp01 clamps v to [0, 1] (llm-d's enforceScoreRange).
func clamp01(v float64) float64 {
	return min(max(v, 0), 1)
}
