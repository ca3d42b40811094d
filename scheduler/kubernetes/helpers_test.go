package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/duet-router/duet/scheduler"
)

// testNamespace is the engines' namespace in the tests.
const testNamespace = "inference"

// slice returns an EndpointSlice of service in testNamespace.
func slice(name, service string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: testNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: service},
		},
		AddressType: family,
		Ports:       ports,
		Endpoints:   eps,
	}
}

// port returns a TCP slice port; an empty name leaves it unnamed.
func port(name string, n int32) discoveryv1.EndpointPort {
	p := discoveryv1.EndpointPort{Port: &n}
	if name != "" {
		p.Name = &name
	}
	return p
}

// Endpoint conditions.
var (
	yes = new(true)
	no  = new(false)
)

// cond is an endpoint's readiness: nil fields are unset.
type cond struct{ ready, terminating *bool }

// endpoint returns a slice endpoint at addr for pod (none if empty).
func endpoint(addr, pod string, c cond) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: c.ready, Terminating: c.terminating},
	}
	if pod != "" {
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: testNamespace, Name: pod}
	}
	return ep
}

// readyAt returns a ready endpoint at addr for pod.
func readyAt(addr, pod string) discoveryv1.Endpoint { return endpoint(addr, pod, cond{ready: yes}) }

// fakeSlices adapts a fake clientset to Options.Client. It keeps the
// clientset's statement that it does not support watch-list semantics, so
// that the informer lists and watches as it must with the fake.
type fakeSlices struct{ cs *fake.Clientset }

func (f fakeSlices) List(ctx context.Context, ns string, opts metav1.ListOptions) (*EndpointSliceList, error) {
	list, err := f.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	var out EndpointSliceList
	return &out, recode(list, &out)
}

func (f fakeSlices) Watch(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := f.cs.DiscoveryV1().EndpointSlices(ns).Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		if s, ok := e.Object.(*discoveryv1.EndpointSlice); ok {
			e.Object = convert(s)
		}
		return e, true
	}), nil
}

// recode copies in into out through their JSON form, as the API server's
// answers reach duet's own types.
func recode(in, out any) error {
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, out)
}

// convert returns s as duet's EndpointSlice type.
func convert(s *discoveryv1.EndpointSlice) *EndpointSlice {
	var out EndpointSlice
	if err := recode(s, &out); err != nil {
		panic(err)
	}
	return &out
}

func (f fakeSlices) IsWatchListSemanticsUnSupported() bool {
	return f.cs.IsWatchListSemanticsUnSupported()
}

// lists is one SetEndpoints call.
type lists struct {
	prefill, decode []scheduler.EndpointSpec
}

func (l lists) String() string { return fmt.Sprintf("prefill %v, decode %v", l.prefill, l.decode) }

// recorder is an EndpointSetter that records every call.
type recorder struct {
	mu     sync.Mutex
	calls  []lists
	reject error // returned by every call while set
}

func (r *recorder) SetEndpoints(_ context.Context, prefill, decode []scheduler.EndpointSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, lists{slices.Clone(prefill), slices.Clone(decode)})
	return r.reject
}

// snapshot returns the calls so far.
func (r *recorder) snapshot() []lists {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// last returns the last call, if any.
func (r *recorder) last() (lists, bool) {
	calls := r.snapshot()
	if len(calls) == 0 {
		return lists{}, false
	}
	return calls[len(calls)-1], true
}

// specsOf returns endpoint specs for URLs, without a bootstrap port.
func specsOf(urls ...string) []scheduler.EndpointSpec {
	out := make([]scheduler.EndpointSpec, len(urls))
	for i, u := range urls {
		out[i] = scheduler.EndpointSpec{URL: u}
	}
	return out
}

// eventually polls cond every 10ms until it holds, failing the test with
// msg() after timeout.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, msg())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
