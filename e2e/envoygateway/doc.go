// Package envoygateway proves the Envoy Gateway manifests of
// deploy/envoy-gateway on a real Envoy. Its test feeds the manifests, with
// the engines and duet placed on loopback ports, to Envoy Gateway's own
// translator (`egctl x translate`, built by the Makefile at a pinned
// version), turns the xDS it produces into a static Envoy bootstrap, and
// runs duet's core end-to-end claims through it with real duet and
// simulated SGLang engines (package e2e/harness). duet requires mutual TLS
// on its gRPC port, as the manifests configure it; the translation gets
// the stack's credentials as the Secret and ConfigMap the manifests name,
// and gateways with credentials that do not fit are shown refused. With two
// duet replicas that share through a nats-server running the manifests'
// nats.conf, the gateway's Envoy reaches both and skips one killed with
// SIGKILL within a second. The admission example (admission/: a
// SecurityPolicy that sets duet's admission headers from JWT claims) is
// translated too, and its JWT filter must run before duet's ext_proc.
//
// The package holds tests only; docs/deploy/envoy-gateway.md is the guide.
package envoygateway
