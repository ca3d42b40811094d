package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Profile is a calibrated engine model (see MODEL.md). Selecting one with
// Config.Profile (--profile) replaces the simple latency model with the
// continuous-batching engine: per-rank queues, KV budget, chunked prefill,
// prefix cache, lockstep DP attention and KV transfer time.
//
// Every number is per DP rank and in model time. The sources are the
// research note shared/reference/simulation-and-benchmarks.md §5 (cited as
// "ref §5.x"); the values not given there are marked as assumptions.
type Profile struct {
	// Name is the --profile value.
	Name string
	// Description says what the profile stands for.
	Description string

	// PrefillBase is c0, the fixed cost of one prefill (extend) step.
	PrefillBase time.Duration
	// PrefillPerToken is c1, the cost of one new (uncached) prompt token.
	PrefillPerToken time.Duration
	// PrefillQuadMS is c2 in ms per token²: a request computing T new
	// tokens on top of P tokens already in KV costs c2·T·(P + T/2) more
	// (attention over the prefix plus causal self-attention).
	PrefillQuadMS float64
	// ChunkedPrefillSize is the per-step prefill token budget of a rank
	// (SGLang's chunked_prefill_size, already divided by dp_size under DP
	// attention).
	ChunkedPrefillSize int

	// DecodeBase is d0, the fixed cost of one decode step (weights).
	DecodeBase time.Duration
	// DecodePerReq is d_req, the cost of one running request in a step.
	DecodePerReq time.Duration
	// DecodePer1KCtx is d_kv, the cost of 1000 tokens of context (prompt
	// plus generated) summed over the running requests.
	DecodePer1KCtx time.Duration

	// MaxTotalTokens is the KV pool of a rank (max_total_num_tokens).
	MaxTotalTokens int
	// MaxRunningRequests bounds the admitted requests of a rank.
	MaxRunningRequests int
	// DPSize is the default dp_size when --dp-size is not given.
	DPSize int
	// DPAttention is the default of --dp-attention: ranks step in lockstep.
	DPAttention bool

	// KVBytesPerToken is the KV size of one token, for the PD transfer.
	KVBytesPerToken int
	// KVTransferGBps is the default transfer bandwidth in GB/s (10^9
	// bytes per second).
	KVTransferGBps float64
	// KVTransferSetup is the fixed cost of one transfer.
	KVTransferSetup time.Duration

	// BlockSize is the prefix-cache granularity in tokens: prompts are
	// cached and matched in whole blocks.
	BlockSize int
}

// msf converts milliseconds to a Duration.
func msf(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// profiles are the built-in profiles, by name.
var profiles = map[string]Profile{
	// Dense 8B model (Llama-3-8B class), SGLang, TP1 on one H100 per rank,
	// plain DP (independent ranks). ref §5.7 row dense-8b-h100.
	"dense-8b-h100": {
		Name:        "dense-8b-h100",
		Description: "dense 8B model, one H100 per rank, plain DP (independent ranks)",
		// ref §5.2: c0 15 ms, c1 0.05 ms/token (~20k tok/s: between the
		// H100 roofline 0.036 and the SMG/llm-d figures 0.125-0.30),
		// c2 2e-6 ms/token². A 4k cold prompt: 15 + 205 + 17 ≈ 237 ms.
		PrefillBase:     15 * time.Millisecond,
		PrefillPerToken: msf(0.05),
		PrefillQuadMS:   2e-6,
		// ref §5.1: SGLang's default chunked_prefill_size on H100.
		ChunkedPrefillSize: 8192,
		// ref §5.3: d0 7 ms (16 GB of weights at 3.35 TB/s ≈ 4.8 ms plus
		// fixed overhead), d_req 0.02 ms, d_kv 0.08 ms per 1k context
		// tokens (≈2× the 128 KB/token roofline). 64 × 2k: ≈ 17 ms.
		DecodeBase:     7 * time.Millisecond,
		DecodePerReq:   msf(0.02),
		DecodePer1KCtx: msf(0.08),
		// ref §5.7: KV 400k tokens, max running 256.
		MaxTotalTokens:     400000,
		MaxRunningRequests: 256,
		DPSize:             1,
		DPAttention:        false,
		// ref §5.6: Llama-3-8B KV ≈ 128 KB/token (FP16); IB NDR ≈ 40 GB/s
		// effective; RDMA setup 0.5-2 ms (1 ms taken).
		KVBytesPerToken: 128 << 10,
		KVTransferGBps:  40,
		KVTransferSetup: time.Millisecond,
		// Assumption: 16-token blocks (vLLM's default block size; SGLang
		// caches per token, the coarser grain only loses < 16 tokens).
		BlockSize: 16,
	},
	// DeepSeek-V3-class MoE, one H100 node, DP8 with DP attention
	// (lockstep). ref §5.7 row dsv3-dp8-h100-node.
	"dsv3-dp8-h100-node": {
		Name:        "dsv3-dp8-h100-node",
		Description: "DeepSeek-V3-class MoE on one 8×H100 node, DP8 attention (lockstep ranks)",
		// ref §5.2: c0 ≈ 30 ms, c1 ≈ 0.16 ms/token per rank (SGLang
		// large-scale EP blog: 50,302 tok/s per node ≈ 6.3k tok/s per
		// rank). c2 is an assumption (the dense value; not given).
		PrefillBase:     30 * time.Millisecond,
		PrefillPerToken: msf(0.16),
		PrefillQuadMS:   2e-6,
		// ref §5.1/§5.5: 8192 / dp_size 8 under DP attention.
		ChunkedPrefillSize: 1024,
		// ref §5.3: d0 ≈ 25 ms, d_kv ≈ 0.1 ms per 1k context, and d_req
		// chosen so that 256 requests × 2k context ≈ 90 ms per step
		// (EP blog: 22,282 tok/s per node): 25 + 256·d_req + 51.2 = 90
		// gives d_req ≈ 0.054 ms.
		DecodeBase:     25 * time.Millisecond,
		DecodePerReq:   msf(0.054),
		DecodePer1KCtx: msf(0.1),
		// ref §5.7: KV ~150k tokens per rank (an assumption of the note);
		// max running 32-128 per rank: 128 taken.
		MaxTotalTokens:     150000,
		MaxRunningRequests: 128,
		DPSize:             8,
		DPAttention:        true,
		// ref §5.6: MLA (512+64) × 61 layers × 2 bytes (BF16) ≈ 70 KB per
		// token; 40 GB/s and 1 ms setup as for the dense profile.
		KVBytesPerToken: (512 + 64) * 61 * 2,
		KVTransferGBps:  40,
		KVTransferSetup: time.Millisecond,
		BlockSize:       16,
	},
}

// ProfileNames lists the built-in profiles, sorted.
func ProfileNames() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// LookupProfile returns the built-in profile called name.
func LookupProfile(name string) (Profile, error) {
	p, ok := profiles[name]
	if !ok {
		return Profile{}, fmt.Errorf("unknown profile %q: want one of %s", name, strings.Join(ProfileNames(), ", "))
	}
	return p, nil
}

// prefillStepTime is the model time of one prefill step of a rank: c0 +
// c1·ΣT + c2·ΣT·(P + T/2) over the chunks (T new tokens on top of P).
func (p *Profile) prefillStepTime(chunks []prefillChunk) time.Duration {
	if len(chunks) == 0 {
		return 0
	}
	var tokens int
	var quad float64
	for _, c := range chunks {
		tokens += c.tokens
		quad += float64(c.tokens) * (float64(c.before) + float64(c.tokens)/2)
	}
	return p.PrefillBase + time.Duration(tokens)*p.PrefillPerToken + msf(p.PrefillQuadMS*quad)
}

// decodeStepTime is the model time of one decode step of a rank with n
// running requests whose contexts sum to ctxTokens: d0 + d_req·n +
// d_kv·ctx/1000.
func (p *Profile) decodeStepTime(n, ctxTokens int) time.Duration {
	if n == 0 {
		return 0
	}
	return p.DecodeBase + time.Duration(n)*p.DecodePerReq +
		time.Duration(float64(p.DecodePer1KCtx)*float64(ctxTokens)/1000)
}

// transferTime is the model time to send the KV of tokens to decode.
func (p *Profile) transferTime(tokens int, gbps float64) time.Duration {
	if gbps <= 0 {
		return p.KVTransferSetup
	}
	secs := float64(tokens) * float64(p.KVBytesPerToken) / (gbps * 1e9)
	return p.KVTransferSetup + time.Duration(secs*float64(time.Second))
}
