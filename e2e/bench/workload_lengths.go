package bench

import (
	"math"
	"math/rand/v2"
	"time"
)

// The heavy_tail defaults are lognormals fitted to the ShareGPT length
// statistics of Sarathi-Serve (Agrawal et al., "Taming Throughput-Latency
// Tradeoff in LLM Inference with Sarathi-Serve", OSDI 2024,
// arXiv:2403.02310), Table 2, dataset openchat_sharegpt4 (multi-turn
// ShareGPT chats, each prompt holding the conversation so far):
//
//	prompt tokens: median 1730, P90 5696
//	output tokens: median 415,  P90 834
//
// A lognormal's median is e^mu and its P90 is e^(mu + z90·sigma), with
// z90 = Φ⁻¹(0.9) ≈ 1.28155, so mu = ln(median) and sigma =
// ln(P90/median)/z90:
//
//	prompt: mu = ln 1730 ≈ 7.4559, sigma = ln(5696/1730)/z90 ≈ 0.9298
//	output: mu = ln 415  ≈ 6.0283, sigma = ln(834/415)/z90   ≈ 0.5446
//
// (unclamped means e^(mu+sigma²/2) ≈ 2666 and 481 tokens). The fit uses a
// median and a P90 from one table because no source at hand gives a mean
// and a median of the same ShareGPT slice: DistServe (arXiv:2401.09670)
// gives means only (755 prompt and 200 output tokens), as does the
// LMSYS-Chat-1M paper (arXiv:2309.11998: 69.5 tokens a user message and
// 214.5 a response, without the history a served prompt carries); mixing
// one source's mean with another's median gives a mean below the median,
// which no lognormal has. The served prompts (with history) of
// openchat_sharegpt4 are also what a router sees.
const (
	shareGPTPromptP50 = 1730
	shareGPTPromptP90 = 5696
	shareGPTOutputP50 = 415
	shareGPTOutputP90 = 834
	// z90 is the standard normal's 0.9 quantile.
	z90 = 1.2815515655446004
)

// HeavyTailParams shape the heavy-tail workload: independent requests whose
// prompt and output lengths are drawn independently from lognormals (the
// source publishes no correlation), rounded to whole tokens and clamped to
// Prompt and Output. Clamping moves the rare draws beyond a bound onto it:
// SGLang rejects a prompt that does not fit its context, so the tail must
// stop somewhere. Zero fields take the ShareGPT fit above.
type HeavyTailParams struct {
	// PromptMu and PromptSigma are the prompt length's lognormal
	// parameters: median e^PromptMu tokens (default ln 1730 ≈ 7.456,
	// sigma ≈ 0.930).
	PromptMu, PromptSigma float64
	// OutputMu and OutputSigma are the output length's (max_tokens)
	// lognormal parameters (default ln 415 ≈ 6.028, sigma ≈ 0.545).
	OutputMu, OutputSigma float64
	// Prompt and Output are the clamps (default 16-16000 and 8-2048
	// tokens). With the defaults about 0.8% of prompts and 0.2% of outputs
	// land on the upper clamp; a clamped prompt plus its output (18,048
	// tokens) fits the KV cache of one rank of either simulator profile.
	Prompt, Output IntRange
}

// withDefaults fills zero fields.
func (p HeavyTailParams) withDefaults() HeavyTailParams {
	if p.PromptMu == 0 {
		p.PromptMu = math.Log(shareGPTPromptP50)
	}
	if p.PromptSigma == 0 {
		p.PromptSigma = math.Log(float64(shareGPTPromptP90)/shareGPTPromptP50) / z90
	}
	if p.OutputMu == 0 {
		p.OutputMu = math.Log(shareGPTOutputP50)
	}
	if p.OutputSigma == 0 {
		p.OutputSigma = math.Log(float64(shareGPTOutputP90)/shareGPTOutputP50) / z90
	}
	if p.Prompt == (IntRange{}) {
		p.Prompt = IntRange{16, 16000}
	}
	if p.Output == (IntRange{}) {
		p.Output = IntRange{8, 2048}
	}
	return p
}

// heavyTailSession is one independent request of lognormal lengths.
func heavyTailSession(rng *rand.Rand, id int, at time.Duration, p HeavyTailParams) Session {
	prompt := lognormalTokens(rng, p.PromptMu, p.PromptSigma, p.Prompt)
	out := lognormalTokens(rng, p.OutputMu, p.OutputSigma, p.Output)
	return Session{ID: id, Start: at, Turns: []Turn{{
		User: Text(rng, prompt), PromptTokens: prompt, OutputTokens: out,
	}}}
}

// lognormalTokens draws e^(mu + sigma·Z), Z standard normal, rounded to
// whole tokens and clamped to r.
func lognormalTokens(rng *rand.Rand, mu, sigma float64, r IntRange) int {
	x := math.Round(math.Exp(mu + sigma*rng.NormFloat64()))
	lo, hi := float64(r.Min), float64(max(r.Max, r.Min))
	return int(math.Min(math.Max(x, lo), hi))
}

// clampedLognormalMean is the mean of a lognormal(mu, sigma) clamped to r:
//
//	lo·Φ(a) + hi·(1 − Φ(b)) + e^(mu+sigma²/2)·(Φ(b − sigma) − Φ(a − sigma))
//
// with a = (ln lo − mu)/sigma and b = (ln hi − mu)/sigma: the two clamped
// masses plus the partial expectation between the bounds. Rounding draws to
// whole tokens moves the mean by far less than a token and is ignored.
func clampedLognormalMean(mu, sigma float64, r IntRange) float64 {
	lo, hi := float64(r.Min), float64(max(r.Max, r.Min))
	if sigma <= 0 {
		return math.Min(math.Max(math.Exp(mu), lo), hi)
	}
	a := math.Inf(-1)
	if lo > 0 {
		a = (math.Log(lo) - mu) / sigma
	}
	b := (math.Log(hi) - mu) / sigma
	middle := math.Exp(mu+sigma*sigma/2) * (normalCDF(b-sigma) - normalCDF(a-sigma))
	return lo*normalCDF(a) + hi*(1-normalCDF(b)) + middle
}

// normalCDF is the standard normal distribution function Φ.
func normalCDF(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }
