package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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
		families, err := scrapeMetrics(ctx, client, u+"/metrics")
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

// scrapeMetrics reads and parses a Prometheus text exposition.
func scrapeMetrics(ctx context.Context, client *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return families, nil
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
