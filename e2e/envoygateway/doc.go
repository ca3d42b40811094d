// Package envoygateway proves the Envoy Gateway manifests of
// deploy/envoy-gateway on a real Envoy. Its test feeds the manifests, with
// the engines and duet placed on loopback ports, to Envoy Gateway's own
// translator (`egctl x translate`, built by the Makefile at a pinned
// version), turns the xDS it produces into a static Envoy bootstrap, and
// runs duet's core end-to-end claims through it with real duet and
// simulated SGLang engines (package e2e/harness).
//
// The package holds tests only; docs/deploy/envoy-gateway.md is the guide.
package envoygateway
