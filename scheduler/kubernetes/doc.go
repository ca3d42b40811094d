// Package kubernetes discovers the scheduler's engines in Kubernetes: it
// watches the EndpointSlices of one Service per role (prefill, decode) with
// a client-go shared informer and hands their ready endpoints to the
// scheduler's SetEndpoints as they come and go.
//
// An engine is one ready, not terminating endpoint of a slice, addressed as
// http://<ip>:<port> with the port the Pool names; a prefill slice's port
// named "bootstrap" gives the engines' bootstrap port. A burst of slice
// changes is applied once, a debounce after its first change; an engine
// that becomes ready after the first sync waits a join delay before it is
// scheduled, so that Envoy, which resolves the same engines through the
// Service's DNS name, knows it by then. Removals apply at once.
//
// The informer is namespaced and selects slices by the
// kubernetes.io/service-name label: duet needs get, list and watch on
// discovery.k8s.io endpointslices in the engines' namespace, nothing else.
package kubernetes
