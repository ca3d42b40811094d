package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/e2e/clustersim"
	"github.com/duet-router/duet/e2e/sim"
)

// crossCase is what -crosscheck simulates: one real-path case of make
// bench-quality (spec is workload:rate, e.g. variable:8) for each routing
// of policies, over seeds seeds from seed, on 2 prefill and 2 decode
// engines of dp ranks each; parts adds the TTFT split
// (clustersim.TTFTParts).
type crossCase struct {
	spec, policies string
	window         time.Duration
	seed           uint64
	seeds, dp      int
	parts          bool
}

// crossCheck simulates the cases of one real-path run (make bench-quality:
// 2 prefill × dp 4, 2 decode × dp 4 by default, dsv3 profile, a 40 s
// window whose first 10% is excluded, 60 s of drain) so that the two can
// be compared request statistic by statistic. With several seeds it ends
// with each routing's per-seed mean and p99 TTFT and their ratios to the
// first routing's, paired by seed.
func crossCheck(ctx context.Context, w io.Writer, c crossCase) error {
	name, rateText, ok := strings.Cut(c.spec, ":")
	if !ok {
		return fmt.Errorf("-crosscheck %q: want workload:rate", c.spec)
	}
	rate, err := strconv.ParseFloat(rateText, 64)
	if err != nil {
		return fmt.Errorf("-crosscheck %q: %w", c.spec, err)
	}
	rts, err := routings(strings.Split(c.policies, ","))
	if err != nil {
		return err
	}
	if c.dp <= 0 {
		c.dp = 4
	}
	c.seeds = max(c.seeds, 1)
	prof, err := sim.LookupProfile(dsv3)
	if err != nil {
		return err
	}
	type row struct{ mean, p99 float64 }
	rows := map[string][]row{}
	for k := range c.seeds {
		seed := c.seed + uint64(k)
		wl, err := bench.Generate(name, rate, c.window, seed, bench.Params{})
		if err != nil {
			return err
		}
		p, err := clustersim.Prepare(wl, "sim-model", prof.BlockSize)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "simulated: %s at %g sessions/s, seed %d, window %s (first 10%% excluded), 2 prefill × dp %d, 2 decode × dp %d, %s\n\n", name, rate, seed, c.window, c.dp, c.dp, dsv3)
		fmt.Fprintln(w, "| routing | requests | TTFT mean | p50 | p99 | TPOT mean | E2E mean | hit rate | decode imbalance |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
		var parts []string
		for _, rt := range rts {
			res, err := clustersim.Run(ctx, clustersim.Config{
				Cluster: clustersim.Uniform(dsv3, 2, 2, c.dp), Policy: rt.policy, Oracle: rt.oracle, Workload: p,
				Warmup: c.window / 10, Drain: time.Minute, Seed: seed, Scheduler: rt.scheduler,
			})
			if err != nil {
				return err
			}
			s := res.Summarize()
			rows[rt.name] = append(rows[rt.name], row{s.TTFTMean, s.TTFTP99})
			fmt.Fprintf(w, "| %s | %d | %.0f | %.0f | %.0f | %.1f | %.0f | %.1f%% | %.2f |\n", rt.name, s.Requests, s.TTFTMean, s.TTFTP50, s.TTFTP99, s.TPOTMean, s.E2EMean, 100*s.HitRate, s.DecodeImbalance)
			if c.parts {
				parts = append(parts, partsRow(rt.name, res.TTFTParts(&prof)))
			}
		}
		if c.parts {
			fmt.Fprintln(w)
			fmt.Fprintln(w, "| routing | TTFT | prefill wait (p99) | prefill compute (alone) | KV transfer | decode wait | first step | hit rate | later turns: TTFT, wait, compute | hits (of bound) | same prefill rank / engine | moved turns: TTFT, hits | first turns' hits | same decode rank | prefill work per rank (k tokens) | decoded per rank |")
			fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|---|---|")
			for _, p := range parts {
				fmt.Fprintln(w, p)
			}
		}
		fmt.Fprintln(w)
	}
	if c.seeds > 1 {
		fmt.Fprintf(w, "paired over seeds %d-%d: mean TTFT and p99 per seed (ms), and the mean over seeds of each seed's ratio to %s\n\n", c.seed, c.seed+uint64(c.seeds)-1, rts[0].name)
		fmt.Fprintln(w, "| routing | TTFT mean per seed | mean | × | p99 per seed | mean | × |")
		fmt.Fprintln(w, "|---|---|---:|---:|---|---:|---:|")
		base := rows[rts[0].name]
		for _, rt := range rts {
			var means, p99s []string
			var m, p, rm, rp float64
			for k, r := range rows[rt.name] {
				means, p99s = append(means, fmt.Sprintf("%.0f", r.mean)), append(p99s, fmt.Sprintf("%.0f", r.p99))
				m, p = m+r.mean, p+r.p99
				rm, rp = rm+r.mean/base[k].mean, rp+r.p99/base[k].p99
			}
			n := float64(len(rows[rt.name]))
			fmt.Fprintf(w, "| %s | %s | %.1f | %.3f | %s | %.0f | %.3f |\n", rt.name, strings.Join(means, " / "), m/n, rm/n, strings.Join(p99s, " / "), p/n, rp/n)
		}
	}
	return nil
}

// partsRow is one routing's TTFT split as a Markdown table row.
func partsRow(name string, p clustersim.TTFTParts) string {
	var work, dec []string
	total := 0.0
	for _, s := range p.PrefillWork {
		work = append(work, fmt.Sprintf("%.0f", s.Value/1000))
		total += s.Value
	}
	work = append(work, fmt.Sprintf("(Σ %.0f)", total/1000))
	for _, s := range p.DecodeRequests {
		dec = append(dec, fmt.Sprintf("%.0f", s.Value))
	}
	return fmt.Sprintf("| %s | %.1f | %.1f (%.0f) | %.1f (%.1f) | %.1f | %.1f | %.1f | %.1f%% | %.1f, %.1f, %.1f | %.1f%% (%.1f%%) | %.0f%% / %.0f%% | %.0f, %.0f%% | %.1f%% | %.0f%% | %s | %s |",
		name, p.TTFT, p.PrefillWait, p.PrefillWaitP99, p.PrefillCompute, p.PrefillSolo, p.Transfer, p.DecodeWait, p.FirstStep, 100*p.HitRate,
		p.LaterTTFT, p.LaterPrefillWait, p.LaterPrefillCompute, 100*p.LaterHitRate, 100*p.LaterHitOfBound,
		100*p.SamePrefillRank, 100*p.SamePrefillEngine, p.MovedTTFT, 100*p.MovedHitRate, 100*p.FirstHitRate, 100*p.SameDecodeRank, strings.Join(work, " "), strings.Join(dec, " "))
}
