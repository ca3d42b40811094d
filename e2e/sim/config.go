package sim

import (
	"errors"
	"fmt"
	"math"
	"net"
	"time"
)

// Mode is the disaggregation mode of a simulated server, as reported in
// SGLang's disaggregation_mode field.
type Mode string

// Disaggregation modes.
const (
	// ModePrefill is a PD prefill server. It runs a bootstrap server.
	ModePrefill Mode = "prefill"
	// ModeDecode is a PD decode server. It waits for KV from a prefill.
	ModeDecode Mode = "decode"
	// ModeNull is an aggregated (non-PD) server.
	ModeNull Mode = "null"
)

// ParseMode parses a --mode value.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModePrefill, ModeDecode, ModeNull:
		return Mode(s), nil
	}
	return "", fmt.Errorf("invalid mode %q: want prefill, decode or null", s)
}

// engineType is the engine_type metric label SGLang uses for a mode.
func (m Mode) engineType() string {
	if m == ModeNull {
		return "unified"
	}
	return string(m)
}

// Version is the SGLang version the simulator reports.
const Version = "0.5.19"

// VLLMVersion is the vLLM version the simulator reports with FlavorVLLM.
const VLLMVersion = "0.18.0"

// Flavor is the engine the simulator imitates.
type Flavor string

// Flavors.
const (
	// FlavorSGLang serves SGLang's API (the default).
	FlavorSGLang Flavor = "sglang"
	// FlavorVLLM serves vLLM's API: aggregated only, DP rank from the
	// X-data-parallel-rank header, vllm: metrics, no /v1/loads.
	FlavorVLLM Flavor = "vllm"
)

// ParseFlavor parses a --flavor value.
func ParseFlavor(s string) (Flavor, error) {
	switch Flavor(s) {
	case FlavorSGLang, FlavorVLLM:
		return Flavor(s), nil
	}
	return "", fmt.Errorf("invalid flavor %q: want sglang or vllm", s)
}

// Faults configures fault injection. Probabilities are per inference
// request, drawn from a source seeded by Config.Seed and the request's
// arrival number, so the same seed and arrival order inject the same
// faults. Durations are model time (divided by the time scale).
type Faults struct {
	// SpikeProb is the probability that a request is delayed by Spike
	// before it is served (a latency spike).
	SpikeProb float64
	// Spike is the extra latency of a spiked request.
	Spike time.Duration
	// ErrorRate is the probability that a request fails with HTTP 500
	// (SGLang's internal error) right after it is parsed.
	ErrorRate float64
	// DieAfter > 0 makes the server crash on the inference request after
	// the first DieAfter ones: its listeners close, requests in flight
	// are cut, and Errors delivers ErrDied (duet-sim exits non-zero).
	DieAfter int
	// SlowScrape delays every /v1/loads and /metrics answer.
	SlowScrape time.Duration
	// Hang makes the engine's scheduler stuck: inference requests are
	// accepted and never progress (they end when the client goes away),
	// /abort_request answers 200 and does nothing, /v1/loads, /metrics and
	// /server_info never answer, and /health answers 503 after
	// Config.HealthTimeout. Ending the hang at runtime lets everything
	// held carry on.
	Hang bool
	// Loads makes /v1/loads and /metrics answer normally (ok, the
	// default), with unparsable bytes (garbage) or with HTTP 500.
	Loads LoadsFault
}

// Default values. Config.withDefaults applies them to zero fields, except
// DefaultBootstrapPort, DefaultPrefillPer1K and DefaultDecodePerToken, which
// are the CLI defaults only (zero is meaningful in Config).
const (
	DefaultListen             = "127.0.0.1:30000"
	DefaultBootstrapPort      = 8998
	DefaultModel              = "sim-model"
	DefaultKVTimeout          = 300 * time.Second
	DefaultPrefillPer1K       = 10 * time.Millisecond
	DefaultDecodePerToken     = 2 * time.Millisecond
	DefaultMaxTotalTokens     = 500000
	DefaultMaxRunningRequests = 256
	DefaultKVPollInterval     = 10 * time.Millisecond
	DefaultMaxModelLen        = 131072
	DefaultMaxRecords         = 10000
	DefaultHealthTimeout      = 20 * time.Second
	// DefaultHiCacheRatio is SGLang's --hicache-ratio default: the host
	// KV pool is twice the device pool.
	DefaultHiCacheRatio = 2.0
	// DefaultHiCacheLoadGBps is the host-to-device load-back bandwidth of
	// the decode's host tier (an assumption: PCIe Gen5 x16 in practice).
	DefaultHiCacheLoadGBps = 25.0
	defaultMaxNewTokens    = 16
)

// Config configures a simulated server. Zero values take the defaults
// above, except the two latency fields, where zero means "no delay"
// (handy in tests); the CLI always sets them.
type Config struct {
	// Mode is prefill, decode or null (aggregated). Default null.
	Mode Mode
	// Listen is the main HTTP API address (host:port). Port 0 picks a free
	// port when the server is started with Start.
	Listen string
	// DPSize is the number of DP ranks. Default 1.
	DPSize int
	// BootstrapPort is the prefill bootstrap server port (prefill listens
	// on it, on the host of Listen); decode uses it when a request carries
	// a null bootstrap_port. The CLI default is 8998 (DefaultBootstrapPort);
	// here 0 is kept as is, so that Start picks a free port for prefill.
	BootstrapPort int
	// Model is the served model name. Default "sim-model".
	Model string
	// KVTimeout is how long decode waits for the prefill's KV
	// (SGLANG_DISAGGREGATION_WAITING_TIMEOUT) and, with AwaitTransfer, how
	// long prefill holds finished KV for its decode. Default 300s.
	KVTimeout time.Duration
	// BootstrapTimeout is how long a PD prefill request waits in its
	// bootstrap queue for its decode to preallocate the KV before it fails
	// (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, SGLang's default 300s; model
	// time). The engine model always has the bootstrap queue, the simple
	// model only with AwaitTransfer. Default: KVTimeout.
	BootstrapTimeout time.Duration
	// AwaitTransfer makes a prefill item answer only once a decode has
	// taken its KV (polled the room as done), as SGLang's prefill does: it
	// keeps the request in its inflight queue until the transfer succeeds.
	// A prefill whose decode never comes holds its KV for KVTimeout and
	// then fails; a prefill that dies before the decode took the KV fails
	// its HTTP request. Without it the prefill answers when its KV is
	// ready (simpler for tests that run a prefill alone).
	AwaitTransfer bool
	// PrefillPer1KTokens is the simulated prefill compute time per 1000
	// prompt tokens.
	PrefillPer1KTokens time.Duration
	// DecodePerToken is the simulated time per generated token.
	DecodePerToken time.Duration
	// MaxTotalTokens is the KV capacity per rank (max_total_num_tokens).
	// Default 500000.
	MaxTotalTokens int
	// MaxRunningRequests is reported as max_running_requests. Default 256.
	MaxRunningRequests int
	// LegacyServerInfo serves only /get_server_info (404 on /server_info),
	// like SGLang releases before /server_info existed.
	LegacyServerInfo bool
	// KVPollInterval is how often decode polls the prefill's KV state.
	// Default 10ms.
	KVPollInterval time.Duration
	// StreamInterval sends one streaming chunk per this many tokens, like
	// SGLang's --stream-interval (the first token always at once); 0 or 1
	// streams every token.
	StreamInterval int
	// MaxRecords bounds the request-record store (records hold the request
	// bodies); the oldest records are dropped first. Default 10000.
	MaxRecords int

	// Profile selects the calibrated engine model (see Profile and
	// MODEL.md); "" keeps the simple model driven by PrefillPer1KTokens
	// and DecodePerToken. With a profile, zero DPSize, MaxTotalTokens and
	// MaxRunningRequests take the profile's values.
	Profile string
	// DPAttention makes the ranks step in lockstep (engine model); nil
	// takes the profile's default. Also reported as enable_dp_attention.
	DPAttention *bool
	// KVTransferGBps overrides the profile's PD KV transfer bandwidth in
	// GB/s (10^9 bytes per second); 0 keeps the profile's.
	KVTransferGBps float64
	// TimeScale makes model time run TimeScale times faster than wall
	// time: every modelled duration (both models, KVTimeout, fault
	// durations) is divided by it before sleeping. 0 means 1.
	TimeScale float64
	// HealthTimeout is how long /health waits for its one-token
	// generation before answering 503 (SGLANG_HEALTH_CHECK_TIMEOUT, model
	// time). Default 20s.
	HealthTimeout time.Duration
	// Seed seeds every random choice (fault injection).
	Seed uint64
	// Flavor is sglang (default) or vllm.
	Flavor Flavor
	// Faults configures fault injection.
	Faults Faults

	// DecodeRadixCache is SGLang's
	// --disaggregation-decode-enable-radix-cache: a decode server keeps a
	// per-rank radix cache of finished requests (prompt and answer),
	// matches each new request against it at preallocation, and asks its
	// prefill for the KV beyond the match only. It acts on a decode server
	// of the engine model; elsewhere it is only reported in /server_info.
	DecodeRadixCache bool
	// HierarchicalCache is --enable-hierarchical-cache on such a decode
	// (decode HiCache): blocks evicted from the GPU tier stay in a host
	// tier, and a match that continues there loads them back before the
	// request decodes. It requires DecodeRadixCache.
	HierarchicalCache bool
	// HiCacheRatio is --hicache-ratio: the host tier holds this many times
	// the device KV pool. Default 2.
	HiCacheRatio float64
	// HiCacheLoadGBps is the host-to-device load-back bandwidth in GB/s
	// (10^9 bytes per second). Default 25 (an assumption).
	HiCacheLoadGBps float64
	// DoubleCountCachedTokens reproduces SGLang issue #25972 on a decode
	// with DecodeRadixCache: the reported cached_tokens is the prefill's
	// hit plus the decode's match (it can exceed the prompt) instead of
	// the larger of the two.
	DoubleCountCachedTokens bool
	// Tokenizer is a tokenizer directory (the model's tokenizer.json and
	// tokenizer_config.json, and chat_template.jinja when it has one). With
	// the engine model, text prompts (chat, completions, /generate text)
	// are then keyed by the token ids duet computes for them
	// (extproc.PromptTokens) and count their real tokens, so their cache
	// blocks carry token ids into the KV events; a decode caches no
	// answer blocks for them. "" keys text by characters.
	Tokenizer string
	// KVEventsConfig is SGLang's --kv-events-config: a JSON
	// KVEventsConfig ({"publisher": "zmq", "endpoint": "tcp://*:5557",
	// "replay_endpoint": "tcp://*:5600", "topic": "", "buffer_steps":
	// 10000, ...}; absent fields take SGLang's defaults, and its default
	// publisher "null" publishes nothing). With "zmq" every DP rank
	// publishes its prefix cache's events on its own PUB socket (the
	// endpoint's port plus the rank) with a replay ROUTER (likewise), as
	// SGLang 0.5.23 does; duet-sim binds both, so the endpoint needs a
	// wildcard host or "bind": true. "" publishes nothing. A "zmq"
	// publisher needs Profile (the engine model's prefix cache is what it
	// publishes; the simple model has none), and text prompts' blocks are
	// published only with Tokenizer (their token ids).
	KVEventsConfig string
	// ForceQueryPrefillDPRank is SGLang's environment variable
	// SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 ("allow mixed
	// routing"), which cmd/duet-sim reads: a prefill serves a pinned rank
	// that its bootstrap room does not imply (no follow_bootstrap_room
	// conflict), and a decode takes the KV from whichever prefill rank
	// holds the room instead of expecting room % dp (SGLang asks the
	// prefill's bootstrap server). Routers that pin a prefill rank without
	// minting the room for it (SMG's --dp-aware) need it.
	ForceQueryPrefillDPRank bool

	// EnablePriorityScheduling is SGLang's --enable-priority-scheduling:
	// every request has a priority (the body's integer priority field; a
	// request without one gets the lowest, as SGLang gives it sys.maxsize
	// or -sys.maxsize-1), and the engine model's waiting queues (a
	// decode's prealloc queue too) let higher-priority requests start
	// first, first come first served among equals. Larger values come
	// first unless ScheduleLowPriorityValuesFirst. Running requests are
	// never preempted (SGLang preempts them unless
	// --disable-priority-preemption; the simulator does not model it).
	// The simple model has no queue: there priority changes nothing but
	// is validated and recorded.
	EnablePriorityScheduling bool
	// ScheduleLowPriorityValuesFirst is SGLang's
	// --schedule-low-priority-values-first: with EnablePriorityScheduling,
	// smaller priority values start first.
	ScheduleLowPriorityValuesFirst bool
	// AbortOnPriorityWhenDisabled is SGLang's
	// --abort-on-priority-when-disabled: without EnablePriorityScheduling,
	// a request that carries a priority is aborted with SGLang's 503
	// "Using priority is disabled for this server. ..." instead of served
	// (without it the field is ignored).
	AbortOnPriorityWhenDisabled bool
}

// withDefaults returns c with zero fields replaced by defaults.
func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeNull
	}
	if c.Flavor == "" {
		c.Flavor = FlavorSGLang
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if p, err := LookupProfile(c.Profile); err == nil {
		if c.DPSize == 0 {
			c.DPSize = p.DPSize
		}
		if c.MaxTotalTokens == 0 {
			c.MaxTotalTokens = p.MaxTotalTokens
		}
		if c.MaxRunningRequests == 0 {
			c.MaxRunningRequests = p.MaxRunningRequests
		}
		if c.DPAttention == nil {
			v := p.DPAttention
			c.DPAttention = &v
		}
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.DPSize == 0 {
		c.DPSize = 1
	}
	if c.DPAttention == nil {
		// The simple model reports DP attention whenever dp_size > 1.
		v := c.DPSize > 1
		c.DPAttention = &v
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.KVTimeout == 0 {
		c.KVTimeout = DefaultKVTimeout
	}
	if c.BootstrapTimeout == 0 {
		c.BootstrapTimeout = c.KVTimeout
	}
	if c.MaxTotalTokens == 0 {
		c.MaxTotalTokens = DefaultMaxTotalTokens
	}
	if c.MaxRunningRequests == 0 {
		c.MaxRunningRequests = DefaultMaxRunningRequests
	}
	if c.KVPollInterval == 0 {
		c.KVPollInterval = DefaultKVPollInterval
	}
	if c.MaxRecords == 0 {
		c.MaxRecords = DefaultMaxRecords
	}
	if c.HealthTimeout == 0 {
		c.HealthTimeout = DefaultHealthTimeout
	}
	if c.Faults.Loads == "" {
		c.Faults.Loads = LoadsOK
	}
	if c.HiCacheRatio == 0 {
		c.HiCacheRatio = DefaultHiCacheRatio
	}
	if c.HiCacheLoadGBps == 0 {
		c.HiCacheLoadGBps = DefaultHiCacheLoadGBps
	}
	return c
}

// validate reports the first invalid field of a defaulted config.
func (c Config) validate() error {
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("invalid listen address %q: %w", c.Listen, err)
	}
	var errs []error
	if c.DPSize < 1 {
		errs = append(errs, fmt.Errorf("dp-size must be >= 1, got %d", c.DPSize))
	}
	if c.BootstrapPort < 0 || c.BootstrapPort > 65535 {
		errs = append(errs, fmt.Errorf("bootstrap-port out of range: %d", c.BootstrapPort))
	}
	if c.KVTimeout < 0 {
		errs = append(errs, fmt.Errorf("kv-timeout must be positive, got %s", c.KVTimeout))
	}
	if c.BootstrapTimeout < 0 {
		errs = append(errs, fmt.Errorf("bootstrap-timeout must be positive, got %s", c.BootstrapTimeout))
	}
	if c.PrefillPer1KTokens < 0 || c.DecodePerToken < 0 {
		errs = append(errs, errors.New("latencies must not be negative"))
	}
	if c.MaxTotalTokens < 1 {
		errs = append(errs, fmt.Errorf("max-total-tokens must be >= 1, got %d", c.MaxTotalTokens))
	}
	if c.MaxRecords < 1 {
		errs = append(errs, fmt.Errorf("max records must be >= 1, got %d", c.MaxRecords))
	}
	if c.Profile != "" {
		if _, err := LookupProfile(c.Profile); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MaxRunningRequests < 1 {
		errs = append(errs, fmt.Errorf("max running requests must be >= 1, got %d", c.MaxRunningRequests))
	}
	if _, err := ParseFlavor(string(c.Flavor)); err != nil {
		errs = append(errs, err)
	} else if c.Flavor == FlavorVLLM && c.Mode != ModeNull {
		errs = append(errs, fmt.Errorf("flavor vllm serves aggregated (mode null) only, got mode %s", c.Mode))
	}
	if !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0) {
		errs = append(errs, fmt.Errorf("time-scale must be > 0, got %v", c.TimeScale))
	}
	if c.KVTransferGBps < 0 {
		errs = append(errs, fmt.Errorf("kv-transfer-gbps must not be negative, got %v", c.KVTransferGBps))
	}
	if c.HealthTimeout < 0 {
		errs = append(errs, fmt.Errorf("health timeout must not be negative, got %s", c.HealthTimeout))
	}
	errs = append(errs, c.validateCache()...)
	if c.Flavor == FlavorVLLM && (c.EnablePriorityScheduling || c.ScheduleLowPriorityValuesFirst || c.AbortOnPriorityWhenDisabled) {
		errs = append(errs, errors.New("the priority scheduling flags are SGLang's: flavor vllm does not take them"))
	}
	errs = append(errs, c.validateKVEvents())
	errs = append(errs, c.Faults.validate()...)
	return errors.Join(errs...)
}

// validateCache checks the decode radix cache and host tier settings.
func (c Config) validateCache() []error {
	var errs []error
	if c.HierarchicalCache && !c.DecodeRadixCache {
		errs = append(errs, errors.New(
			"--enable-hierarchical-cache requires --disaggregation-decode-enable-radix-cache (the simulator models the host tier of a decode's radix cache only)"))
	}
	if !(c.HiCacheRatio > 0) || math.IsInf(c.HiCacheRatio, 0) {
		errs = append(errs, fmt.Errorf("hicache-ratio must be > 0, got %v", c.HiCacheRatio))
	}
	if !(c.HiCacheLoadGBps > 0) || math.IsInf(c.HiCacheLoadGBps, 0) {
		errs = append(errs, fmt.Errorf("hicache-load-gbps must be > 0, got %v", c.HiCacheLoadGBps))
	}
	return errs
}
