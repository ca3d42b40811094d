package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"
)

// Model is the calibrated engine model of one server (the model a Server
// runs with Config.Profile), for callers that drive it in virtual time
// themselves instead of through HTTP in scaled real time: the
// routing-quality simulator (e2e/clustersim). A Model has no goroutines and
// no clock; every call names the model time it happens at, and times never
// go backwards. It is not safe for concurrent use.
type Model struct {
	cfg     Config
	core    *engineCore
	changed []*Item
}

// Item is one request inside a Model. Its accessors read the model's
// state: call them between Model calls, not concurrently.
type Item struct {
	q      *engineRequest
	queued bool // in the model's changed list
	// Tag is the caller's: the Model never reads it.
	Tag any
}

// ItemState is where an Item is in the engine.
type ItemState int

// Item states, in the order an item goes through them.
const (
	// ItemBootstrap: a prefill item submitted with SubmitBootstrap, in its
	// rank's bootstrap queue until Bootstrapped (its decode preallocated).
	ItemBootstrap ItemState = iota
	// ItemWaiting: queued (decode: waiting for its KV preallocation).
	ItemWaiting
	// ItemPrefill: admitted, its prompt is being computed.
	ItemPrefill
	// ItemRunning: in the decode batch.
	ItemRunning
	// ItemTransfer: prefill: its KV is being sent; decode: its KV is
	// preallocated and it waits for the transfer.
	ItemTransfer
	// ItemReady: decode: its KV arrived; it joins the batch at the next step.
	ItemReady
	// ItemDone: finished or aborted.
	ItemDone
)

// State returns the item's state.
func (it *Item) State() ItemState { return ItemState(it.q.state) }

// Aborted reports whether the item was aborted.
func (it *Item) Aborted() bool { return it.q.aborted }

// Rank is the DP rank the item runs on.
func (it *Item) Rank() int { return it.q.rank }

// PromptTokens is the item's prompt length.
func (it *Item) PromptTokens() int { return it.q.prompt }

// CachedTokens is how many prompt tokens the rank's prefix cache held when
// the item was admitted (on a decode with the decode radix cache, its
// DecodePrefix; 0 on a decode without it).
func (it *Item) CachedTokens() int { return it.q.cached }

// Generated is the number of tokens generated so far.
func (it *Item) Generated() int { return it.q.generated }

// MaxNew is the item's output limit after the model clipped it.
func (it *Item) MaxNew() int { return it.q.maxNew }

// FirstTokenAt is when the first token was made (0 before).
func (it *Item) FirstTokenAt() time.Duration { return it.q.firstTokenAt }

// AdmittedAt is when the item was admitted (prefill) or its KV
// preallocated (decode).
func (it *Item) AdmittedAt() time.Duration { return it.q.admittedAt }

// DoneAt is when the item finished (0 before).
func (it *Item) DoneAt() time.Duration { return it.q.doneAt }

// DecodePrefix is, on a decode with the decode radix cache, the prompt
// tokens matched in the rank's cache at preallocation (GPU and host
// tiers): the decode_prefix_len to tell the prefill. 0 before the
// preallocation, without the cache, and on other servers.
func (it *Item) DecodePrefix() int {
	if it.q.kind != kindDecode {
		return 0
	}
	return it.q.decodePrefix
}

// HostHit is the part of DecodePrefix found in the host tier (decode
// HiCache), loaded back to the GPU before the item may decode.
func (it *Item) HostHit() int { return it.q.hostHit }

// TransferredTokens is, on a prefill, the prompt tokens whose KV was sent
// to the decode: the prompt less the decode's prefix (SetDecodePrefix). 0
// before the transfer started.
func (it *Item) TransferredTokens() int { return it.q.sent }

// CachedBlocks are, on a decode with the decode radix cache, the block
// hashes the item left in its rank's cache when it finished (its prompt
// and its answer, whole blocks of committed KV); nil before, for an
// aborted item, and without the cache.
func (it *Item) CachedBlocks() []uint64 { return it.q.cachedBlocks }

// NewModel returns the engine model of a server configured by cfg, at model
// time 0. cfg.Profile is required; zero fields take their defaults as in
// New. Mode chooses what an item does: prefill (prefill, one token, KV
// transfer), decode (KV preallocation, wait for KV, decode) or null
// (aggregated: prefill then decode on one rank).
func NewModel(cfg Config) (*Model, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sim model config: %w", err)
	}
	if cfg.Profile == "" {
		return nil, errors.New("sim model config: a profile is required")
	}
	if _, err := LookupProfile(cfg.Profile); err != nil {
		return nil, fmt.Errorf("sim model config: %w", err)
	}
	m := &Model{cfg: cfg, core: newEngineCore(modelParams(cfg))}
	return m, nil
}

// modelParams resolves the engine model's parameters from a defaulted,
// valid configuration whose profile exists.
func modelParams(cfg Config) engineParams {
	prof, _ := LookupProfile(cfg.Profile)
	gbps := prof.KVTransferGBps
	if cfg.KVTransferGBps > 0 {
		gbps = cfg.KVTransferGBps
	}
	p := engineParams{
		prof:       prof,
		mode:       cfg.Mode,
		dpSize:     cfg.DPSize,
		lockstep:   *cfg.DPAttention,
		capacity:   cfg.MaxTotalTokens,
		maxRunning: cfg.MaxRunningRequests,
		chunk:      prof.ChunkedPrefillSize,
		gbps:       gbps,
		order:      newPriorityOrder(cfg),
	}
	if cfg.Mode == ModeDecode && cfg.DecodeRadixCache {
		p.decodeRadix = true
		if cfg.HierarchicalCache && prof.BlockSize > 0 {
			// The host pool is hicache_ratio times the device pool.
			p.hostBlocks = int(cfg.HiCacheRatio*float64(cfg.MaxTotalTokens)) / prof.BlockSize
			p.loadGBps = cfg.HiCacheLoadGBps
		}
	}
	return p
}

// Config returns the model's effective configuration.
func (m *Model) Config() Config { return m.cfg }

// Submit queues a request on rank at model time t, after advancing the
// model to t. prompt is what ParsePrompt returns for its body (a decode
// with the decode radix cache also caches the answer's blocks, from
// prompt's Tail and Seed); maxNew is its max_tokens. With
// Config.EnablePriorityScheduling, prompt's Priority orders the rank's
// waiting queue. It fails, as SGLang does, when the rank does not exist,
// the prompt can never fit the rank's KV pool, or the prompt has a
// priority that Config.AbortOnPriorityWhenDisabled refuses (SGLang's 503).
func (m *Model) Submit(t time.Duration, rank int, prompt Prompt, maxNew int) (*Item, error) {
	return m.submit(t, rank, prompt, maxNew, false)
}

// SubmitBootstrap is Submit for a prefill model whose item waits in its
// rank's bootstrap queue (ItemBootstrap), as SGLang's prefill does, until
// Bootstrapped says its decode preallocated the KV: it is not queued for
// prefill before, and a decode short of KV thus holds it back. Submit
// queues it at once, as if its decode had preallocated on arrival. On
// other models SubmitBootstrap is Submit. The model has no bootstrap
// timeout; abort an item whose decode never preallocates.
func (m *Model) SubmitBootstrap(t time.Duration, rank int, prompt Prompt, maxNew int) (*Item, error) {
	return m.submit(t, rank, prompt, maxNew, true)
}

// submit is Submit, the prefill item in the bootstrap queue if bootstrap.
func (m *Model) submit(t time.Duration, rank int, prompt Prompt, maxNew int, bootstrap bool) (*Item, error) {
	m.Advance(t)
	if prompt.Priority != nil && !m.cfg.EnablePriorityScheduling && m.cfg.AbortOnPriorityWhenDisabled {
		return nil, fmt.Errorf("submit: %d %s", http.StatusServiceUnavailable, priorityDisabledMsg)
	}
	spec := requestSpec{rank: rank, prompt: prompt.Tokens, blocks: prompt.Blocks, ids: prompt.TokenIDs, maxNew: maxNew, tail: prompt.Tail, seed: prompt.Seed,
		priority: m.core.p.order.effective(prompt.Priority), bootstrap: bootstrap}
	switch m.cfg.Mode {
	case ModePrefill:
		spec.kind = kindPrefill
	case ModeDecode:
		spec.kind = kindDecode
	default:
		spec.kind = kindUnified
	}
	q, err := m.core.submit(spec, t)
	if err != nil {
		return nil, err
	}
	it := &Item{q: q}
	q.onSignal = func() { m.mark(it) }
	m.mark(it) // submitted: the caller may want to look at it again
	return it, nil
}

// mark adds it to the changed list once.
func (m *Model) mark(it *Item) {
	if !it.queued {
		it.queued = true
		m.changed = append(m.changed, it)
	}
}

// Bootstrapped tells a prefill item in ItemBootstrap, at t, that its
// decode preallocated the KV and holds tokens of its prompt already (the
// decode item's DecodePrefix; 0 without the decode radix cache): it joins
// its rank's waiting queue, observes prefill_bootstrap, and its KV
// transfer sends only the prompt beyond tokens. On an item past its
// bootstrap it is SetDecodePrefix.
func (m *Model) Bootstrapped(t time.Duration, it *Item, tokens int) {
	m.Advance(t)
	m.core.bootstrapped(it.q, tokens, t)
}

// SetDecodePrefix tells a prefill item, at t, how many of its prompt
// tokens its decode holds already (the decode item's DecodePrefix): its KV
// transfer sends only the rest. It is ignored on a non-prefill item and
// once the transfer started (the item then sent its whole prompt).
func (m *Model) SetDecodePrefix(t time.Duration, it *Item, tokens int) {
	m.Advance(t)
	m.core.setDecodePrefix(it.q, tokens)
}

// ReportedCachedTokens is the cached_tokens the server reports for it
// (usage.prompt_tokens_details.cached_tokens, meta_info.cached_tokens),
// given, on a decode, the cache hit of its prefill leg: CachedTokens,
// except on a decode with the decode radix cache, which reports the larger
// of prefillCached and its DecodePrefix, or their sum with
// DoubleCountCachedTokens (SGLang issue #25972).
func (m *Model) ReportedCachedTokens(it *Item, prefillCached int) int {
	return reportedCached(m.cfg, progress{cached: it.q.cached, decodePrefix: it.DecodePrefix()}, prefillCached)
}

// KVArrived tells a decode item waiting in ItemTransfer that its KV
// arrived at t; it joins the batch at its group's next step.
func (m *Model) KVArrived(t time.Duration, it *Item) {
	m.Advance(t)
	m.core.kvArrived(it.q, t)
}

// Abort removes it at t and frees what it holds (no-op once done).
func (m *Model) Abort(t time.Duration, it *Item) {
	m.Advance(t)
	m.core.abort(it.q, t)
}

// FlushCache empties, at t, the prefix cache of every rank that holds no
// request, as SGLang's flush_cache does on each idle scheduler, and
// reports whether rank 0 was flushed (SGLang answers with rank 0's
// result). Each flushed rank reports AllBlocksCleared.
func (m *Model) FlushCache(t time.Duration) bool {
	m.Advance(t)
	return m.core.flushIdle(t)
}

// ResetCache empties every rank's prefix cache at t, whatever it holds,
// as a restarted engine starts (each rank reports AllBlocksCleared). The
// KV of requests in flight stays theirs (uncached), so the model carries
// on; it is cached again when they insert it.
func (m *Model) ResetCache(t time.Duration) {
	m.Advance(t)
	m.core.resetCache(t)
}

// Advance processes everything due at or before t.
func (m *Model) Advance(t time.Duration) { m.core.advance(t) }

// NextEvent returns when the model next does something on its own (a step
// starts or ends, a KV transfer ends); ok is false when it is idle.
func (m *Model) NextEvent() (at time.Duration, ok bool) { return m.core.nextEvent() }

// Changed returns the items whose state or progress changed since the last
// call (and those submitted since), in the order they first changed.
func (m *Model) Changed() []*Item {
	out := m.changed
	m.changed = nil
	for _, it := range out {
		it.queued = false
	}
	return out
}

// LoadsJSON is the body a GET /v1/loads?include=core,disagg would get from
// the server at model time t.
func (m *Model) LoadsJSON(t time.Duration) ([]byte, error) {
	m.Advance(t)
	include := map[string]bool{"core": true, "disagg": true}
	return json.Marshal(loadsAnswer(m.cfg, m.core.snapshot(t), include, time.Unix(0, 0).Add(t)))
}

// ServerInfoJSON is the part of GET /server_info that routers read: DP
// size, disaggregation mode and bootstrap port, capacity, and the prefix
// cache args (decode radix cache, hierarchical cache, page size), and the
// priority scheduling args.
func (m *Model) ServerInfoJSON() ([]byte, error) {
	port := m.cfg.BootstrapPort
	if port == 0 && m.cfg.Mode == ModePrefill {
		port = DefaultBootstrapPort
	}
	info := map[string]any{
		"model_path":                    m.cfg.Model,
		"served_model_name":             m.cfg.Model,
		"dp_size":                       m.cfg.DPSize,
		"enable_dp_attention":           *m.cfg.DPAttention,
		"disaggregation_mode":           string(m.cfg.Mode),
		"disaggregation_bootstrap_port": port,
		"max_running_requests":          m.cfg.MaxRunningRequests,
		"max_total_num_tokens":          m.cfg.MaxTotalTokens,
		"version":                       Version,
	}
	maps.Copy(info, cacheServerArgs(m.cfg))
	maps.Copy(info, priorityServerArgs(m.cfg))
	return json.Marshal(info)
}

// RankState is the true state of one DP rank, as only the simulator can
// see it (oracles and plots).
type RankState struct {
	// PendingPrefill is the prompt tokens still to compute: the whole
	// prompts of waiting requests (their cache hit is not known before
	// admission) plus the rest of those being prefilled.
	PendingPrefill int
	// UsedTokens is the KV the rank cannot evict (SGLang's num_used_tokens).
	UsedTokens int
	// Promised is the KV the rank has promised beyond UsedTokens: the
	// admitted requests' reserved growth, plus the prompts and outputs of
	// the requests still queued.
	Promised int
	// Running and Waiting count requests in the batch and in the queue.
	Running, Waiting int
	// Bootstrapping counts a prefill's requests in the bootstrap queue
	// (SubmitBootstrap), not yet in Waiting nor in PendingPrefill.
	Bootstrapping int
}

// Ranks returns every rank's true state at t.
func (m *Model) Ranks(t time.Duration) []RankState {
	m.Advance(t)
	out := make([]RankState, len(m.core.ranks))
	for i, r := range m.core.ranks {
		st := RankState{UsedTokens: r.referenced(), Running: len(r.running) + len(r.ready), Waiting: len(r.waiting),
			Bootstrapping: len(r.bootstrap)}
		st.Promised = r.growth
		for _, q := range r.waiting {
			st.PendingPrefill += q.prompt
			st.Promised += q.prompt + q.maxNew
		}
		for _, q := range r.prefilling {
			st.PendingPrefill += q.prompt - q.computed
		}
		out[i] = st
	}
	return out
}

// CachedPrefix returns how many of prompt's tokens rank's prefix cache
// holds now (what admission would find, without pinning anything).
func (m *Model) CachedPrefix(rank int, prompt Prompt) int {
	if rank < 0 || rank >= len(m.core.ranks) {
		return 0
	}
	bt := m.core.p.prof.BlockSize
	if bt <= 0 {
		return 0
	}
	matched, _ := m.core.ranks[rank].cache.match(prompt.Blocks, (prompt.Tokens-1)/bt)
	return len(matched) * bt
}

// DecodeCachedPrefix returns how many of prompt's tokens rank's decode
// radix cache holds now, GPU and host tiers together (what preallocation
// would match, without pinning anything); 0 without the cache.
func (m *Model) DecodeCachedPrefix(rank int, prompt Prompt) int {
	if !m.core.p.decodeRadix || rank < 0 || rank >= len(m.core.ranks) {
		return 0
	}
	return m.core.matchDecode(m.core.ranks[rank], prompt.Blocks, prompt.Tokens).tokens(m.core.p.prof.BlockSize)
}

// BalanceRatio is the mean lockstep balance ratio of the steps so far
// (mean rank step time / slowest rank step time; 1 is perfect).
func (m *Model) BalanceRatio() float64 { return m.core.balanceRatio() }

// Prompt is what the engine model needs of a request's prompt.
type Prompt struct {
	// Tokens is the prompt length as the simulator counts it.
	Tokens int
	// Blocks are the prompt's prefix-cache block hashes.
	Blocks []uint64
	// MaxTokens is the request's output limit (the body's max_tokens or
	// equivalent; the server default when absent).
	MaxTokens int
	// Tail continues Blocks over the answer: a decode with the decode
	// radix cache caches the answer's blocks too, and they equal the
	// blocks of a next turn whose prompt carries the answer back. The
	// zero value caches the prompt's blocks only.
	Tail HashTail
	// Seed is the request's sampling seed, nil without one: the answer
	// is then ReplyText(*Seed, n), else "tok0 tok1 ...".
	Seed *int64
	// TokenIDs are the prompt's token ids when the request carries them
	// (/generate input_ids, a completions prompt of token ids), else nil.
	// The cache blocks of the prompt carry them into the KV events
	// (OnCacheEvents); Blocks must be those ParsePrompt computes from them.
	TokenIDs []int64
	// Priority is the body's priority field (SGLang's priority
	// scheduling), nil when absent.
	Priority *int64
}

// ParsePrompt parses an inference request body sent to path (one of the
// routes duet-sim serves) the way a server does, and returns its first
// item's prompt with blocks of blockTokens tokens (a profile's BlockSize).
func ParsePrompt(path string, body []byte, blockTokens int) (Prompt, error) {
	return parsePrompt(path, body, parseOptions{blockTokens: blockTokens})
}

// ParsePromptTokens is ParsePrompt, and gives a chat prompt stand-in token
// ids, for callers that need token ids without a tokenizer (the cluster
// simulator's token and KV event modes): one id per four characters (the
// simulator's token), each the hash of the prompt up to it, so two prompts
// share ids exactly where they share text, as a tokenizer's ids would but
// for effects at token boundaries. The ids ride the prompt's cache blocks
// into the KV events, and a decode radix cache's answer blocks get the
// answer's stand-in ids, continuing the prompt's.
func ParsePromptTokens(path string, body []byte, blockTokens int) (Prompt, error) {
	return parsePrompt(path, body, parseOptions{blockTokens: blockTokens, unitTokens: true})
}

// parsePrompt is ParsePrompt with opts.
func parsePrompt(path string, body []byte, opts parseOptions) (Prompt, error) {
	var route routeKind
	for _, r := range []routeKind{routeChat, routeCompletions, routeGenerate, routeResponses} {
		if r.path() == path {
			route = r
		}
	}
	if route == 0 {
		return Prompt{}, fmt.Errorf("parse prompt: %s is not an inference route", path)
	}
	req, aerr := parseInferRequest(route, body, DefaultModel, opts)
	if aerr != nil {
		return Prompt{}, fmt.Errorf("parse prompt: %d %s", aerr.status, aerr.msg)
	}
	it := req.items[0]
	return Prompt{Tokens: it.promptTokens, Blocks: it.blocks, MaxTokens: it.maxTokens, Tail: it.tail, Seed: it.seed, TokenIDs: it.ids,
		Priority: req.priority}, nil
}
