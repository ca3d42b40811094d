// Package envoy renders the Envoy bootstrap that carries out duet's routing
// decisions: an ext_proc filter (fail closed, buffered request bodies) that
// calls duet, early stripping of client-sent routing headers, a decode cluster
// and a prefill cluster whose override_host load balancers pick the host named
// in duet's headers, and a route that sends the request to decode while
// mirroring it to the prefill cluster named by duet. It also sends gRPC
// access logs of the whole request and of each upstream leg back to duet
// (completion feedback), copies token usage from responses into duet's
// metadata, and, on the PD decode cluster only, runs a Lua filter that
// writes the decode rank of /generate requests into that leg's body.
//
// `duet envoy-config` renders it from duet's own configuration, so duet and
// Envoy always agree on the endpoints and the header contract.
package envoy
