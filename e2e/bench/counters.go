package bench

import (
	"context"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/duet-router/duet/e2e/harness"
)

// Prefix-cache counters an engine may export on /metrics: prompt tokens
// looked up and prompt tokens found cached (SGLang's names first, then
// vLLM's with and without the _total suffix).
var (
	promptCounters = []string{"sglang:prompt_tokens_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"}
	cachedCounters = []string{"sglang:cached_tokens_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"}
)

// ReadCounters sums the prefix-cache counters of the engines at urls
// (base URLs). ok is false when an engine exports no such pair.
func ReadCounters(ctx context.Context, client *http.Client, urls []string) (c CounterDelta, ok bool, err error) {
	for _, u := range urls {
		families, err := harness.ScrapeMetrics(ctx, client, u+"/metrics")
		if err != nil {
			return c, false, err
		}
		prompt, pok := sumFirst(families, promptCounters)
		cached, cok := sumFirst(families, cachedCounters)
		if !pok || !cok {
			return c, false, nil
		}
		c.Prompt += prompt
		c.Cached += cached
	}
	return c, len(urls) > 0, nil
}

// Sub returns c - before.
func (c CounterDelta) Sub(before CounterDelta) CounterDelta {
	return CounterDelta{Prompt: c.Prompt - before.Prompt, Cached: c.Cached - before.Cached}
}

// sumFirst sums every series of the first family in names that exists.
// The text parser names a counter family without its _total suffix when
// the exposition declares it so; both spellings are tried.
func sumFirst(families map[string]*dto.MetricFamily, names []string) (float64, bool) {
	for _, n := range names {
		for _, name := range []string{n, strings.TrimSuffix(n, "_total")} {
			f, ok := families[name]
			if !ok {
				continue
			}
			sum := 0.0
			for _, m := range f.GetMetric() {
				switch {
				case m.GetCounter() != nil:
					sum += m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					sum += m.GetGauge().GetValue()
				case m.GetUntyped() != nil:
					sum += m.GetUntyped().GetValue()
				}
			}
			return sum, true
		}
	}
	return 0, false
}
