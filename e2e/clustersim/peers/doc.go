// Package peers ports the routing rules of three peer routers (SMG, NVIDIA
// Dynamo's KV router and the llm-d EPP) to duet's scheduler.Policy, so that
// the routing-quality simulator (package e2e/clustersim, run by
// e2e/bench/simquality) can answer "why not SMG / Dynamo / llm-d?" with
// numbers: each peer's rule runs inside duet's real scheduler, on the same
// cluster, arrivals and prompts as duet's own policies.
//
// The ports are:
//
//   - smg_cache_aware: SMG's cache_aware policy with its CLI defaults, one
//     worker per DP rank (SMG --dp-aware), gated on router-side in-flight
//     request counts;
//   - smg_dp_min_tokens: SMG's PD mode with --dp-minimum-tokens-scheduler:
//     cache_aware picks the engine, MinimumTokensPolicy picks its rank from
//     a 10 s poll of the ranks' used tokens plus local increments;
//   - dynamo_kv: Dynamo's KV router cost (prefill blocks less overlap, plus
//     active decode blocks), lowest cost wins, with the per-role settings of
//     Dynamo's disaggregated mode;
//   - llmd_epp: the llm-d EPP's max-score picker over weighted scorers
//     (prefix-cache, queue and, in aggregated mode, KV-cache utilization).
//
// Each rule is re-expressed in Go from the peer's own source; every rule
// carries a comment naming the repository, file and function it comes from,
// and says where duet's signals differ from the peer's and how the port
// adapts. docs/benchmarks/peers.md gathers the same in prose.
//
// What a port cannot carry over is the peer's own view of the cluster: SMG's
// character radix tree, Dynamo's KV-event index and llm-d's token-block LRU
// are all replaced by duet's prefix index (Candidate.Prefix and
// Candidate.CachedTokens), and engine metrics come from duet's scrapes
// (Candidate.Load). Router-side state a peer keeps for itself (SMG's
// in-flight counts, Dynamo's active prefill tokens and decode blocks, SMG's
// per-rank token cache) is kept by the port itself, from its own picks and
// the scheduler's LegObserver reports.
//
// Where a peer breaks ties at random (SMG among cache holders, Dynamo among
// equal costs, llm-d's max-score picker), the port does too, from a
// generator seeded by the peer's name and role: runs stay reproducible.
package peers
