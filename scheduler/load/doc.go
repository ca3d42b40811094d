// Package load fetches and parses the load that inference engines report
// for each of their data-parallel (DP) ranks.
//
// Two sources are understood. SGLang (releases from 2026-01 on) serves
// GET /v1/loads, a JSON document with one entry per DP rank that carries
// absolute token counts; [ParseLoads] reads it. Older SGLang releases and
// vLLM only expose Prometheus text at GET /metrics; [ParseMetrics] reads the
// SGLang gauges (prefix "sglang:" or "sglang_", rank from the "dp_rank"
// label) or the vLLM ones (prefix "vllm:", rank from the "engine" label).
// Both return one [Rank] per DP rank, sorted by rank; several entries or
// series for the same rank are added together.
//
// A [Scraper] asks an engine for a [Report]. It tries /v1/loads first and
// remembers, per engine, when that endpoint does not exist, so that later
// scrapes go straight to /metrics; the endpoint is probed again every few
// minutes in case the engine was upgraded.
//
// Values from the wire are never trusted: NaN and negative numbers become
// zero, huge numbers are capped, usage ratios are clamped to 0..1, JSON
// nesting is bounded and response bodies are read up to a size limit.
//
// Files: rank.go (the result types and how entries for the same rank are
// merged), loads.go (/v1/loads), metrics.go (/metrics), scraper.go (the
// Scraper), fetch.go (one bounded HTTP GET), memo.go (which engines lack
// /v1/loads), depth.go (a guard against deeply nested JSON) and errors.go
// (sentinel errors).
package load
