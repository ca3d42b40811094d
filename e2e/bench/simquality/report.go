package main

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/e2e/bench/ci"
	"github.com/duet-router/duet/e2e/bench/ciplot"
	"github.com/duet-router/duet/e2e/clustersim"
)

// report is the whole matrix's outcome (quality.json).
type report struct {
	Options   optionsReport    `json:"options"`
	Scenarios []scenarioReport `json:"scenarios"`
	// DecodeCache marks the decode radix cache comparison (-decode-cache).
	DecodeCache bool `json:"decode_cache,omitempty"`
	// KVEvents marks the KV events comparison (-kv-events).
	KVEvents bool `json:"kv_events,omitempty"`
}

// optionsReport records the settings.
type optionsReport struct {
	Seeds       int    `json:"seeds"`
	Window      string `json:"window"`
	Warmup      string `json:"warmup"`
	SLOTTFTP99  string `json:"slo_ttft_p99"`
	SLOTPOTMean string `json:"slo_tpot_mean"`
	Resamples   int    `json:"resamples"`
}

// scenarioReport is one scenario's outcome.
type scenarioReport struct {
	Name        string          `json:"name"`
	Title       string          `json:"title"`
	Workload    string          `json:"workload"`
	Cluster     string          `json:"cluster"`
	Profile     string          `json:"profile"`
	SearchGrid  string          `json:"goodput_grid,omitempty"`
	Rate        float64         `json:"rate"`         // sessions/s of the comparison
	RequestRate float64         `json:"request_rate"` // mean requests/s of the comparison
	Routings    []routingReport `json:"routings"`
}

// routingReport is one routing's outcome in a scenario: per-seed summaries
// and their intervals (medians over seeds; ratios paired by seed with the
// first routing, engine_default).
type routingReport struct {
	Name           string               `json:"name"`
	GoodputPerSeed []float64            `json:"goodput_per_seed,omitempty"`
	Seeds          []clustersim.Summary `json:"seeds"`

	Goodput, GoodputRatio         ci.Interval `json:"-"`
	TTFTMean, TTFTMeanRatio       ci.Interval `json:"-"`
	TTFTP99, TTFTP99Ratio         ci.Interval `json:"-"`
	TPOTMean, HitRate, HitOfBound ci.Interval `json:"-"`
	PrefillShare, DecodeImbalance ci.Interval `json:"-"`
	// DecodeHitRate and DecodeHitOfBound are the decode radix caches'
	// (N = 0 where the scenario's decode engines have none).
	DecodeHitRate, DecodeHitOfBound ci.Interval `json:"-"`
	// TPOTMeanRatio is paired with the first routing, like the TTFT ratios.
	TPOTMeanRatio ci.Interval `json:"-"`
	Failed        int         `json:"-"`
}

// decodeCaches reports whether the scenario's decode engines cache
// prefixes (some seed has a decode hit bound).
func (sr *scenarioReport) decodeCaches() bool {
	for _, rr := range sr.Routings {
		for _, s := range rr.Seeds {
			if s.DecodeHitBound > 0 {
				return true
			}
		}
	}
	return false
}

// analyze computes every routing's intervals.
func (sr *scenarioReport) analyze(resamples int) {
	median := func(xs []float64) ci.Interval {
		iv, _ := ci.Median(xs, resamples, 1)
		return iv
	}
	ratio := func(x, b []float64) ci.Interval {
		iv, _ := ci.PairedRatio(x, b, resamples, 1)
		return iv
	}
	ttftMean := func(s clustersim.Summary) float64 { return s.TTFTMean }
	ttftP99 := func(s clustersim.Summary) float64 { return s.TTFTP99 }
	hit := func(s clustersim.Summary) float64 { return s.HitRate }
	base := &sr.Routings[0]
	for i := range sr.Routings {
		rr := &sr.Routings[i]
		get := func(f func(clustersim.Summary) float64) []float64 { return values(rr.Seeds, f) }
		if rr.GoodputPerSeed != nil {
			rr.Goodput = median(rr.GoodputPerSeed)
			rr.GoodputRatio = ratio(rr.GoodputPerSeed, base.GoodputPerSeed)
		}
		rr.TTFTMean = median(get(ttftMean))
		rr.TTFTMeanRatio = ratio(get(ttftMean), values(base.Seeds, ttftMean))
		rr.TTFTP99 = median(get(ttftP99))
		rr.TTFTP99Ratio = ratio(get(ttftP99), values(base.Seeds, ttftP99))
		tpot := func(s clustersim.Summary) float64 { return s.TPOTMean }
		rr.TPOTMean = median(get(tpot))
		rr.TPOTMeanRatio = ratio(get(tpot), values(base.Seeds, tpot))
		rr.HitRate = median(get(hit))
		if bound := get(func(s clustersim.Summary) float64 { return s.HitBound }); bound[0] > 0 {
			rr.HitOfBound = ratio(get(hit), bound)
		}
		if sr.decodeCaches() {
			decodeHit := get(func(s clustersim.Summary) float64 { return s.DecodeHitRate })
			rr.DecodeHitRate = median(decodeHit)
			rr.DecodeHitOfBound = ratio(decodeHit, get(func(s clustersim.Summary) float64 { return s.DecodeHitBound }))
		}
		rr.PrefillShare = median(get(func(s clustersim.Summary) float64 { return s.PrefillShareImbalance }))
		rr.DecodeImbalance = median(get(func(s clustersim.Summary) float64 { return s.DecodeImbalance }))
		for _, s := range rr.Seeds {
			rr.Failed += s.Failed
		}
	}
}

// values returns f of each summary.
func values(seeds []clustersim.Summary, f func(clustersim.Summary) float64) []float64 {
	out := make([]float64, len(seeds))
	for i, s := range seeds {
		out[i] = f(s)
	}
	return out
}

// markdown renders the report.
func (rep *report) markdown(plots []plotRef) string {
	var b strings.Builder
	o := rep.Options
	if rep.KVEvents {
		b.WriteString("# KV events: the engines' word on their caches against duet's estimate (simulated)\n\n")
		b.WriteString("Generated by `go run ./e2e/bench/simquality -kv-events -out docs/benchmarks/kv-events`, the deterministic cluster simulator (package `e2e/clustersim`); see [../kv-events.md](../kv-events.md) for what it shows and [../README.md](../README.md#simulated-routing-quality-make-bench-sim) for the method. Every routing runs duet's default policy (`least_cost`); they differ in what the scheduler knows of the caches: `duet_default` its estimate on text blocks (today, without a tokenizer; the ratios are to it), `+tokens` its estimate on token ids (with a tokenizer), `+events` the engines' KV events through `kvevents.Tracker` delivered at once, `+events50`/`+events200` after 50/200 ms, `+oracleview` the engine model's true caches at each pick (the ceiling); `+r4` runs four replicas that share nothing, each following every engine's events. Equal flags give byte-identical output.\n\n")
	} else if rep.DecodeCache {
		b.WriteString("# Decode radix cache: duet's decode price against decode by load (simulated)\n\n")
		fmt.Fprintf(&b, "Generated by `go run ./e2e/bench/simquality -decode-cache -out docs/benchmarks/decode-cache`, the deterministic cluster simulator (package `e2e/clustersim`) with SGLang's decode radix cache in duet-sim's engine model; see [../decode-cache.md](../decode-cache.md) for what it shows and [../README.md](../README.md#simulated-routing-quality-make-bench-sim) for the method. Ratios in these tables are to the first routing of each scenario, `least_cost_decode_by_load` (least_cost with `ignore_decode_cache: true`, the decode price before this change). Equal flags give byte-identical output.\n\n")
	} else {
		b.WriteString("# Routing quality: duet policies vs the engine default (simulated)\n\n")
		fmt.Fprintf(&b, "Generated by `make bench-sim` (`go run ./e2e/bench/simquality`), the deterministic cluster simulator (package `e2e/clustersim`): duet's real scheduler against duet-sim's engine model in virtual time; see [README.md](README.md#simulated-routing-quality-make-bench-sim) for the method. Equal flags give byte-identical output.\n\n")
	}
	fmt.Fprintf(&b, "- %d seeds per case; each run has a %s arrival window (model time), the first %s excluded as warm-up, then up to 2m of drain.\n", o.Seeds, o.Window, o.Warmup)
	base := "`engine_default`"
	if rep.KVEvents {
		base = "each scenario's first routing"
	}
	fmt.Fprintf(&b, "- Figures are the **median over seeds** with a **95%% bootstrap interval** (%d resamples). Ratios are to %s, paired by seed (same arrivals and prompts); an interval that contains 1.0 is reported as **no difference**.\n", o.Resamples, base)
	fmt.Fprintf(&b, "- **Goodput at SLO**: the highest arrival rate on the scenario's grid at which every measured request is served, p99 TTFT ≤ %s and mean TPOT ≤ %s, found per routing and seed by bisection.\n", o.SLOTTFTP99, o.SLOTPOTMean)
	b.WriteString("- `duet_default` is duet's shipped configuration (`least_cost` on both roles, `load.prefill_accounting: in_flight`); `+covered` is the same with `load.prefill_accounting: covered`, `+fullindex` with the prefix index bounded by `prefix.max_blocks_per_target` alone; `cache_aware/least_tokens` is the default before `least_cost` (prefill `cache_aware`, decode `least_tokens`); `cache_aware`, `least_tokens`, `round_robin` use that policy for both roles; a name `a/b` uses `a` on prefill and `b` on decode; `smg_cache_aware`, `smg_dp_min_tokens`, `dynamo_kv` and `llmd_epp` are the peers' rules ported from their source ([peers.md](peers.md)); `engine_default` lets the engines pick ranks (random bootstrap room on prefill, round robin on decode); `oracle_load` routes every leg to the rank with the least true pending work (see README.md).\n")
	b.WriteString("- **Hit rate of bound**: the hit rate divided by the hit rate a cache holding every earlier prompt on every rank would reach (no routing can do better), per seed.\n")
	b.WriteString("- Imbalance: `prefill share` is max/mean over prefill ranks of the prompt tokens each computed; `decode` is the time average of max/mean over decode ranks of the KV in use. 1 is perfect.\n\n")
	b.WriteString("## Headline\n\n")
	for _, sr := range rep.Scenarios {
		if sr.SearchGrid == "" {
			continue
		}
		fmt.Fprintf(&b, "**%s** (%s). Goodput searched on %s; comparison at %g sessions/s (%.1f requests/s), 80%% of the engine default's median goodput.\n\n", sr.Title, sr.Cluster, sr.SearchGrid, sr.Rate, sr.RequestRate)
		b.WriteString("| routing | goodput (sessions/s) | × engine default | verdict | TTFT mean × | verdict | TTFT p99 × | verdict | hit rate | of bound | decode imbalance |\n|---|---:|---:|---|---:|---|---:|---|---:|---:|---:|\n")
		for _, rr := range sr.Routings {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", rr.Name,
				ci.FormatValue(rr.Goodput, 2), ci.FormatRatio(rr.GoodputRatio, 2), verdict(rr, rr.GoodputRatio, false),
				ci.FormatRatio(rr.TTFTMeanRatio, 2), verdict(rr, rr.TTFTMeanRatio, true),
				ci.FormatRatio(rr.TTFTP99Ratio, 2), verdict(rr, rr.TTFTP99Ratio, true),
				pct(rr.HitRate), ci.FormatRatio(rr.HitOfBound, 2), ci.FormatValue(rr.DecodeImbalance, 2))
		}
		b.WriteString("\n")
	}
	for _, p := range plots {
		fmt.Fprintf(&b, "![%s](%s)\n\n", p.caption, p.file)
	}
	for _, sr := range rep.Scenarios {
		fmt.Fprintf(&b, "## %s\n\n%s; profile `%s`; %g sessions/s (%.1f requests/s).\n\n", sr.Title, sr.Cluster, sr.Profile, sr.Rate, sr.RequestRate)
		if sr.decodeCaches() || rep.KVEvents {
			b.WriteString(decodeCacheTable(sr))
			continue
		}
		b.WriteString("| routing | TTFT mean (ms) | × engine default | TTFT p99 (ms) | × engine default | TPOT mean (ms) | hit rate | of bound | prefill share imbalance | decode imbalance | failed |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, rr := range sr.Routings {
			fmt.Fprintf(&b, "| %s | %s | %s %s | %s | %s %s | %s | %s | %s | %s | %s | %d |\n", rr.Name,
				ci.FormatValue(rr.TTFTMean, 0), ci.FormatRatio(rr.TTFTMeanRatio, 2), mark(rr, rr.TTFTMeanRatio),
				ci.FormatValue(rr.TTFTP99, 0), ci.FormatRatio(rr.TTFTP99Ratio, 2), mark(rr, rr.TTFTP99Ratio),
				ci.FormatValue(rr.TPOTMean, 1), pct(rr.HitRate), ci.FormatRatio(rr.HitOfBound, 2),
				ci.FormatValue(rr.PrefillShare, 2), ci.FormatValue(rr.DecodeImbalance, 2), rr.Failed)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// decodeCacheTable is a scenario's table where decode engines run a decode
// radix cache: the usual columns and the decode caches' hit rate, of the
// prompt's tokens, with its share of the bound (a decode cache holding
// every earlier prompt and answer).
func decodeCacheTable(sr scenarioReport) string {
	var b strings.Builder
	base := "`" + sr.Routings[0].Name + "`"
	fmt.Fprintf(&b, "| routing | TTFT mean (ms) | × %s | TTFT p99 (ms) | × %s | TPOT mean (ms) | × %s | prefill hit rate | of bound | decode hit rate | of bound | decode imbalance | failed |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", base, base, base)
	for _, rr := range sr.Routings {
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s | %s %s | %s | %s %s | %s | %s | %s | %s | %s | %d |\n", rr.Name,
			ci.FormatValue(rr.TTFTMean, 0), ci.FormatRatio(rr.TTFTMeanRatio, 2), mark(rr, rr.TTFTMeanRatio),
			ci.FormatValue(rr.TTFTP99, 0), ci.FormatRatio(rr.TTFTP99Ratio, 2), mark(rr, rr.TTFTP99Ratio),
			ci.FormatValue(rr.TPOTMean, 1), ci.FormatRatio(rr.TPOTMeanRatio, 2), mark(rr, rr.TPOTMeanRatio),
			pct(rr.HitRate), ci.FormatRatio(rr.HitOfBound, 2),
			pct(rr.DecodeHitRate), ci.FormatRatio(rr.DecodeHitOfBound, 2),
			ci.FormatValue(rr.DecodeImbalance, 2), rr.Failed)
	}
	b.WriteString("\n")
	return b.String()
}

// verdict is the reading of a ratio interval; the baseline has none.
func verdict(rr routingReport, iv ci.Interval, lowerIsBetter bool) string {
	if rr.Name == bench.PolicyEngineDefault {
		return ""
	}
	return ci.RatioVerdict(iv, lowerIsBetter)
}

// mark flags a TTFT ratio: ✓ better, ✗ worse, = no difference.
func mark(rr routingReport, iv ci.Interval) string {
	switch verdict(rr, iv, true) {
	case ci.Better:
		return "✓"
	case ci.Worse:
		return "✗"
	case ci.NoDifference:
		return "="
	}
	return ""
}

// pct renders a hit-rate interval in percent.
func pct(iv ci.Interval) string {
	if iv.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%% [%.1f, %.1f]", 100*iv.Median, 100*iv.Lo, 100*iv.Hi)
}

// plotRef is a written plot.
type plotRef struct{ caption, file string }

// plot draws the ratio and goodput plots.
func (rep *report) plot(dir string) ([]plotRef, error) {
	var refs []plotRef
	var headlines []scenarioReport
	for _, sr := range rep.Scenarios {
		if sr.SearchGrid != "" {
			headlines = append(headlines, sr)
		}
	}
	if len(headlines) > 0 {
		file := "quality-goodput.png"
		groups, series := seriesOf(headlines, false, func(rr routingReport) ci.Interval { return rr.Goodput })
		if err := ciplot.Values(filepath.Join(dir, file), "Goodput at SLO (sessions/s)", "sessions/s", groups, series); err != nil {
			return nil, fmt.Errorf("plot %s: %w", file, err)
		}
		refs = append(refs, plotRef{"Goodput at SLO per routing (median and 95% interval over seeds)", file})
	}
	for _, p := range []struct {
		file, caption, title string
		get                  func(routingReport) ci.Interval
	}{
		{"quality-ttft-mean.png", "Mean TTFT relative to engine_default, per scenario (median and 95% interval over seeds)", "Mean TTFT × engine default (below 1 is better)", func(rr routingReport) ci.Interval { return rr.TTFTMeanRatio }},
		{"quality-ttft-p99.png", "p99 TTFT relative to engine_default, per scenario", "p99 TTFT × engine default (below 1 is better)", func(rr routingReport) ci.Interval { return rr.TTFTP99Ratio }},
	} {
		groups, series := seriesOf(rep.Scenarios, true, p.get)
		if err := ciplot.Ratios(filepath.Join(dir, p.file), p.title, "ratio", groups, series); err != nil {
			return nil, fmt.Errorf("plot %s: %w", p.file, err)
		}
		refs = append(refs, plotRef{p.caption, p.file})
	}
	return refs, nil
}

// seriesOf returns one group per scenario and one series per routing (in
// the order routings first appear; engine_default left out with
// skipBaseline), each point get of that routing in that scenario. Points
// that are not finite are left without data.
func seriesOf(scs []scenarioReport, skipBaseline bool, get func(routingReport) ci.Interval) ([]string, []ciplot.Series) {
	groups := make([]string, len(scs))
	index := map[string]int{}
	var series []ciplot.Series
	for g, sr := range scs {
		groups[g] = sr.Name
		for _, rr := range sr.Routings {
			if skipBaseline && rr.Name == bench.PolicyEngineDefault {
				continue
			}
			i, ok := index[rr.Name]
			if !ok {
				i = len(series)
				index[rr.Name] = i
				series = append(series, ciplot.Series{Name: rr.Name, Points: make([]ci.Interval, len(scs))})
			}
			if iv := get(rr); !math.IsInf(iv.Hi, 0) && !math.IsNaN(iv.Hi) {
				series[i].Points[g] = iv
			}
		}
	}
	return groups, series
}
