// Package accesslog turns Envoy's gRPC access-log service (ALS) into
// completion feedback for duet.
//
// Envoy opens one StreamAccessLogs stream per access logger and sends an
// HTTPAccessLogEntry when a stream ends. The rendered bootstrap (package
// envoy) configures two loggers that both point at duet's gRPC server:
//
//   - contract.LogDownstream on the HTTP connection manager: one entry per client
//     request, carrying duet's dynamic metadata (the targets it chose) and the
//     token usage that the response filters copied into the same namespace;
//   - contract.LogUpstream on the router: one entry per upstream request, the
//     prefill mirror included, each naming its cluster and upstream host.
//
// [Server] converts each entry into a [Completion] and hands it to a [Sink]
// owned by the consumer (the scheduler, through an adapter in cmd/duet). The
// leg comes from the log name and the upstream cluster: contract.ClusterDecode
// gives [LegDecode], contract.ClusterPrefill gives [LegPrefill], and the
// downstream entry gives [LegRequest]. Entries are joined by x-duet-request-id, the id duet mints per request.
//
// Dependencies: this package imports package envoy for the log, cluster and
// metadata-key names, and package extproc for the header names and the
// metadata namespace, so the names the template renders and the names read
// here cannot drift. Package envoy therefore must never import this package.
//
// Which entry carries what on Envoy 1.40 is recorded, with the tests that
// prove it, in docs/envoy-contract.md.
package accesslog
