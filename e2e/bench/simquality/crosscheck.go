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

// crossCheck simulates the cases of one real-path run (make bench-quality:
// 2 prefill × dp 4, 2 decode × dp 4, dsv3 profile, a 40 s window whose
// first 10% is excluded, 60 s of drain) so that the two can be compared
// request statistic by statistic. spec is workload:rate, e.g. variable:8.
func crossCheck(ctx context.Context, w io.Writer, spec, policies string, window time.Duration, seed uint64) error {
	name, rateText, ok := strings.Cut(spec, ":")
	if !ok {
		return fmt.Errorf("-crosscheck %q: want workload:rate", spec)
	}
	rate, err := strconv.ParseFloat(rateText, 64)
	if err != nil {
		return fmt.Errorf("-crosscheck %q: %w", spec, err)
	}
	rts, err := routings(strings.Split(policies, ","))
	if err != nil {
		return err
	}
	wl, err := bench.Generate(name, rate, window, seed, bench.Params{})
	if err != nil {
		return err
	}
	prof, err := sim.LookupProfile(dsv3)
	if err != nil {
		return err
	}
	p, err := clustersim.Prepare(wl, "sim-model", prof.BlockSize)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "simulated: %s at %g sessions/s, seed %d, window %s (first 10%% excluded), 2 prefill × dp 4, 2 decode × dp 4, %s\n\n", name, rate, seed, window, dsv3)
	fmt.Fprintln(w, "| routing | requests | TTFT mean | p50 | p99 | TPOT mean | E2E mean | hit rate |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, rt := range rts {
		res, err := clustersim.Run(ctx, clustersim.Config{
			Cluster: clustersim.Uniform(dsv3, 2, 2, 4), Policy: rt.policy, Oracle: rt.oracle, Workload: p,
			Warmup: window / 10, Drain: time.Minute, Seed: seed,
		})
		if err != nil {
			return err
		}
		s := res.Summarize()
		fmt.Fprintf(w, "| %s | %d | %.0f | %.0f | %.0f | %.1f | %.0f | %.1f%% |\n", rt.name, s.Requests, s.TTFTMean, s.TTFTP50, s.TTFTP99, s.TPOTMean, s.E2EMean, 100*s.HitRate)
	}
	return nil
}
