// Package istio holds duet's Istio manifests (gateway.yaml, envoyfilter.yaml,
// auth.yaml, replicas.yaml, nats.yaml) and the tests that check them
// offline: the EnvoyFilter fragments must equal what `duet envoy-config`
// renders (package envoy, proved on a real Envoy), its clusters to duet must
// carry the mesh's mutual TLS as Istio generates it for its own clusters and
// resolve every duet replica through a headless Service; istioctl analyze
// must find nothing to report, on the manifests alone and with stand-in
// Kubernetes objects (testdata/cluster.yaml); every object must satisfy
// Istio's CRD schemas, or Kubernetes' for core objects; the configuration
// that Istio's own generator builds for the gateway, with the patches
// applied, must load in the real Envoy; the one it builds for duet's sidecar
// must take only mutual TLS on duet's gRPC port and admit there only the
// gateway's identity, and NATS's likewise only duet's, reached as plain TCP;
// and the gateway's and duet's sidecars, on the real Envoy with mesh
// certificates from a test CA, must serve PD traffic through duet, keep
// every other caller away from it, and, with two replicas, skip a dead one
// within a second; the admission example (admission/: a RequestAuthentication
// that sets duet's admission headers from JWT claims) must be analyzed clean
// and generate a gateway that runs the JWT filter before ext_proc; and duet's
// sidecar must pass duet's connections to the engines' KV event ports
// through as plain TCP (or, under REGISTRY_ONLY, reach them once the engine
// Services declare them); and the tracing example (tracing/: a kustomize
// overlay adding a Telemetry and patching the EnvoyFilter, and the mesh
// configuration's OpenTelemetry provider) must make the EnvoyFilter
// exactly what `duet envoy-config` renders with an otlp section, the
// tracer aside, pass the schemas and the analysis given that provider, and
// generate a gateway that logs traceparent and loads in Envoy. The Istio
// tools come
// from the separate Go module in
// check/, built into .tools/istio by `make istio-tools`. Guide:
// docs/deploy/istio.md.
package istio
