// Package istio holds duet's Istio manifests (gateway.yaml, envoyfilter.yaml,
// auth.yaml) and the tests that check them offline: the EnvoyFilter fragments
// must equal what `duet envoy-config` renders (package envoy, proved on a
// real Envoy), and its clusters to duet must carry the mesh's mutual TLS as
// Istio generates it for its own clusters; istioctl analyze must find
// nothing to report, on the manifests alone and with stand-in Kubernetes
// objects (testdata/cluster.yaml); every object must satisfy Istio's CRD
// schemas; the configuration that Istio's own generator builds for the
// gateway, with the patches applied, must load in the real Envoy; the one
// it builds for duet's sidecar must take only mutual TLS on duet's gRPC port
// and admit there only the gateway's identity; and the two, on the real
// Envoy with mesh certificates from a test CA, must serve PD traffic through
// duet and keep every other caller away from it. The Istio tools come from
// the separate Go module in check/, built into .tools/istio by `make
// istio-tools`. Guide: docs/deploy/istio.md.
package istio
