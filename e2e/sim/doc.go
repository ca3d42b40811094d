// Package sim is duet-sim: a simulated SGLang HTTP server for end-to-end tests.
//
// No GPUs are involved. A Server speaks SGLang's real HTTP wire protocol
// (OpenAI routes, native /generate, /server_info, /v1/loads, /metrics) and
// reproduces the parts of SGLang's behaviour that a router can get wrong
// when it drives prefill/decode (PD) disaggregation with data-parallel (DP)
// ranks:
//
//   - DP rank selection: the X-Data-Parallel-Rank header on the OpenAI
//     routes, the routed_dp_rank body field (and its deprecated alias
//     data_parallel_rank), follow_bootstrap_room on prefill and round robin
//     otherwise, with SGLang's validation errors;
//   - the PD handshake: a prefill server runs a bootstrap HTTP server and
//     records, per bootstrap room, on which DP rank the KV cache was
//     produced; a decode server resolves the prefill rank it expects
//     (disagg_prefill_dp_rank, else bootstrap_room % prefill dp_size) and
//     waits for the KV on exactly that rank, failing with SGLang's messages
//     when the room never arrives, arrives on another rank, or failed;
//   - the follow_bootstrap_room conflict check on prefill;
//   - live per-rank load in /v1/loads and /metrics.
//
// Two latency models are available. By default every request simply sleeps
// PrefillPer1KTokens per 1000 prompt tokens and DecodePerToken per token,
// independently of the others (quick and deterministic; the end-to-end
// tests use it). With Config.Profile (--profile) a calibrated engine model
// runs instead: per DP rank a continuous-batching scheduler with an FCFS
// waiting queue, a KV token budget that gates admission, chunked prefill,
// a prefix cache with LRU eviction, prefill and decode step times from
// published SGLang figures, lockstep steps across ranks under DP attention,
// and a PD KV transfer time. Overload then shows as queueing (TTFT) and
// slow steps (TPOT), and the loads and metrics report the model's numbers.
// MODEL.md documents the formulas, parameters, sources and simplifications.
//
// Config.TimeScale makes model time run faster than wall time (client
// latencies × TimeScale = model time; network, Envoy and duet overheads are
// not scaled). Config.Flavor vllm serves vLLM's API instead (aggregated,
// X-data-parallel-rank, vllm: metrics). Config.Faults injects latency
// spikes, HTTP 500s, a crash after N requests and slow scrapes, drawn from
// Config.Seed.
//
// Every inference request is recorded and can be inspected over
// GET /sim/requests, so tests can assert what the router actually sent.
//
// The command cmd/duet-sim wraps this package.
package sim
