// Package bench measures duet's routing quality: it drives open-loop
// Poisson load through a real Envoy + duet into simulated SGLang engines
// (duet-sim, started by e2e/harness) and compares scheduling policies on
// identical arrivals.
//
// The pieces are small and separate:
//   - workload.go generates seeded, deterministic workloads (variable-length
//     prompts, multi-turn conversations with shared system prompts, a bursty
//     mix) as sessions with model-time arrival offsets;
//   - client.go sends one streaming chat completion and times it;
//   - sampler.go polls every engine's per-rank load (/v1/loads);
//   - stats.go turns results and samples into summaries (TTFT, TPOT,
//     throughput, rank imbalance, prefix hit rate, errors);
//   - classes.go breaks a case down by priority class and tenant (429s,
//     goodput at an SLO) for a workload whose sessions name them
//     (priority_mix, whose client sends the class as an API key and the
//     tenant in a header);
//   - runner.go runs one case (workload × load × policy) on a fresh stack;
//   - report.go and plot.go write the Markdown tables and PNG plots.
//
// Every duration a case reports is model time: the simulator may run F
// times faster than wall time (--time-scale F), and the client multiplies
// what it measures by F. docs/benchmarks/README.md explains the method and
// the limits of that scaling. The command is e2e/bench/quality
// (`make bench-quality`).
package bench
