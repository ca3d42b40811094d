// Package harness starts and stops the real parts of an end-to-end run on
// loopback: simulated SGLang engines (duet-sim), duet itself, and a real
// Envoy whose bootstrap is rendered by `duet envoy-config` from the same
// configuration. Tests, benchmarks and the demo build on it.
package harness
