package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/duet-router/duet/scheduler"
)

// harness runs a Discovery on a fake clientset.
type harness struct {
	cs  *fake.Clientset
	rec *recorder
	reg *prometheus.Registry
	d   *Discovery
}

// start runs a Discovery with opts (Client, Namespace, Setter and
// Registerer filled in) on a fake clientset holding objs, until the test
// ends.
func start(t *testing.T, opts Options, objs ...*discoveryv1.EndpointSlice) *harness {
	t.Helper()
	h := &harness{rec: &recorder{}, reg: prometheus.NewRegistry()}
	h.cs = fake.NewClientset()
	for _, o := range objs {
		h.create(t, o)
	}
	opts.Client = fakeSlices{h.cs}
	opts.Namespace = testNamespace
	opts.Setter = h.rec
	opts.Registerer = h.reg
	d, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.d = d
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return h
}

func (h *harness) create(t *testing.T, s *discoveryv1.EndpointSlice) {
	t.Helper()
	if _, err := h.cs.DiscoveryV1().EndpointSlices(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s: %v", s.Name, err)
	}
}

func (h *harness) update(t *testing.T, s *discoveryv1.EndpointSlice) {
	t.Helper()
	if _, err := h.cs.DiscoveryV1().EndpointSlices(s.Namespace).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update %s: %v", s.Name, err)
	}
}

func (h *harness) remove(t *testing.T, name string) {
	t.Helper()
	if err := h.cs.DiscoveryV1().EndpointSlices(testNamespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete %s: %v", name, err)
	}
}

// waitFor waits until the last SetEndpoints call has want.
func (h *harness) waitFor(t *testing.T, want lists) {
	t.Helper()
	eventually(t, 10*time.Second, func() bool {
		got, ok := h.rec.last()
		return ok && got.String() == want.String()
	}, func() string {
		got, _ := h.rec.last()
		return fmt.Sprintf("last SetEndpoints: %v, want %v", got, want)
	})
}

// metric returns a metric's value.
func (h *harness) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

// Slices added, updated and removed, readiness flips, several slices per
// Service, other Services and namespaces: each burst ends with the lists
// the slices of the configured Services give.
func TestDiscoveryFollowsSlices(t *testing.T) {
	const v4 = discoveryv1.AddressTypeIPv4
	http := []discoveryv1.EndpointPort{port("http", 30000)}
	withBootstrap := []discoveryv1.EndpointPort{port("http", 30000), port("bootstrap", 9000)}
	d1 := func(b cond) *discoveryv1.EndpointSlice {
		return slice("d-1", "decode", v4, http, readyAt("10.0.0.1", "d-a"), endpoint("10.0.0.2", "d-b", b))
	}
	p1 := slice("p-1", "prefill", v4, http, readyAt("10.0.1.1", "p-a"))
	bootstrap := func(urls ...string) []scheduler.EndpointSpec {
		out := specsOf(urls...)
		for i := range out {
			out[i].BootstrapPort = 9000
		}
		return out
	}
	h := start(t, Options{
		Prefill: &Pool{Service: "prefill", Port: "http"}, Decode: Pool{Service: "decode"},
		Debounce: 20 * time.Millisecond,
	}, p1, d1(cond{ready: yes}))

	steps := []struct {
		name string
		do   func()
		want lists
	}{
		{"first sync", func() {},
			lists{specsOf("http://10.0.1.1:30000"), specsOf("http://10.0.0.1:30000", "http://10.0.0.2:30000")}},
		{"slice added", func() { h.create(t, slice("d-2", "decode", v4, http, readyAt("10.0.0.3", "d-c"))) },
			lists{specsOf("http://10.0.1.1:30000"), specsOf("http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000")}},
		{"endpoint not ready", func() { h.update(t, d1(cond{ready: no})) },
			lists{specsOf("http://10.0.1.1:30000"), specsOf("http://10.0.0.1:30000", "http://10.0.0.3:30000")}},
		{"endpoint ready again", func() { h.update(t, d1(cond{})) },
			lists{specsOf("http://10.0.1.1:30000"), specsOf("http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000")}},
		{"endpoint terminating", func() { h.update(t, d1(cond{ready: no, terminating: yes})) },
			lists{specsOf("http://10.0.1.1:30000"), specsOf("http://10.0.0.1:30000", "http://10.0.0.3:30000")}},
		{"other Service and namespace ignored, slice removed", func() {
			h.create(t, slice("other-1", "other", v4, http, readyAt("10.0.9.1", "o-a")))
			foreign := slice("d-9", "decode", v4, http, readyAt("10.0.9.2", "f-a"))
			foreign.Namespace = "elsewhere"
			h.create(t, foreign)
			h.remove(t, "d-2")
		}, lists{specsOf("http://10.0.1.1:30000"), specsOf("http://10.0.0.1:30000")}},
		{"prefill bootstrap port and a second prefill", func() {
			h.update(t, slice("p-1", "prefill", v4, withBootstrap, readyAt("10.0.1.1", "p-a"), readyAt("10.0.1.2", "p-b")))
		}, lists{bootstrap("http://10.0.1.1:30000", "http://10.0.1.2:30000"), specsOf("http://10.0.0.1:30000")}},
		{"every prefill gone", func() { h.remove(t, "p-1") },
			lists{nil, specsOf("http://10.0.0.1:30000")}},
	}
	for _, s := range steps {
		s.do()
		h.waitFor(t, s.want)
		if t.Failed() {
			t.Fatalf("step %q", s.name)
		}
	}
	calls := h.rec.snapshot()
	for i := 1; i < len(calls); i++ {
		if calls[i].String() == calls[i-1].String() {
			t.Errorf("call %d repeats the lists of the call before: %v", i, calls[i])
		}
	}
	if got := h.metric(t, "duet_discovery_updates_total", "outcome", "applied"); int(got) != len(calls) {
		t.Errorf("duet_discovery_updates_total{applied} = %v, want %d", got, len(calls))
	}
	for role, want := range map[string]float64{"prefill": 0, "decode": 1} {
		if got := h.metric(t, "duet_discovery_endpoints", "role", role, "state", "scheduled"); got != want {
			t.Errorf("duet_discovery_endpoints{%s,scheduled} = %v, want %v", role, got, want)
		}
	}
	if !h.d.Synced() {
		t.Error("not synced")
	}
}

// A burst of changes within the debounce is applied in one call.
func TestDiscoveryDebounce(t *testing.T) {
	h := start(t, Options{Decode: Pool{Service: "decode"}, Debounce: 500 * time.Millisecond})
	h.waitFor(t, lists{})
	var want []string
	for i := range 5 {
		addr := fmt.Sprintf("10.0.0.%d", i+1)
		h.create(t, slice(fmt.Sprintf("d-%d", i), "decode", discoveryv1.AddressTypeIPv4,
			[]discoveryv1.EndpointPort{port("", 30000)}, readyAt(addr, "pod-"+addr)))
		want = append(want, "http://"+addr+":30000")
	}
	h.waitFor(t, lists{decode: specsOf(want...)})
	if calls := h.rec.snapshot(); len(calls) != 2 {
		t.Errorf("%d SetEndpoints calls, want 2 (the first sync, then the burst): %v", len(calls), calls)
	}
}

// Engines listed at the first sync are scheduled at once; an engine that
// appears later waits for the join delay; one that leaves before its delay
// is over is never scheduled; removals apply at once.
func TestDiscoveryJoinDelay(t *testing.T) {
	const join = time.Second
	ports := []discoveryv1.EndpointPort{port("", 30000)}
	h := start(t, Options{Decode: Pool{Service: "decode"}, Debounce: 10 * time.Millisecond, JoinDelay: join},
		slice("d-a", "decode", discoveryv1.AddressTypeIPv4, ports, readyAt("10.0.0.1", "a")))
	h.waitFor(t, lists{decode: specsOf("http://10.0.0.1:30000")})

	added := time.Now()
	h.create(t, slice("d-b", "decode", discoveryv1.AddressTypeIPv4, ports, readyAt("10.0.0.2", "b")))
	eventually(t, 10*time.Second, func() bool {
		return h.metric(t, "duet_discovery_endpoints", "role", "decode", "state", "joining") == 1
	}, func() string { return "engine b is not joining" })
	if last, _ := h.rec.last(); time.Since(added) < join && len(last.decode) != 1 {
		t.Fatalf("engine b scheduled before its join delay: %v", last)
	}
	h.waitFor(t, lists{decode: specsOf("http://10.0.0.1:30000", "http://10.0.0.2:30000")})
	if waited := time.Since(added); waited < join {
		t.Errorf("engine b scheduled after %v, before its join delay %v", waited, join)
	}
	if got := h.metric(t, "duet_discovery_endpoints", "role", "decode", "state", "joining"); got != 0 {
		t.Errorf("%v engines joining after the delay", got)
	}

	// c comes and goes within its delay: never scheduled. a leaves: at once.
	before := len(h.rec.snapshot())
	h.create(t, slice("d-c", "decode", discoveryv1.AddressTypeIPv4, ports, readyAt("10.0.0.3", "c")))
	eventually(t, 10*time.Second, func() bool {
		return h.metric(t, "duet_discovery_endpoints", "role", "decode", "state", "joining") == 1
	}, func() string { return "engine c is not joining" })
	h.remove(t, "d-c")
	removed := time.Now()
	h.remove(t, "d-a")
	h.waitFor(t, lists{decode: specsOf("http://10.0.0.2:30000")})
	if took := time.Since(removed); took >= join {
		t.Errorf("a removal took %v, as long as the join delay", took)
	}
	time.Sleep(join + 100*time.Millisecond)
	calls := h.rec.snapshot()[before:]
	for _, c := range calls {
		if strings.Contains(c.String(), "10.0.0.3") {
			t.Errorf("engine c was scheduled: %v", c)
		}
	}
}

// Lists the setter refuses are counted; discovery tries again on the next
// change.
func TestDiscoveryRejected(t *testing.T) {
	h := &recorder{reject: errors.New("duplicate endpoint")}
	reg := prometheus.NewRegistry()
	cs := fake.NewClientset(slice("d-1", "decode", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{port("", 30000)}, readyAt("10.0.0.1", "a")))
	d, err := New(Options{Client: fakeSlices{cs}, Namespace: testNamespace, Decode: Pool{Service: "decode"},
		Setter: h, Registerer: reg, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	eventually(t, 10*time.Second, d.Synced, func() string { return "never synced" })
	if got := testutil.ToFloat64(d.metrics.updates.WithLabelValues(outcomeRejected)); got < 1 {
		t.Errorf("rejected updates = %v, want at least 1", got)
	}
	h.mu.Lock()
	h.reject = nil
	h.mu.Unlock()
	if _, err := cs.DiscoveryV1().EndpointSlices(testNamespace).Create(ctx, slice("d-2", "decode", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{port("", 30000)}, readyAt("10.0.0.2", "b")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() bool {
		last, _ := h.last()
		return len(last.decode) == 2
	}, func() string { return "the next change was not applied" })
	if got := testutil.ToFloat64(d.metrics.updates.WithLabelValues(outcomeApplied)); got < 1 {
		t.Errorf("applied updates = %v", got)
	}
	if got := testutil.ToFloat64(d.metrics.endpoints.WithLabelValues("decode", stateScheduled)); got != 2 {
		t.Errorf("scheduled decode endpoints = %v, want 2", got)
	}
}

// Unusable slices are counted in duet_discovery_invalid_slices.
func TestDiscoveryInvalidSlices(t *testing.T) {
	h := start(t, Options{Decode: Pool{Service: "decode", Port: "http"}, Debounce: 10 * time.Millisecond},
		slice("d-1", "decode", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("web", 80)}, readyAt("10.0.0.1", "a")),
		slice("d-2", "decode", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", 80)}, readyAt("10.0.0.2", "b")))
	h.waitFor(t, lists{decode: specsOf("http://10.0.0.2:80")})
	if got := h.metric(t, "duet_discovery_invalid_slices"); got != 1 {
		t.Errorf("duet_discovery_invalid_slices = %v, want 1", got)
	}
	h.remove(t, "d-1")
	eventually(t, 10*time.Second, func() bool { return h.metric(t, "duet_discovery_invalid_slices") == 0 },
		func() string { return "the invalid slice is still counted" })
}

func TestNewRejects(t *testing.T) {
	cs := fakeSlices{fake.NewClientset()}
	rec := &recorder{}
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no client", Options{Namespace: "n", Decode: Pool{Service: "d"}, Setter: rec}, "client"},
		{"no setter", Options{Client: cs, Namespace: "n", Decode: Pool{Service: "d"}}, "setter"},
		{"no namespace", Options{Client: cs, Decode: Pool{Service: "d"}, Setter: rec}, "namespace"},
		{"same service", Options{Client: cs, Namespace: "n", Decode: Pool{Service: "d"}, Prefill: &Pool{Service: "d"}, Setter: rec}, "both prefill and decode"},
		{"bad service", Options{Client: cs, Namespace: "n", Decode: Pool{Service: "not a name"}, Setter: rec}, "service names"},
		{"no service", Options{Client: cs, Namespace: "n", Setter: rec}, "names no service"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v, want an error about %s", err, tt.want)
			}
		})
	}
}
