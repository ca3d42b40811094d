// Package sim is duet-sim: a simulated SGLang HTTP server for end-to-end tests.
//
// No GPUs are involved. A Server speaks SGLang's real HTTP wire protocol
// (OpenAI routes, native /generate, /server_info, /v1/loads, /metrics,
// /flush_cache) and reproduces the parts of SGLang's behaviour that a
// router can get wrong when it drives prefill/decode (PD) disaggregation
// with data-parallel (DP) ranks:
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
// waiting queue (ordered by priority under priority scheduling, below), a
// KV token budget that gates admission, chunked prefill,
// a prefix cache with LRU eviction, prefill and decode step times from
// published SGLang figures, lockstep steps across ranks under DP attention,
// a PD prefill's bootstrap queue and a PD KV transfer time. Overload then
// shows as queueing (TTFT) and slow steps (TPOT), and the loads and metrics
// report the model's numbers, SGLang's per-stage latency histogram
// (sglang:per_stage_req_latency_seconds: the bootstrap queue, waiting
// queue, forward and KV transfer of a prefill; the prealloc, transfer and
// waiting queues of a decode) included, in model seconds.
//
// A PD prefill request of the engine model waits in its rank's bootstrap
// queue, as SGLang's does, until the decode holding its bootstrap room has
// preallocated the KV and sent the transfer metadata (POST /sim/kv_prefix
// on the prefill's bootstrap server, with decode_prefix_len); only then
// does it enter the waiting queue, so a decode short of KV holds its
// prefills back. The queue is reported under SGLang 0.5.23's names
// (sglang:num_prefill_bootstrap_queue_reqs, and prefill_bootstrap_queue_reqs
// in /v1/loads' disaggregation section), not in the waiting queue; the other
// PD queues likewise (prefill_inflight_queue_reqs: KV being sent;
// decode_prealloc_queue_reqs: waiting for KV memory;
// decode_transfer_queue_reqs: receiving KV; decode_retracted_queue_reqs,
// in /v1/loads only: always 0, as duet-sim never retracts). A request
// whose decode never preallocates fails after Config.BootstrapTimeout
// (--bootstrap-timeout, SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT; default
// the KV timeout) with SGLang's "Prefill bootstrap failed ...
// KVPoll.Bootstrapping" 500. The simple model has the queue only with
// Config.AwaitTransfer.
// MODEL.md documents the formulas, parameters, sources and simplifications.
//
// A decode server with Config.DecodeRadixCache
// (--disaggregation-decode-enable-radix-cache) keeps SGLang's decode-side
// radix cache in the engine model: finished requests leave their prompt and
// answer cached, preallocation matches and pins the cached prefix, and the
// decode tells its prefill the matched length in its transfer metadata,
// which the prefill then has before it starts, and sends only the KV beyond
// it.
// Config.HierarchicalCache adds the host tier (evicted blocks kept in host
// memory and loaded back on a hit), and Config.DoubleCountCachedTokens
// reproduces SGLang's double-counted cached_tokens (issue #25972). A body
// with an integer seed (sampling_params.sampling_seed on /generate) gets
// ReplyText(seed, n) as its answer, so a client can send the exact answer
// back in its next turn.
//
// With Config.KVEventsConfig (SGLang's --kv-events-config, publisher
// "zmq", which needs Config.Profile) every DP rank publishes its prefix cache's changes as SGLang
// 0.5.23's KV events: a ZMQ PUB socket per rank on the configured port
// plus the rank, frames [topic, sequence, msgpack KVEventBatch] byte for
// byte as SGLang's msgspec structures encode them, a replay ROUTER per
// rank, and the publisher's descriptor in /server_info (kv_events).
// BlockStored and BlockRemoved follow the GPU cache and the host tier
// ("CPU_PINNED"), AllBlocksCleared a fresh publisher, /flush_cache and the
// cache faults. Blocks carry their token ids for token-id prompts, and for
// text prompts with Config.Tokenizer, which keys them by the ids duet
// computes (extproc.PromptTokens); blocks without ids are not published.
// Model.OnCacheEvents reports the same events in virtual time.
//
// Priority scheduling follows SGLang 0.5.23. Every inference route but
// /v1/responses (whose priority SGLang does not hand to its engine) reads
// the body's integer priority field; one outside int64 is SGLang's 400
// "priority must be a signed 64-bit integer ...". With
// Config.EnablePriorityScheduling (--enable-priority-scheduling) the
// engine model's waiting queues, a decode's prealloc queue included, let
// larger values start first (smaller ones with
// Config.ScheduleLowPriorityValuesFirst), first come first served among
// equals, and a request without a priority goes last; running requests
// are not preempted. Without it, Config.AbortOnPriorityWhenDisabled
// (--abort-on-priority-when-disabled) aborts a request that carries a
// priority as SGLang's scheduler does: a 503 ErrorResponse, or when
// streaming a 200 whose stream carries the abort; otherwise the field is
// ignored. /server_info reports the three flags.
//
// Model exposes the same engine model without HTTP or a clock, for callers
// that drive it in virtual time (the cluster simulator, e2e/clustersim);
// ParsePrompt parses a body as a server does.
//
// Config.TimeScale makes model time run faster than wall time (client
// latencies × TimeScale = model time; network, Envoy and duet overheads are
// not scaled). Config.Flavor vllm serves vLLM's API instead (aggregated,
// X-data-parallel-rank, vllm: metrics).
//
// Request ids and aborts follow SGLang. Every item gets a rid: the body's
// rid field (a string, or a list for batches; a string rid of a batch
// becomes "<rid>_<i>"; chat samples with n > 1 get fresh random rids), or
// a random 32-hex one. A rid already in flight is a 400 "Duplicate request
// ID detected: <rid>", and the response id (meta_info.id on /generate) of
// an n=1 request is its rid. POST /abort_request {"rid", "abort_all"}
// always answers 200 with an empty body; unless abort_all, the rid must be
// exactly one in flight, and then every item whose rid starts with it is
// aborted. What the client sees depends on the item's stage: a prefill
// item (its bootstrap queue included), or a decode item still waiting for
// its KV, fails with a 500
// "... Aborted by AbortReq." (in-stream error event when streaming; the
// prefill's room fails, so its decode fails too); an item already
// generating (decode, or aggregated) ends with finish_reason "abort" and
// its partial output. Either way its KV and load are freed at once.
//
// Config.Faults injects latency spikes, HTTP 500s, a crash after N
// requests, slow scrapes, unparsable or failing /v1/loads and /metrics,
// and a hung engine (requests, scrapes and /server_info never answer,
// aborts are ignored, /health answers 503 after Config.HealthTimeout);
// spikes and errors are drawn from Config.Seed. Faults can be changed at
// runtime with POST /sim/faults (GET returns them) or
// Server.UpdateFaults, which also take one-shot actions: reset_cache
// empties the prefix cache, kv_events_down_ms takes the KV event publisher
// down and brings it back as a restarted engine's, kv_events_drop loses
// batches on the way (replayable). /health answers 503 once the server is shutting
// down.
//
// Every inference request is recorded and can be inspected over
// GET /sim/requests (rids, priority, abort outcome, finish reasons
// included), so tests can assert what the router actually sent; GET
// /sim/stats counts the aborts and lists the rids in flight with their
// stage.
//
// The command cmd/duet-sim wraps this package.
package sim
