// Package clustersim is a deterministic, virtual-time simulator of a PD
// cluster for measuring routing quality.
//
// It runs duet's real scheduler (package scheduler: policies, reservation
// ledger, prefix index, token estimate, load parsing) against duet-sim's
// calibrated engine model (sim.Model: per-rank continuous batching, KV
// budget, chunked prefill, prefix cache, lockstep DP steps, KV transfer).
// One event loop drives everything: there is no HTTP server, no Envoy and
// no wall clock, so the same configuration and seed always give the same
// result, byte for byte, and ten model minutes take well under a second.
//
// What happens to a request mirrors the real path:
//   - the client's body is built as the benchmark client sends it, and
//     duet's own body parser (extproc.Describe) turns it into the
//     scheduler's request; the engines parse the same body (sim.ParsePrompt);
//   - the scheduler picks a prefill and a decode target (or, with
//     bench.Policy.EngineRanks, engines only: the prefill rank then follows a
//     random bootstrap room and the decode engine takes ranks round robin,
//     as SGLang does behind a rank-unaware router);
//   - both legs start at once; the prefill leg waits in its bootstrap queue
//     (sim.Model.SubmitBootstrap) while the decode leg preallocates KV;
//     once it has, the prefill joins its waiting queue (Bootstrapped, with
//     the decode radix cache's decode_prefix_len), computes the prompt and
//     sends the KV, so a decode short of KV holds its prefills back, as in
//     SGLang and duet-sim; the decode leg starts once both are done;
//   - feedback reaches the scheduler when each leg ends, as Envoy's access
//     log delivers it, and loads are scraped every LoadInterval through the
//     scheduler's own scrape code: an in-process http.RoundTripper answers
//     GET /server_info and GET /v1/loads with the body a duet-sim server
//     would send (sim.Model.LoadsJSON).
//
// With Config.Admission, requests pass duet's admission queue (package
// scheduler/admit) before the pick, driven in virtual time as duet drives
// it: a request is picked on arrival while its replica's queue is empty
// and the pool is not saturated (scheduler.Saturated), and is otherwise
// queued (by class, fairly between tenants) or refused; after every event
// that may free room (a leg's feedback, a load scrape) queued requests are
// let through one at a time while the pool is not saturated, and a request
// still queued at its class's wait limit is refused. Result.Breakdown
// measures goodput at a per-request SLO by class and tenant. Without
// admission a run is what it was before admission existed, byte for byte.
//
// Two references show the headroom left. OracleLoad replaces the scheduler
// with a choice only a simulator can make: each leg goes to the rank with
// the least true pending work. Result's hit-rate bound is the share of
// prompt tokens a cache holding every earlier prompt on every rank would
// hit: no routing can do better.
package clustersim
