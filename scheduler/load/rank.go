package load

import (
	"math"
	"slices"
	"time"
)

// Sources of a [Report], as found in [Report.Source].
const (
	// SourceLoads means the report came from SGLang's GET /v1/loads.
	SourceLoads = "v1_loads"
	// SourceMetricsSGLang means the report came from SGLang's GET /metrics.
	SourceMetricsSGLang = "metrics_sglang"
	// SourceMetricsVLLM means the report came from vLLM's GET /metrics.
	SourceMetricsVLLM = "metrics_vllm"
)

// Limits applied to values read from the wire.
const (
	// maxRank bounds the DP rank accepted from an engine; larger ranks are
	// skipped (the scheduler accepts DP sizes up to 4096).
	maxRank = 4095
	// maxTokens caps token counts, low enough that sums cannot overflow
	// and exactly representable as a float64.
	maxTokens = int64(1) << 53
	// maxCount caps request counts, so that they fit an int everywhere.
	maxCount = math.MaxInt32
)

// Rank is one DP rank's load as the engine reported it.
type Rank struct {
	Rank           int     // DP rank; engines without DP report a single rank 0
	UsedTokens     int64   // tokens held in KV (num_used_tokens)
	TotalTokens    int64   // used + pending prefill tokens (num_total_tokens); equals UsedTokens when the engine does not report it
	MaxTotalTokens int64   // KV capacity (max_total_num_tokens); 0 unknown
	Running        int     // running requests
	Waiting        int     // queued requests
	KVUsage        float64 // 0..1 (token_usage / kv_cache_usage_perc)
	HasTokens      bool    // token counts are absolute numbers (SGLang); false for vLLM, which only reports a usage ratio
}

// Report is one scrape of one engine.
type Report struct {
	Ranks      []Rank    // sorted by Rank, one entry per rank
	Source     string    // "v1_loads", "metrics_sglang" or "metrics_vllm"
	StartedAt  time.Time // when the HTTP request was sent (reservations made before this, plus a margin, are covered)
	FinishedAt time.Time
}

// accum gathers everything reported for one rank before it becomes a Rank.
type accum struct {
	r        Rank
	hasTotal bool // some entry reported TotalTokens
	hasUsage bool // some entry reported KVUsage
}

// addUsed adds used tokens and marks the counts as absolute.
func (a *accum) addUsed(n int64) {
	a.r.UsedTokens = addTokens(a.r.UsedTokens, n)
	a.r.HasTokens = true
}

// addTotal adds used-plus-pending tokens.
func (a *accum) addTotal(n int64) {
	a.r.TotalTokens = addTokens(a.r.TotalTokens, n)
	a.hasTotal = true
}

// setMax records a KV capacity; of several, the largest wins.
func (a *accum) setMax(n int64) { a.r.MaxTotalTokens = max(a.r.MaxTotalTokens, n) }

// addRunning adds running requests.
func (a *accum) addRunning(n int) { a.r.Running = addCount(a.r.Running, n) }

// addWaiting adds queued requests.
func (a *accum) addWaiting(n int) { a.r.Waiting = addCount(a.r.Waiting, n) }

// setUsage records a usage ratio; of several, the largest wins.
func (a *accum) setUsage(u float64) {
	a.r.KVUsage = max(a.r.KVUsage, u)
	a.hasUsage = true
}

// rankSet merges entries by rank.
type rankSet map[int]*accum

// get returns the accumulator for rank, creating it.
func (s rankSet) get(rank int) *accum {
	a, ok := s[rank]
	if !ok {
		a = &accum{r: Rank{Rank: rank}}
		s[rank] = a
	}
	return a
}

// ranks finishes every accumulated rank and returns them sorted by rank.
// TotalTokens is raised to at least UsedTokens, and when no usage ratio was
// reported it is computed from the token counts if the capacity is known.
func (s rankSet) ranks() []Rank {
	out := make([]Rank, 0, len(s))
	for _, a := range s {
		r := a.r
		if !a.hasTotal || r.TotalTokens < r.UsedTokens {
			r.TotalTokens = r.UsedTokens
		}
		if !a.hasUsage && r.HasTokens && r.MaxTotalTokens > 0 {
			r.KVUsage = ratio(float64(r.UsedTokens) / float64(r.MaxTotalTokens))
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Rank) int { return a.Rank - b.Rank })
	return out
}

// tokens converts a reported token count: NaN and negatives become 0,
// fractions are truncated and huge values are capped at maxTokens.
func tokens(f float64) int64 {
	if !(f > 0) { // also catches NaN
		return 0
	}
	if f >= float64(maxTokens) {
		return maxTokens
	}
	return int64(f)
}

// count converts a reported request count like tokens, capped at maxCount.
func count(f float64) int {
	if !(f > 0) {
		return 0
	}
	if f >= maxCount {
		return maxCount
	}
	return int(f)
}

// ratio clamps a reported usage ratio to 0..1; NaN becomes 0.
func ratio(f float64) float64 {
	if !(f > 0) {
		return 0
	}
	return min(f, 1)
}

// rankNumber converts a reported rank; ok is false unless it is a whole
// number in 0..maxRank.
func rankNumber(f float64) (int, bool) {
	if !(f >= 0) || f > maxRank || f != math.Trunc(f) {
		return 0, false
	}
	return int(f), true
}

// addTokens adds two token counts, saturating at maxTokens.
func addTokens(a, b int64) int64 { return min(a+b, maxTokens) }

// addCount adds two request counts, saturating at maxCount.
func addCount(a, b int) int {
	if a > maxCount-b {
		return maxCount
	}
	return a + b
}
