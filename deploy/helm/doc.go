// Package helm holds the tests of duet's Helm chart (deploy/helm/duet): they
// render the chart with helm for the value sets in examples/, validate every
// object against the Kubernetes API schemas with kubeconform, check how the
// objects fit together, load the rendered duet configuration with duet
// itself, and have Envoy validate the bootstrap that the chart's init
// container renders. `make test` installs the pinned tools they use.
package helm
