package scheduler

import (
	"math"
	"sync"
)

// Token-estimate defaults.
const (
	defaultCharsPerToken = 4.0
	minCharsPerToken     = 1.0
	maxCharsPerToken     = 12.0
	// estimateWeight is the weight of one observation in the running
	// chars-per-token average (an exponentially weighted mean).
	estimateWeight = 0.1
	// maxModels bounds the per-model table: past it, unknown models share
	// the default ratio (client-chosen model names must not grow memory).
	maxModels = 256
)

// TokenEstimator turns prompt sizes into token counts without a tokenizer:
// bytes divided by a characters-per-token ratio kept per model, corrected
// online from the prompt_tokens the engines report. Safe for concurrent use.
type TokenEstimator struct {
	mu       sync.Mutex
	initial  float64
	perModel map[string]float64
}

// NewTokenEstimator returns an estimator that starts every model at
// charsPerToken (default 4 when <= 0).
func NewTokenEstimator(charsPerToken float64) *TokenEstimator {
	if charsPerToken <= 0 || math.IsNaN(charsPerToken) {
		charsPerToken = defaultCharsPerToken
	}
	return &TokenEstimator{initial: clampRatio(charsPerToken), perModel: map[string]float64{}}
}

// Estimate returns the estimated number of tokens in a prompt of n bytes
// for model; at least 1.
func (e *TokenEstimator) Estimate(model string, n int) int64 {
	ratio := e.Ratio(model)
	return max(1, int64(math.Ceil(float64(n)/ratio)))
}

// Ratio returns the current characters-per-token ratio of model.
func (e *TokenEstimator) Ratio(model string) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r, ok := e.perModel[model]; ok {
		return r
	}
	return e.initial
}

// Observe corrects model's ratio with a prompt of n bytes that the engine
// counted as tokens tokens. Nonsense observations are ignored.
func (e *TokenEstimator) Observe(model string, n int, tokens int64) {
	if n <= 0 || tokens <= 0 {
		return
	}
	sample := clampRatio(float64(n) / float64(tokens))
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.perModel[model]
	if !ok {
		if len(e.perModel) >= maxModels {
			return
		}
		r = e.initial
	}
	e.perModel[model] = r + estimateWeight*(sample-r)
}

func clampRatio(r float64) float64 {
	return min(max(r, minCharsPerToken), maxCharsPerToken)
}
