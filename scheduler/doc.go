// Package scheduler decides where each LLM request goes.
//
// The unit of choice is a [Target]: one engine ([Endpoint]) together with one
// of its data-parallel (DP) ranks. A [Scheduler] keeps two pools of engines,
// prefill and decode; when no prefill pool is configured it runs in
// aggregated mode and only the decode pool is used. Each pool has its own
// [Policy], which chooses one target among the ready ones.
//
// The scheduler learns what it needs about each engine from SGLang's
// GET /server_info (or the older GET /get_server_info): the DP size, which
// determines the targets, and for prefill engines the port of the
// disaggregation bootstrap server that decode engines dial to fetch the KV
// cache. Values given in the configuration are a fallback for engines that
// cannot be asked. [Scheduler.Discover] runs one round of discovery and
// [Scheduler.Run] repeats it periodically.
//
// Every discovery round that changes what is known publishes a new immutable
// snapshot of the endpoints and their targets. [Scheduler.Pick] reads the
// current snapshot and, under the ledger's lock, reads each candidate's load
// (scraped engine numbers plus duet's reservations), runs the policy and
// reserves the request's tokens on the chosen target, so concurrent picks
// never see the same minimum. Reservations end on completion feedback
// ([Scheduler.Complete]), on a scrape that covers them, or on a TTL.
//
// Picks skip ejected targets. Health is passive (legs that fail or find no
// host, in completion feedback; load scrapes that get no answer) and active
// (GET /health probes); a failing endpoint or target is ejected for a
// doubling backoff, then half-open until its next failure or success (see
// [HealthConfig] and [Config.OnEject]).
//
// The package is split by job: endpoint.go (endpoints, targets and how an
// engine URL maps to the address Envoy uses), discovery.go (asking engines
// about themselves), reload.go (replacing the endpoint lists while
// running: [Scheduler.SetEndpoints]), snapshot.go (targets per role), ledger.go (loads and
// reservations), scrape.go (the load-scraping loop), pick.go (choosing and
// reserving), feedback.go, health.go (health records and ejection), probe.go
// (the health-probe loop), tokens.go (the token estimate), metrics.go,
// status.go (a read-only view for status pages, with the recent decisions:
// [Scheduler.Status]),
// policy.go (the policy interface and its registry) and one policy_*.go file
// per policy. Subpackage load fetches and parses engine load reports;
// subpackage prefix hashes prompts and keeps the prefix index.
package scheduler
