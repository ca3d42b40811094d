// Package helm holds the tests of duet's Helm chart (deploy/helm/duet): they
// render the chart with helm for the value sets in examples/ (and a few
// --set variations), validate every object against the Kubernetes API
// schemas and the ServiceMonitor and cert-manager Certificate CRDs with
// kubeconform, check how the objects fit together (authentication included:
// duet's auth section, the Secrets and where they come from, the
// NetworkPolicy), check the replicas (their count, the PodDisruptionBudget,
// duet's sync section and the pod name each replica goes by, the refusal of
// several duets behind a gateway that share nothing), load the rendered
// duet configuration with duet itself on the Secrets the pod mounts, shake
// hands over mutual TLS with those certificates, and have Envoy validate the
// bootstrap that the chart's init container renders. They also render
// NOTES.txt and check the NATS examples (examples/nats.yaml, for the NATS
// project's chart, and examples/nats-networkpolicy.yaml). `make test`
// installs the pinned tools they use.
package helm
