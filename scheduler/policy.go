package scheduler

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Request is what the scheduler and its policies know about one request.
type Request struct {
	// ID identifies the request, e.g. its x-request-id.
	ID string
	// Path is the request's HTTP path, e.g. /v1/chat/completions.
	Path string
	// DecodeOnly asks for a decode target alone, even in PD mode: requests
	// that are not inference (GET /v1/models, ...) are never mirrored, so no
	// prefill target is chosen and the prefill pool need not be ready.
	DecodeOnly bool
	// Model is the requested model name (for the per-model token estimate).
	Model string
	// Prompt is the prompt in a stable text form (chat messages rendered by
	// the caller); it feeds the token estimate and the prefix index. Ignored
	// when TokenIDs is set. It is valid only during Pick: the caller reuses
	// its memory afterwards, so neither Pick nor a Policy may keep it.
	Prompt []byte
	// TokenIDs is the prompt as token ids, when the client sent them.
	TokenIDs []int64
	// MaxTokens is the requested output length; 0 when not given.
	MaxTokens int
	// Items is the number of sequences in the request (batch size, n);
	// 0 counts as 1.
	Items int

	// Set by the scheduler before the policies run.

	// Now is the time of the pick on the scheduler's clock.
	Now time.Time
	// PromptTokens is the estimated (or, with TokenIDs, exact) prompt
	// length in tokens, over all items; at least 1.
	PromptTokens int64
	// Blocks are the prompt's chained block hashes (see package prefix).
	Blocks []uint64

	// Explain, when set, asks Pick to explain its decision: Pick fills it
	// with the decision as Status shows it (DecisionStatus, successful or
	// not), plus the parts of each chosen target's price where the role's
	// policy explains it (ChoiceStatus.Cost). duet sets it only for
	// requests it traces; nil costs nothing.
	Explain *DecisionStatus

	// prepared records that PromptTokens and Blocks were filled (by Cost),
	// so that Pick does not hash the prompt again.
	prepared bool
}

// Load is what duet knows about a target's load when a policy runs.
type Load struct {
	// Tokens is the target's token load: the tokens the engine reported in
	// its last fresh scrape plus the tokens duet reserved there since.
	Tokens int64
	// Reserved is the part of Tokens that duet reserved and no scrape has
	// covered yet.
	Reserved int64
	// Capacity is the rank's KV capacity in tokens; 0 when unknown.
	Capacity int64
	// Running and Waiting are the engine-reported request counts.
	Running, Waiting int
	// Fresh reports whether a scrape younger than the staleness bound backs
	// the engine-reported numbers; stale numbers are not used (zero).
	Fresh bool
	// Scraped is the engine-reported part: a prefill rank's pending prompt
	// tokens, a decode rank's tokens in use and queued; 0 when not Fresh.
	Scraped int64
	// ReservedWork is the part of Reserved that duet expects the engine to
	// compute: each reservation's tokens less the prefix duet believed the
	// target cached when it was picked.
	ReservedWork int64
}

// Candidate is one target as a policy sees it for one request.
type Candidate struct {
	Target
	// Load is the target's load, including duet's own reservations.
	Load Load
	// Prefix is the fraction (0 to 1) of the request's prompt blocks that
	// duet's prefix index believes are cached on this target.
	Prefix float64
	// CachedTokens is Prefix in tokens: the estimated prompt tokens the
	// target would not have to compute (prefill) or receive (a decode
	// engine with a decode radix cache). Only the hashed part of a prompt
	// (see prefix.DefaultMaxBlocks) can count, except on a decode target
	// that served an earlier turn of the conversation: there it is what
	// that turn left in the rank's cache, its prompt and its answer (see
	// DecodeCacheReader).
	CachedTokens int64
	// IndexedTokens is how much the prefix index believes the target's
	// cache holds in all, over every prompt routed there, in tokens; with
	// Load.Capacity it tells how full that cache is. Set only for policies
	// that read prefixes.
	IndexedTokens int64
}

// Policy chooses one target among candidates.
//
// The scheduler calls Pick with a non-empty candidate list in a stable
// order (see buildTargets), under the pool's lock: picks of one pool never
// run concurrently, and the chosen target's reservation is recorded before
// the next pick sees the loads. The policy must not retain cands. Pick must
// be cheap: it runs on the request path. Ties must break deterministically
// (the earliest candidate wins) unless the policy is random by design.
type Policy interface {
	// Name returns the policy's name, e.g. "least_tokens".
	Name() string
	// Pick returns the index in cands of the chosen target.
	Pick(ctx context.Context, req *Request, cands []Candidate) (int, error)
}

// CostExplainer is implemented by policies that price each candidate
// (least_cost), to explain a decision: for a pick asked to explain itself
// (Request.Explain), the scheduler calls ExplainCost right after Pick,
// under the same lock, with the same request and candidates, for the
// candidate Pick chose. It returns the parts of that candidate's price, as
// Pick computed it, and must not change the policy's state.
type CostExplainer interface {
	// ExplainCost returns the parts of the price of cands[i] for req.
	ExplainCost(req *Request, cands []Candidate, i int) []CostTerm
}

// PrefixReader is implemented by policies that read Candidate.Prefix. The
// scheduler matches and records prompts in its prefix index only for a
// role whose policy reads it: for the others, a new prompt's blocks would
// be recorded for nothing, and recording them is the costliest part of a
// pick (a never-seen 32 KiB prompt: about 0.3 ms, BenchmarkInsert).
type PrefixReader interface {
	// ReadsPrefix reports whether the policy reads Candidate.Prefix.
	ReadsPrefix() bool
}

// readsPrefix reports whether p reads Candidate.Prefix.
func readsPrefix(p Policy) bool {
	r, ok := p.(PrefixReader)
	return ok && r.ReadsPrefix()
}

// DecodeCacheReader is implemented by decode policies that read the prefix
// a decode engine's own radix cache holds (SGLang's decode-side radix cache,
// Endpoint.DecodeCache). The scheduler then indexes the prompts it sends to
// such engines, and the answers they generated, and fills
// Candidate.CachedTokens of their targets; targets of engines without the
// cache get none. While no decode engine has the cache nothing is indexed
// or matched for the decode role, so such a policy costs what it did
// without the cache.
type DecodeCacheReader interface {
	// ReadsDecodeCache reports whether the policy reads the decode
	// engines' cached prefixes.
	ReadsDecodeCache() bool
}

// readsDecodeCache reports whether p reads decode engines' cached prefixes.
func readsDecodeCache(p Policy) bool {
	r, ok := p.(DecodeCacheReader)
	return ok && r.ReadsDecodeCache()
}

// LegObserver is implemented by policies that learn from the legs placed
// with them (an engine's measured speed, a router-side count of requests in
// flight). The scheduler calls ObserveLeg once for every leg that ends, by
// its feedback, the whole request's, or the reservation's expiry, under
// the same lock as Pick: never concurrently with Pick or itself. It must be
// cheap and must not call the scheduler.
type LegObserver interface {
	// ObserveLeg reports one ended leg of the policy's role.
	ObserveLeg(LegReport)
}

// LegReport is one ended leg, as a LegObserver sees it.
type LegReport struct {
	// RequestID is the request's ID as given to Pick.
	RequestID string
	// Role is the leg's role.
	Role Role
	// Target is the target the leg was placed on.
	Target TargetKey
	// Picked is when the target was chosen; Ended when the leg's feedback
	// (or the request's, or the expiry) arrived.
	Picked, Ended time.Time
	// Tokens is what the pick reserved on the target, and Work the part of
	// it duet expected the engine to compute (Tokens less the believed
	// cached prefix).
	Tokens, Work int64
	// Failed reports a failed leg, or one that ended without feedback.
	Failed bool
}

// PolicySpec names a policy and its parameters. Parameters a policy does
// not use are ignored; zero values mean the policy's defaults.
type PolicySpec struct {
	// Name is one of PolicyNames().
	Name string
	// CacheThreshold is the prefix-match fraction above which cache_aware
	// follows the cache (default 0.3).
	CacheThreshold float64
	// BalanceAbsTokens and BalanceRel bound the imbalance cache_aware
	// tolerates: it balances by load when max-min > BalanceAbsTokens and
	// max > BalanceRel*min (defaults 16384 tokens and 1.5).
	BalanceAbsTokens int64
	BalanceRel       float64
	// LoadFactor bounds prefix_hash's consistent hashing: a target is
	// skipped while its load exceeds LoadFactor times the mean (default 1.25).
	LoadFactor float64
	// Weights maps scorer names (see ScorerNames) to weights for weighted.
	Weights map[string]float64
	// Seed seeds random and power_of_two; 0 means a random seed.
	Seed uint64
	// IgnoreDecodeCache makes least_cost price decode targets by load
	// alone, as it did before it read decode engines' radix caches.
	IgnoreDecodeCache bool
	// Role is the role the policy serves; the scheduler sets it. Policies
	// that price a role's own costs (least_cost) read it.
	Role Role
}

// policyFactories builds each policy from its spec.
var policyFactories = map[string]func(PolicySpec) (Policy, error){
	policyRoundRobin:  func(PolicySpec) (Policy, error) { return newRoundRobin(), nil },
	policyLeastTokens: newLeastTokens,
	policyRandom:      newRandom,
	policyPowerOfTwo:  newPowerOfTwo,
	policyPrefixHash:  newPrefixHash,
	policyCacheAware:  newCacheAware,
	policyWeighted:    newWeighted,
	policyLeastCost:   newLeastCost,
}

// PolicyNames lists the policy names NewPolicy accepts, sorted.
func PolicyNames() []string {
	names := make([]string, 0, len(policyFactories))
	for n := range policyFactories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// The policy names.
const (
	policyRoundRobin  = "round_robin"
	policyLeastTokens = "least_tokens"
	policyRandom      = "random"
	policyPowerOfTwo  = "power_of_two"
	policyPrefixHash  = "prefix_hash"
	policyCacheAware  = "cache_aware"
	policyWeighted    = "weighted"
	policyLeastCost   = "least_cost"
)

// The policies duet ships as its defaults, for each role (cmd/duet's
// configuration applies them where the file names none; a Scheduler built
// from a Config without policies uses round_robin). least_cost replaced
// cache_aware (prefill) and least_tokens (decode): see docs/scheduling.md.
const (
	DefaultPrefillPolicy = policyLeastCost
	DefaultDecodePolicy  = policyLeastCost
)

// NewPolicy returns the policy spec names, configured by spec.
func NewPolicy(spec PolicySpec) (Policy, error) {
	build, ok := policyFactories[spec.Name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (valid: %s)", spec.Name, strings.Join(PolicyNames(), ", "))
	}
	p, err := build(spec)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", spec.Name, err)
	}
	return p, nil
}
