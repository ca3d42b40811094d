package peers

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/duet-router/duet/scheduler"
)

// dynamoBlockTokens is the KV block size Dynamo's router counts in. Dynamo
// takes it from the engine: its SGLang worker registers
// kv_cache_block_size = server_args.page_size (ai-dynamo/dynamo
// components/src/dynamo/sglang, register_llm / register_model), and
// Dynamo's SGLang launch examples pass --page-size 16.
const dynamoBlockTokens = 16

// Dynamo's KvRouterConfig defaults (ai-dynamo/dynamo
// lib/kv-router/src/scheduling/config.rs, impl Default for KvRouterConfig):
// overlap_score_credit 1.0, prefill_load_scale 1.0, router_temperature 0
// (argmin, no sampling), overlap_score_credit_decay 0 and
// decode_active_request_weight 0 (both terms off), host and disk tiers and
// the shared cache unused here.
const (
	dynamoOverlapCredit    = 1.0
	dynamoPrefillLoadScale = 1.0
)

// dynamoKV is Dynamo's KV router worker selection (ai-dynamo/dynamo
// lib/kv-router/src/scheduling/selector/default.rs, stored version
// 07a6c9ce: DefaultWorkerScorer::worker_logit and the zero-temperature
// branch of pick_default_worker; the load inputs from selector/mod.rs,
// WorkerSelectionInput::row). For each (worker, dp_rank):
//
//	raw_prefill_blocks      = (active_prefill_tokens + isl) / block_size
//	adjusted_prefill_blocks = max(raw_prefill_blocks - overlap_score_credit x overlap_blocks, 0)
//	decode_blocks           = active_decode_blocks + additional_active_blocks
//	cost                    = prefill_load_scale x adjusted_prefill_blocks + decode_blocks
//
// (docs/components/router/router-concepts.md, "Cost Calculation", states
// the same.) The lowest cost wins; exact ties go to a uniformly random one
// (reservoir sampling over the tied rows, fastrand in Dynamo).
// active_prefill_tokens is the router's own count of the uncached prompt
// tokens of requests it sent to the rank whose prefill has not completed
// (added at routing, released at the first token); active_decode_blocks the
// prompt KV blocks of its requests still running there (released when the
// request ends; output blocks only with --router-track-output-blocks, off by
// default).
//
// Per role, as Dynamo's frontend sets up a disaggregated deployment
// (docs/components/router/router-disaggregated-serving.md; the configs are
// derived the same way in lib/llm's prefill router set-up and in the
// mocker's derive_prefill_router_config / derive_decode_router_config):
//
//   - prefill: the prefill router runs with track_active_blocks = false, so
//     no decode blocks are tracked (the decode terms are the same for every
//     rank and drop out): cost = max((active_prefill_tokens + isl)/16 -
//     overlap_blocks, 0), the uncached prompt work queued on the rank plus
//     this request's.
//   - decode: overlap_score_credit = 0, assume_kv_reuse = false and
//     track_prefill_tokens = false: the prefill term is 0 and cost =
//     active_decode_blocks + this request's blocks, each request counting
//     floor(isl/16) blocks of its own (random hashes, no sharing).
//   - aggregated (NewAggregated): all defaults, both terms.
//
// Adapted to duet's signals:
//   - overlap_blocks: Dynamo reads an exact index fed by the engines' KV
//     events; the port reads duet's approximate prefix index as
//     floor(Candidate.CachedTokens / 16).
//   - isl is duet's token estimate, Request.PromptTokens (Dynamo tokenizes).
//   - active_prefill_tokens and active_decode_blocks are kept by the port
//     from its own picks, released when the scheduler reports the leg's end
//     (ObserveLeg). A prefill leg ends when its prefill is done, which is
//     Dynamo's release point on the prefill router. In aggregated mode the
//     leg ends with the whole request, so the port holds the prompt tokens
//     through decode where Dynamo releases them at the first token.
//   - aggregated mode assumes KV reuse in Dynamo (active blocks shared
//     between a rank's requests count once); the port counts each
//     request's blocks separately, as Dynamo's decode router does.
//
// Left out: the busy thresholds and the router queue (admission, not
// selection), conditional disaggregation, the AIC prefill-load model, tier
// credits (host, disk, shared cache), replica sync.
type dynamoKV struct {
	name          string
	overlapCredit float64
	trackPrefill  bool // router_track_prefill_tokens
	trackBlocks   bool // router_track_active_blocks
	rng           *rand.Rand

	activePrefill map[scheduler.TargetKey]int64 // uncached prompt tokens in prefill
	activeBlocks  map[scheduler.TargetKey]int64 // prompt blocks of running requests
	prefillHolds  holds[int64]
	blockHolds    holds[int64]
}

func newDynamoKV(role scheduler.Role) *dynamoKV {
	p := &dynamoKV{
		name:          nameDynamoKV,
		overlapCredit: dynamoOverlapCredit,
		trackPrefill:  true,
		trackBlocks:   true,
		rng:           newRand(nameDynamoKV, role),
		activePrefill: make(map[scheduler.TargetKey]int64),
		activeBlocks:  make(map[scheduler.TargetKey]int64),
		prefillHolds:  newHolds[int64](),
		blockHolds:    newHolds[int64](),
	}
	switch role {
	case scheduler.RolePrefill:
		p.trackBlocks = false
	case scheduler.RoleDecode:
		p.overlapCredit = 0
		p.trackPrefill = false
	}
	return p
}

// Name implements scheduler.Policy.
func (p *dynamoKV) Name() string { return p.name }

// ReadsPrefix implements scheduler.PrefixReader: the overlap credit reads
// CachedTokens; Dynamo's decode router is overlap-blind.
func (p *dynamoKV) ReadsPrefix() bool { return p.overlapCredit > 0 }

// Pick implements scheduler.Policy.
func (p *dynamoKV) Pick(_ context.Context, req *scheduler.Request, cands []scheduler.Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noCandidates(p.name)
	}
	isl := max(req.PromptTokens, 0)
	reqBlocks := isl / dynamoBlockTokens
	best, bestCost, ties := 0, math.Inf(1), 0
	for i := range cands {
		c := &cands[i]
		k := c.Key()
		var raw, decode float64
		if p.trackPrefill {
			raw = float64(p.activePrefill[k]+isl) / dynamoBlockTokens
		}
		if p.trackBlocks {
			decode = float64(p.activeBlocks[k] + reqBlocks)
		}
		cost := dynamoCost(raw, p.overlapCredit*float64(p.overlapBlocks(c)), decode)
		switch {
		case cost < bestCost:
			best, bestCost, ties = i, cost, 1
		case cost == bestCost:
			ties++
			if tieBreak(p.rng, ties) {
				best = i
			}
		}
	}
	c := &cands[best]
	k := c.Key()
	if p.trackPrefill {
		// effective_prefill_tokens: the prompt less the cached prefix.
		eff := max(isl-p.overlapBlocks(c)*dynamoBlockTokens, 0)
		p.activePrefill[k] += eff
		p.prefillHolds.add(req.ID, k, eff)
	}
	if p.trackBlocks {
		p.activeBlocks[k] += reqBlocks
		p.blockHolds.add(req.ID, k, reqBlocks)
	}
	return best, nil
}

// overlapBlocks is the rank's cached prefix in whole blocks, 0 when the
// router does not credit overlap.
func (p *dynamoKV) overlapBlocks(c *scheduler.Candidate) int64 {
	if p.overlapCredit == 0 {
		return 0
	}
	return max(c.CachedTokens, 0) / dynamoBlockTokens
}

// dynamoCost is Dynamo's default cost (worker_logit) from its terms in
// blocks: prefill_load_scale x max(raw_prefill - overlap_credit, 0) +
// decode.
func dynamoCost(rawPrefillBlocks, overlapCreditBlocks, decodeBlocks float64) float64 {
	return dynamoPrefillLoadScale*max(rawPrefillBlocks-overlapCreditBlocks, 0) + decodeBlocks
}

// ObserveLeg implements scheduler.LegObserver: the leg's end releases its
// prompt tokens and blocks.
func (p *dynamoKV) ObserveLeg(r scheduler.LegReport) {
	if v, ok := p.prefillHolds.take(r); ok {
		subtract(p.activePrefill, r.Target, v)
	}
	if v, ok := p.blockHolds.take(r); ok {
		subtract(p.activeBlocks, r.Target, v)
	}
}

// subtract takes v off m[k], saturating at zero.
func subtract(m map[scheduler.TargetKey]int64, k scheduler.TargetKey, v int64) {
	if n := m[k] - v; n > 0 {
		m[k] = n
	} else {
		delete(m, k)
	}
}
