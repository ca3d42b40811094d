// Package extproc implements duet's side of Envoy's external-processing
// (ext_proc) stream: it classifies each request by path, reads the buffered
// JSON body, asks the scheduler for a decode target and (for PD pools) a
// prefill target, rewrites the body with the bootstrap and DP-rank fields
// SGLang expects, and answers with the header mutations that make Envoy send
// the request to the decode engine and mirror it to the prefill engine.
//
// The header contract with the Envoy configuration rendered by package envoy
// lives in package envoy/contract; docs/envoy-contract.md records what was proved on a
// real Envoy.
package extproc
