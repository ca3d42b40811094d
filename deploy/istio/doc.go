// Package istio holds duet's Istio manifests (gateway.yaml, envoyfilter.yaml)
// and the tests that check them offline: the EnvoyFilter fragments must
// equal what `duet envoy-config` renders (package envoy, proved on a real
// Envoy); istioctl analyze must find nothing to report, on the manifests
// alone and with stand-in Kubernetes objects (testdata/cluster.yaml); every
// object must satisfy Istio's CRD schemas; and the configuration that
// Istio's own generator builds for the gateway, with the patches applied,
// must load in the real Envoy. The Istio tools come from the separate Go module in
// check/, built into .tools/istio by `make istio-tools`. Guide:
// docs/deploy/istio.md.
package istio
