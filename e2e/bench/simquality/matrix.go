package main

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/e2e/clustersim"
	"github.com/duet-router/duet/e2e/clustersim/peers"
	"github.com/duet-router/duet/e2e/sim"
	"github.com/duet-router/duet/scheduler"
)

// dsv3 and dense are the engine profiles the scenarios use.
const (
	dsv3  = "dsv3-dp8-h100-node"
	dense = "dense-8b-h100"
)

// routing is one way of routing under comparison.
type routing struct {
	name   string
	policy bench.Policy
	oracle clustersim.Oracle
	// scheduler adjusts the scheduler's configuration (nil: defaults).
	scheduler func(*scheduler.Config)
	// replicas and feedbackAny run several duet replicas that share
	// nothing (clustersim.Config.Replicas and FeedbackAny); share makes
	// them share their picks and feedback (clustersim.Config.Share).
	replicas    int
	feedbackAny bool
	share       bool
	// cache and eventDelay are what the scheduler knows of the engines'
	// caches (clustersim.Config.Cache and EventDelay).
	cache      clustersim.CacheMode
	eventDelay time.Duration
}

// cacheSuffix is the routing name suffix that sets what the scheduler
// knows of the engines' caches: +tokens (token ids, as with a tokenizer),
// +events (and the engines' KV events, delivered at once), +events50 or
// +events200 (after 50 or 200 ms), +oracleview (the engine model's true
// caches).
var cacheSuffix = regexp.MustCompile(`\+(tokens|events|oracleview)([0-9]*)$`)

// replicaSuffix is the routing name suffix that runs N replicas, feedback
// to the replica that routed the request (+r4) or to any replica (+r4any),
// or N replicas that share their state (+s4: where feedback lands makes no
// difference then).
var replicaSuffix = regexp.MustCompile(`\+([rs])([1-9][0-9]?)(any)?$`)

// Routing name suffixes that change one scheduler setting, for
// experiments (e.g. -routings engine_default,least_tokens+covered).
var variants = map[string]func(*scheduler.Config){
	"+inflight":  func(c *scheduler.Config) { c.Load.PrefillCovered = false },
	"+covered":   func(c *scheduler.Config) { c.Load.PrefillCovered = true },
	"+fullindex": func(c *scheduler.Config) { c.Prefix.IgnoreCapacity = true },
}

// Routing names beyond bench.Policies.
const (
	// routingDefault is what duet ships (scheduler.DefaultPrefillPolicy
	// and DefaultDecodePolicy): least_cost on both roles.
	routingDefault = "duet_default"
	// routingLeastCost is the least_cost policy on both roles (the
	// default, under its policy's name).
	routingLeastCost = "least_cost"
	// routingPrevious is the default before least_cost: cache_aware
	// prefill, least_tokens decode.
	routingPrevious = "cache_aware/least_tokens"
	// routingDecodeByLoad is least_cost as it was before it read decode
	// radix caches: the decode price by load alone
	// (ignore_decode_cache).
	routingDecodeByLoad = "least_cost_decode_by_load"
)

// defaultPolicy and leastCostPolicy are routingDefault's and
// routingLeastCost's policies; defaultPolicy follows the scheduler's
// defaults.
var (
	defaultPolicy   = bench.Policy{Name: routingDefault, Prefill: scheduler.DefaultPrefillPolicy, Decode: scheduler.DefaultDecodePolicy}
	leastCostPolicy = bench.Policy{Name: routingLeastCost, Prefill: "least_cost", Decode: "least_cost"}
)

// routings returns the named routings, in that order.
func routings(names []string) ([]routing, error) {
	var out []routing
	for _, full := range names {
		n := full
		replicas, anyReplica, share := 0, false, false
		if m := replicaSuffix.FindStringSubmatch(n); m != nil {
			replicas, _ = strconv.Atoi(m[2])
			anyReplica, share = m[3] != "", m[1] == "s"
			n = strings.TrimSuffix(n, m[0])
		}
		cache, delay := clustersim.CacheEstimate, time.Duration(0)
		if m := cacheSuffix.FindStringSubmatch(n); m != nil {
			switch m[1] {
			case "tokens":
				cache = clustersim.CacheTokens
			case "events":
				cache = clustersim.CacheEvents
			case "oracleview":
				cache = clustersim.CacheOracle
			}
			if m[2] != "" {
				ms, _ := strconv.Atoi(m[2])
				delay = time.Duration(ms) * time.Millisecond
			}
			n = strings.TrimSuffix(n, m[0])
		}
		var adjust func(*scheduler.Config)
		for suffix, f := range variants {
			if base, ok := strings.CutSuffix(n, suffix); ok {
				n, adjust = base, f
			}
		}
		rt, err := routingNamed(n)
		if err != nil {
			return nil, err
		}
		rt.name, rt.replicas, rt.feedbackAny, rt.share = full, replicas, anyReplica, share
		rt.cache, rt.eventDelay = cache, delay
		if own := rt.scheduler; adjust != nil {
			rt.scheduler = func(c *scheduler.Config) {
				if own != nil {
					own(c)
				}
				adjust(c)
			}
		}
		out = append(out, rt)
	}
	return out, nil
}

// routingNamed returns the routing called n.
func routingNamed(n string) (routing, error) {
	switch n {
	case clustersim.OracleLoad.String():
		return routing{name: n, oracle: clustersim.OracleLoad}, nil
	case routingDefault:
		return routing{name: n, policy: defaultPolicy}, nil
	case routingLeastCost:
		return routing{name: n, policy: leastCostPolicy}, nil
	case routingDecodeByLoad:
		return routing{name: n, policy: bench.Policy{Name: n, Prefill: "least_cost", Decode: "{name: least_cost, ignore_decode_cache: true}"}}, nil
	}
	if slices.Contains(peers.Names(), n) {
		return peerRouting(n), nil
	}
	if pre, dec, ok := strings.Cut(n, "/"); ok && (slices.Contains(peers.Names(), pre) || slices.Contains(peers.Names(), dec)) {
		return mixedRouting(n, pre, dec), nil
	}

	ps, err := bench.SelectPolicies([]string{n})
	if err != nil {
		return routing{}, err
	}
	return routing{name: n, policy: ps[0]}, nil
}

// peerRouting runs the named peer's ported policy (package peers) on both
// roles. The bench policy names only say what the scheduler would build
// otherwise; the peer's instances replace them. Every peer chooses
// (engine, rank) pairs: SMG's DP-aware mode and Dynamo do, and llm-d does
// where each DP rank is its own ip:port (vLLM). On SGLang DP llm-d scores
// whole engines and SGLang picks the rank (llm-d-router issue #2293); that
// form (EngineRanks) is not in the matrix. A quick run of it (2 seeds,
// 6-minute windows) was ahead of the rank-level form on production (4705
// ms) and multiturn (410 ms), and still well behind duet's default.
func peerRouting(name string) routing {
	return routing{
		name:   name,
		policy: bench.Policy{Name: name, Prefill: "round_robin", Decode: "round_robin"},
		scheduler: func(c *scheduler.Config) {
			p, d, err := peers.NewPair(name)
			if err != nil {
				panic(err) // name is one of peers.Names()
			}
			c.PrefillPolicyInstance, c.DecodePolicyInstance = p, d
		},
	}
}

// mixedRouting runs a peer's ported rule on one role and a duet policy
// (or another peer) on the other, e.g. smg_cache_aware/least_cost: it
// tells which role's choice makes a difference. A peer on one role only is
// built by peers.New, so that SMG's prefill count ends with the prefill
// leg rather than with the request's decode leg.
func mixedRouting(name, prefill, decode string) routing {
	return routing{
		name:   name,
		policy: bench.Policy{Name: name, Prefill: duetOr(prefill), Decode: duetOr(decode)},
		scheduler: func(c *scheduler.Config) {
			if slices.Contains(peers.Names(), prefill) {
				p, err := peers.New(prefill, scheduler.RolePrefill)
				if err != nil {
					panic(err) // a peer's name
				}
				c.PrefillPolicyInstance = p
			}
			if slices.Contains(peers.Names(), decode) {
				d, err := peers.New(decode, scheduler.RoleDecode)
				if err != nil {
					panic(err) // a peer's name
				}
				c.DecodePolicyInstance = d
			}
		},
	}
}

// duetOr is name where it is a duet policy, else round_robin (the
// scheduler's placeholder for a peer's instance).
func duetOr(name string) string {
	if slices.Contains(peers.Names(), name) {
		return "round_robin"
	}
	return name
}

// grid is a rate search range: lo, lo+step, ..., hi sessions per second.
type grid struct{ lo, hi, step float64 }

// points returns the grid's rates.
func (g grid) points() []float64 {
	var out []float64
	for i := 0; ; i++ {
		r := g.lo + float64(i)*g.step
		if r > g.hi+1e-9 {
			return out
		}
		out = append(out, math.Round(r*1000)/1000)
	}
}

// scenario is one cluster and workload.
type scenario struct {
	name, title string
	workload    string
	cluster     clustersim.Cluster
	profile     string
	preload     []clustersim.Preload
	// goodput, if set, makes the scenario a headline: goodput at SLO is
	// searched on this grid and the comparison runs at 80% of the engine
	// default's goodput. Otherwise the comparison runs at rate.
	goodput *grid
	rate    float64
	// routings compared (engine_default first).
	routings []string
	// build, if set, builds the workload instead of bench.Generate (trace
	// replays and generated traces).
	build func(rate float64, window time.Duration, seed uint64) (bench.Workload, error)
	// bypass is the share of requests that reach the engines without duet
	// (clustersim.Config.Bypass).
	bypass float64
	// restarts empty engines' caches mid-run (clustersim.Config.Restarts).
	restarts []clustersim.Restart
}

// headlineRoutings and otherRoutings are the comparisons.
var (
	headlineRoutings = append([]string{bench.PolicyEngineDefault, "least_tokens", "cache_aware", routingPrevious, routingDefault, routingDefault + "+covered", "oracle_load"}, peers.Names()...)
	otherRoutings    = append([]string{bench.PolicyEngineDefault, "round_robin", "least_tokens", "cache_aware", routingPrevious, routingDefault, routingDefault + "+covered", "oracle_load"}, peers.Names()...)
	// prefixRoutings compare, where prefixes are shared, the default
	// against the previous one, cache_aware with its balance gate off and
	// prefix_hash, least_cost's decode price against least_tokens', and the
	// prefix index bounded by KV capacity (the default) against the fixed
	// bound (+fullindex).
	prefixRoutings = append([]string{bench.PolicyEngineDefault, "least_tokens", "cache_aware", routingPrevious, routingDefault,
		"least_cost/least_tokens", "cache_aware{balance_abs_tokens: 1000000000}/least_tokens", "prefix_hash/least_tokens", routingDefault + "+fullindex", "oracle_load"}, peers.Names()...)
)

// decodeCacheRoutings compare, where decode engines run SGLang's decode
// radix cache, least_cost as it was (decode by load, first: the ratios are
// to it) with the default that prices the decode cache, SMG's cache_aware
// on both roles (its decode side follows the prompts it routed), Dynamo's
// KV router (its decode router is overlap-blind), and the engine default.
var decodeCacheRoutings = []string{routingDecodeByLoad, routingDefault, "smg_cache_aware", "dynamo_kv", bench.PolicyEngineDefault}

// withDecodeCache returns c with SGLang's decode radix cache on every
// decode engine (and its host tier with host), and the prefill engines'
// KV transfer at gbps (0: the profile's 40 GB/s).
func withDecodeCache(c clustersim.Cluster, on, host bool, gbps float64) clustersim.Cluster {
	out := clustersim.Cluster{Prefill: slices.Clone(c.Prefill), Decode: slices.Clone(c.Decode)}
	for i := range out.Decode {
		out.Decode[i].DecodeRadixCache, out.Decode[i].HierarchicalCache = on, on && host
	}
	for i := range out.Prefill {
		out.Prefill[i].KVTransferGBps = gbps
	}
	return out
}

// KV transfer bandwidths per rank of the decode cache scenarios. Over RDMA
// (RoCE, InfiniBand) a rank moves about 20-40 GB/s: Mooncake's SGLang PD
// benchmark peaks at 164 GB/s per 8-GPU node, and the profiles assume 40.
// Over TCP, which Mooncake's README puts at 1/2.4 to 1/4.6 of RDMA, with
// the eight ranks of a node sharing its NICs, a rank gets a few GB/s.
const (
	tcpGBps     = 4
	slowTCPGBps = 2
)

// decodeCacheScenarios are the scenarios of the decode radix cache
// comparison (docs/benchmarks/decode-cache.md): the agentic workload on
// transfer-bound clusters (4 and 2 GB/s) and a compute-bound one (40 GB/s),
// with the cache, with its host tier, and without it; multi-turn chat and
// the shared trace with the cache.
func decodeCacheScenarios(tracePath string) []scenario {
	std := clustersim.Uniform(dsv3, 2, 2, 4)
	big := clustersim.Uniform(dsv3, 4, 4, 8)
	const agenticRate = 0.08
	agentic := func(name, title string, on, host bool, gbps float64) scenario {
		return scenario{name: name, title: title, workload: bench.WorkloadAgentic,
			cluster: withDecodeCache(std, on, host, gbps), profile: dsv3, rate: agenticRate, routings: decodeCacheRoutings}
	}
	return []scenario{
		agentic("agentic_4gbps", "Agentic sessions (20k-60k-token histories, ~90 % reused per turn), decode radix cache, KV transfer 4 GB/s (TCP)", true, false, tcpGBps),
		agentic("agentic_2gbps", "Agentic sessions, decode radix cache, KV transfer 2 GB/s (slow TCP)", true, false, slowTCPGBps),
		agentic("agentic_40gbps", "Agentic sessions, decode radix cache, KV transfer 40 GB/s (RDMA, compute-bound)", true, false, 0),
		agentic("agentic_4gbps_hicache", "Agentic sessions, decode radix cache with its host tier (2× the GPU pool), KV transfer 4 GB/s", true, true, tcpGBps),
		agentic("agentic_4gbps_off", "Agentic sessions, no decode radix cache, KV transfer 4 GB/s", false, false, tcpGBps),
		{name: "multiturn_decode_cache", title: "Multi-turn conversations (the engine's answers sent back), decode radix cache, KV transfer 40 GB/s", workload: bench.WorkloadMultiTurn,
			cluster: withDecodeCache(std, true, false, 0), profile: dsv3, rate: 8, routings: decodeCacheRoutings, build: engineAnswers},
		{name: "multiturn_decode_cache_4gbps", title: "Multi-turn conversations (the engine's answers sent back), decode radix cache, KV transfer 4 GB/s", workload: bench.WorkloadMultiTurn,
			cluster: withDecodeCache(std, true, false, tcpGBps), profile: dsv3, rate: 8, routings: decodeCacheRoutings, build: engineAnswers},
		{name: "trace_decode_cache", title: "Trace replay (the shared Mooncake trace at its own pace), decode radix cache, KV transfer 40 GB/s", workload: "trace",
			cluster: withDecodeCache(big, true, false, 0), profile: dsv3, rate: 1, routings: decodeCacheRoutings, build: traceReplay(tracePath)},
	}
}

// kvEventsRoutings compare, with duet's default policy, what the scheduler
// knows of the engines' caches: its estimate on text blocks (today's, first:
// the ratios are to it), the same on token ids (a tokenizer), the engines'
// KV events delivered at once, after 50 ms and after 200 ms, and the engine
// model's true caches (the ceiling).
var kvEventsRoutings = []string{routingDefault, routingDefault + "+tokens", routingDefault + "+events",
	routingDefault + "+events50", routingDefault + "+events200", routingDefault + "+oracleview"}

// withReplicas returns routings run by n replicas that share nothing.
func withReplicas(routings []string, n int) []string {
	out := make([]string, len(routings))
	for i, r := range routings {
		out[i] = r + "+r" + strconv.Itoa(n)
	}
	return out
}

// multiTenant builds llm-d's precise-prefix benchmark shape: many tenants,
// each with a long prefix of its own (150 tenants, 5.5k-6.5k tokens, about
// 900k tokens: three quarters of the KV of the eight prefill ranks of the
// standard cluster), each request a tenant's prefix and a question of its
// own (no history).
func multiTenant(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
	return bench.Generate(bench.WorkloadMultiTurn, rate, window, seed, bench.Params{MultiTurn: bench.MultiTurnParams{
		Systems: multiTenantTenants, System: bench.IntRange{Min: 5500, Max: 6500}, Turns: bench.IntRange{Min: 1, Max: 1},
		Question: bench.IntRange{Min: 200, Max: 800}, Answer: bench.IntRange{Min: 100, Max: 300},
	}})
}

// multiTenantTenants is the multi-tenant scenario's number of tenants.
const multiTenantTenants = 150

// kvEventsScenarios are the scenarios of the KV events comparison
// (docs/benchmarks/kv-events.md): where duet's own traffic is all the
// engines see (the trace, production-shaped conversations, multi-turn chat,
// cache pressure, many tenants), with one replica and with four that share
// nothing, and the cases the estimate is blind to: traffic that bypasses
// duet, an engine restart mid-run, and decode radix caches with and
// without a host tier.
func kvEventsScenarios(tracePath string) []scenario {
	std := clustersim.Uniform(dsv3, 2, 2, 4)
	big := clustersim.Uniform(dsv3, 4, 4, 8)
	r4 := withReplicas(kvEventsRoutings, 4)
	tenants := func(name, title string, routings []string) scenario {
		return scenario{name: name, title: title, workload: bench.WorkloadMultiTurn, cluster: std, profile: dsv3,
			rate: multiTenantRate, routings: routings, build: multiTenant}
	}
	bypass := tenants("multi_tenant_bypass", "Multi-tenant, 30 % of requests bypassing duet (engines and ranks drawn at random)", kvEventsRoutings)
	bypass.bypass = 0.3
	restart := tenants("multi_tenant_restart", "Multi-tenant, both prefill engines restarted (caches emptied) at 4 and 6 minutes", kvEventsRoutings)
	restart.restarts = []clustersim.Restart{{At: 4 * time.Minute, Role: scheduler.RolePrefill, Engine: 0}, {At: 6 * time.Minute, Role: scheduler.RolePrefill, Engine: 1}}
	const agenticRate = 0.08
	return []scenario{
		tenants("multi_tenant", "Multi-tenant: 150 tenants with 5.5k-6.5k-token prefixes (KV demand ~75 % of the prefill ranks'), one question each", kvEventsRoutings),
		tenants("multi_tenant_r4", "Multi-tenant, four duet replicas that share nothing", r4),
		bypass,
		restart,
		{name: "trace", title: "Trace replay: the shared Mooncake trace at its own pace", workload: "trace",
			cluster: big, profile: dsv3, rate: 1, routings: kvEventsRoutings, build: traceReplay(tracePath)},
		{name: "production", title: "Production-shaped conversations, 2.9 requests/s", workload: "production",
			cluster: big, profile: dsv3, rate: 2.9, routings: kvEventsRoutings, build: production},
		{name: "multiturn", title: "Multi-turn conversations (8 shared system prompts, growing histories)", workload: bench.WorkloadMultiTurn,
			cluster: std, profile: dsv3, rate: 8, routings: kvEventsRoutings},
		{name: "multiturn_r4", title: "Multi-turn conversations, four duet replicas that share nothing", workload: bench.WorkloadMultiTurn,
			cluster: std, profile: dsv3, rate: 8, routings: r4},
		{name: "cache_pressure", title: "Multi-turn under cache pressure (400 system prompts of 1.5k-2.5k tokens)", workload: bench.WorkloadCachePressure,
			cluster: std, profile: dsv3, rate: 1.5, routings: kvEventsRoutings},
		{name: "agentic_decode_cache", title: "Agentic sessions, decode radix cache, KV transfer 4 GB/s", workload: bench.WorkloadAgentic,
			cluster: withDecodeCache(std, true, false, tcpGBps), profile: dsv3, rate: agenticRate, routings: kvEventsRoutings},
		{name: "agentic_hicache", title: "Agentic sessions, decode radix cache with its host tier (HiCache, 2× the GPU pool), KV transfer 4 GB/s", workload: bench.WorkloadAgentic,
			cluster: withDecodeCache(std, true, true, tcpGBps), profile: dsv3, rate: agenticRate, routings: kvEventsRoutings},
	}
}

// multiTenantRate is the multi-tenant scenarios' arrival rate (requests
// per second).
const multiTenantRate = 10

// engineAnswers builds the multi-turn workload with the engine's own
// answers sent back (bench.MultiTurnParams.EngineAnswers).
func engineAnswers(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
	return bench.Generate(bench.WorkloadMultiTurn, rate, window, seed, bench.Params{MultiTurn: bench.MultiTurnParams{EngineAnswers: true}})
}

// Trace scenario settings: the cluster of issue 16's measurements, 4
// prefill and 4 decode engines at dp 8, and prompts capped below one
// rank's KV (150k tokens on dsv3-dp8-h100-node: a longer prompt is a 400).
const traceMaxPrompt = 120000

// scenarios returns every scenario, headlines first. tracePath is the
// Mooncake-format trace the trace scenarios replay.
func scenarios(tracePath string) []scenario {
	std := clustersim.Uniform(dsv3, 2, 2, 4)
	big := clustersim.Uniform(dsv3, 4, 4, 8)
	replay := traceReplay(tracePath)
	hetero := clustersim.Cluster{
		Prefill: []clustersim.Engine{{Profile: dsv3, DPSize: 4}, {Profile: dsv3, DPSize: 2}},
		Decode:  []clustersim.Engine{{Profile: dsv3, DPSize: 4}, {Profile: dsv3, DPSize: 2}},
	}
	return []scenario{
		{name: "variable", title: "Variable-length prompts (1.5k-4k tokens in, 200-1,500 out)", workload: bench.WorkloadVariable,
			cluster: std, profile: dsv3, goodput: &grid{4, 16, 1}, routings: headlineRoutings},
		{name: "multiturn", title: "Multi-turn conversations (8 shared system prompts, growing histories)", workload: bench.WorkloadMultiTurn,
			cluster: std, profile: dsv3, goodput: &grid{2, 24, 1}, routings: headlineRoutings},
		{name: "bursty", title: "Bursty mix (3× rate a quarter of the time)", workload: bench.WorkloadBursty,
			cluster: std, profile: dsv3, rate: 3, routings: otherRoutings},
		{name: "prefill_bound", title: "Prefill-bound (6k-14k tokens in, 16-64 out), dense 8B, independent ranks", workload: bench.WorkloadPrefillBound,
			cluster: clustersim.Uniform(dense, 2, 2, 4), profile: dense, rate: 5, routings: otherRoutings},
		{name: "heavy_tail", title: "Heavy-tailed lengths (lognormal, ShareGPT medians/P90s)", workload: bench.WorkloadHeavyTail,
			cluster: std, profile: dsv3, rate: 6, routings: otherRoutings},
		{name: "cache_pressure", title: "Multi-turn under cache pressure (400 system prompts of 1.5k-2.5k tokens)", workload: bench.WorkloadCachePressure,
			cluster: std, profile: dsv3, rate: 1.5, routings: otherRoutings},
		{name: "heterogeneous", title: "Heterogeneous pool (one engine per role with dp 2 instead of 4), variable prompts", workload: bench.WorkloadVariable,
			cluster: hetero, profile: dsv3, rate: 6, routings: otherRoutings},
		{name: "preloaded", title: "Rank 0 preloaded at start (80 long prefills, 48 long decodes), variable prompts", workload: bench.WorkloadVariable,
			cluster: std, profile: dsv3, rate: 8, routings: otherRoutings, preload: []clustersim.Preload{
				{Role: scheduler.RolePrefill, Engine: 0, Rank: 0, Requests: 80, PromptTokens: 4000, OutputTokens: 1},
				{Role: scheduler.RoleDecode, Engine: 0, Rank: 0, Requests: 48, PromptTokens: 2000, OutputTokens: 3000},
			}},
		{name: "large", title: "Larger cluster (4 prefill × dp 8, 4 decode × dp 8), variable prompts", workload: bench.WorkloadVariable,
			cluster: big, profile: dsv3, rate: 32, routings: otherRoutings},
		{name: "trace", title: "Trace replay: the shared Mooncake trace at its own pace", workload: "trace",
			cluster: big, profile: dsv3, rate: 1, routings: prefixRoutings, build: replay},
		{name: "trace_fast", title: "Trace replay: the shared Mooncake trace 1.5× faster", workload: "trace",
			cluster: big, profile: dsv3, rate: 1.5, routings: prefixRoutings, build: replay},
		{name: "production", title: "Production-shaped conversations (one shared block, p50 7k / p90 27k prompts, reuse after ~2 min), 2.9 requests/s", workload: "production",
			cluster: big, profile: dsv3, rate: 2.9, routings: prefixRoutings, build: production},
		{name: "production_high", title: "Production-shaped conversations at 4.5 requests/s", workload: "production",
			cluster: big, profile: dsv3, rate: 4.5, routings: prefixRoutings, build: production},
	}
}

// traceReplay replays the trace at path: rate is the time compression,
// and seed k starts (k-1)/8 of the trace's duration into it, wrapping at
// its end, so that seeds see different stretches of the same trace. The
// trace is read once.
func traceReplay(path string) func(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
	load := sync.OnceValues(func() ([]bench.TraceRecord, error) { return bench.LoadTrace(path) })
	return func(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
		recs, err := load()
		if err != nil {
			return bench.Workload{}, fmt.Errorf("trace scenario (-trace %s): %w", path, err)
		}
		var span int64
		if n := len(recs); n > 0 {
			span = recs[n-1].Timestamp - recs[0].Timestamp
		}
		offset := time.Duration(span*int64((seed-1)%traceOffsets)/traceOffsets) * time.Millisecond
		return bench.TraceWorkload("trace", recs, bench.TraceOptions{
			Speedup: rate, Offset: offset, Window: window, MaxPromptTokens: traceMaxPrompt, Wrap: true,
		})
	}
}

// traceOffsets is how many distinct starting points the trace seeds use.
const traceOffsets = 8

// production generates a production-shaped trace (bench.ProductionParams'
// defaults) at rate requests per second and replays it.
func production(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
	recs := bench.GenerateProductionTrace(rate, window, seed, bench.ProductionParams{})
	return bench.TraceWorkload("production", recs, bench.TraceOptions{Window: window, MaxPromptTokens: traceMaxPrompt})
}

// options are the matrix's settings.
type options struct {
	seeds          int
	window, warmup time.Duration
	sloTTFTP99     time.Duration
	sloTPOTMean    time.Duration
	parallel       int
	resamples      int
	// routings, if set, replaces every scenario's routings.
	routings []string
	// rate, if positive, replaces every scenario's rate and skips the
	// goodput search.
	rate float64
}

// caseKey names one simulated case.
type caseKey struct {
	scenario string
	rate     float64
	routing  string
	seed     uint64
}

// runner runs cases, each once: results are memoized, and workloads are
// prepared once per (scenario, rate, seed) for all routings.
type runner struct {
	opts options
	mu   sync.Mutex
	done map[caseKey]clustersim.Summary
	prep map[prepKey]*prepEntry
	sem  chan struct{}
}

// prepKey names one prepared workload.
type prepKey struct {
	workload string
	profile  string
	rate     float64
	seed     uint64
}

// prepEntry is a prepared workload being built or built once.
type prepEntry struct {
	once sync.Once
	p    *clustersim.Prepared
	err  error
}

func newRunner(opts options) *runner {
	if opts.parallel <= 0 {
		opts.parallel = runtime.GOMAXPROCS(0)
	}
	return &runner{opts: opts, done: map[caseKey]clustersim.Summary{}, prep: map[prepKey]*prepEntry{}, sem: make(chan struct{}, opts.parallel)}
}

// summary runs (or recalls) one case.
func (r *runner) summary(ctx context.Context, sc scenario, rate float64, rt routing, seed uint64) (clustersim.Summary, error) {
	key := caseKey{sc.name, rate, rt.name, seed}
	r.mu.Lock()
	if s, ok := r.done[key]; ok {
		r.mu.Unlock()
		return s, nil
	}
	r.mu.Unlock()
	p, err := r.prepared(sc, rate, seed)
	if err != nil {
		return clustersim.Summary{}, err
	}
	r.sem <- struct{}{}
	res, err := clustersim.Run(ctx, clustersim.Config{
		Cluster: sc.cluster, Policy: rt.policy, Oracle: rt.oracle, Workload: p,
		Warmup: r.opts.warmup, Seed: seed, Preload: sc.preload, Scheduler: rt.scheduler,
		Replicas: rt.replicas, FeedbackAny: rt.feedbackAny, Share: rt.share,
		Cache: rt.cache, EventDelay: rt.eventDelay, Bypass: sc.bypass, Restarts: sc.restarts,
	})
	<-r.sem
	if err != nil {
		return clustersim.Summary{}, fmt.Errorf("%s at %g/s, %s, seed %d: %w", sc.name, rate, rt.name, seed, err)
	}
	s := res.Summarize()
	r.mu.Lock()
	r.done[key] = s
	r.mu.Unlock()
	return s, nil
}

// prepared returns the workload of (sc, rate, seed), preparing it once.
func (r *runner) prepared(sc scenario, rate float64, seed uint64) (*clustersim.Prepared, error) {
	key := prepKey{sc.workload + "/" + sc.name, sc.profile, rate, seed}
	r.mu.Lock()
	e := r.prep[key]
	if e == nil {
		e = &prepEntry{}
		r.prep[key] = e
	}
	r.mu.Unlock()
	e.once.Do(func() {
		build := sc.build
		if build == nil {
			build = func(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
				return bench.Generate(sc.workload, rate, window, seed, bench.Params{})
			}
		}
		w, err := build(rate, r.opts.window, seed)
		if err != nil {
			e.err = err
			return
		}
		prof, err := sim.LookupProfile(sc.profile)
		if err != nil {
			e.err = err
			return
		}
		e.p, e.err = clustersim.Prepare(w, "sim-model", prof.BlockSize)
	})
	return e.p, e.err
}

// release forgets the prepared workloads of seed (their memory is large).
func (r *runner) release(seed uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.prep {
		if k.seed == seed {
			delete(r.prep, k)
		}
	}
}

// meets reports whether s meets the SLO: every request served, p99 TTFT
// and mean TPOT within bounds.
func (o options) meets(s clustersim.Summary) bool {
	return s.Failed == 0 && s.Requests > 0 &&
		s.TTFTP99 <= float64(o.sloTTFTP99)/float64(time.Millisecond) &&
		s.TPOTMean <= float64(o.sloTPOTMean)/float64(time.Millisecond)
}

// goodput is the highest grid rate at which rt meets the SLO for seed; 0
// when even the lowest fails.
func (r *runner) goodput(ctx context.Context, sc scenario, rt routing, seed uint64) (float64, error) {
	return highestMeeting(sc.goodput.points(), func(rate float64) (bool, error) {
		s, err := r.summary(ctx, sc, rate, rt, seed)
		return err == nil && r.opts.meets(s), err
	})
}

// highestMeeting returns the highest of the ascending rates that meets,
// found by bisection, which assumes that a rate that fails is not followed
// by a higher one that meets; 0 when even the lowest fails.
func highestMeeting(rates []float64, meets func(float64) (bool, error)) (float64, error) {
	lo, hi := -1, len(rates) // rates[lo] meets (or lo = -1), rates[hi] fails (or hi = len)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		ok, err := meets(rates[mid])
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo < 0 {
		return 0, nil
	}
	return rates[lo], nil
}
