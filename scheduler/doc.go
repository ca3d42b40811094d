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
// Picking is lock-free: every discovery round that changes what is known
// publishes a new immutable snapshot of the endpoints and their targets, and
// [Scheduler.Pick] only reads the current snapshot.
//
// The package is split by job: endpoint.go (endpoints, targets and how an
// engine URL maps to the address Envoy uses), discovery.go (asking engines
// about themselves), policy.go (the policy interface and its registry),
// roundrobin.go (the round_robin policy) and scheduler.go (configuration,
// snapshots and picking).
package scheduler
