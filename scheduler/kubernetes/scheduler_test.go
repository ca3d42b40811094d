package kubernetes

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/duet-router/duet/scheduler"
)

// simEngine is a loopback engine answering /server_info as SGLang does.
type simEngine struct {
	srv  *httptest.Server
	port int32
}

func newSimEngine(t *testing.T, mode string, dp int) *simEngine {
	t.Helper()
	body := fmt.Sprintf(`{"dp_size":%d,"tp_size":1,"model_path":"m","disaggregation_mode":%q,"internal_states":[{}]}`, dp, mode)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/server_info" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	_, p, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return &simEngine{srv: srv, port: int32(n)}
}

// slice returns the engine's EndpointSlice in service, ready or not.
func (e *simEngine) slice(name, service string, ready bool) *discoveryv1.EndpointSlice {
	c := cond{ready: no}
	if ready {
		c = cond{ready: yes}
	}
	return slice(name, service, discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", e.port)},
		endpoint("127.0.0.1", name, c))
}

// targetsOf returns the status of url's targets, or nil if the scheduler
// does not know the endpoint.
func targetsOf(s *scheduler.Scheduler, url string) []scheduler.TargetStatus {
	for _, ep := range s.Status().Endpoints {
		if ep.Endpoint.URL == url {
			return ep.Targets
		}
	}
	return nil
}

// hasEndpoint reports whether the scheduler lists url.
func hasEndpoint(s *scheduler.Scheduler, url string) bool {
	for _, ep := range s.Endpoints() {
		if ep.URL == url {
			return true
		}
	}
	return false
}

// The real scheduler follows EndpointSlices: not ready until the first
// slices list both pools, then engines that leave are forgotten (their
// reservations and prefix entries go with them, picks avoid them) and
// engines that come back start afresh, all without a restart.
func TestSchedulerFollowsSlices(t *testing.T) {
	prefill := newSimEngine(t, "prefill", 1)
	a, b := newSimEngine(t, "decode", 2), newSimEngine(t, "decode", 2)
	reg := prometheus.NewRegistry()
	sched, err := scheduler.New(scheduler.Config{
		EmptyPools: true, PD: true,
		DecodePolicy: scheduler.PolicySpec{Name: "cache_aware"}, // reads the prefix index, so picks record prompts
		Load:         scheduler.LoadConfig{Interval: -1},
		Health:       scheduler.HealthConfig{Interval: -1},
		Registerer:   reg,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { sched.Run(ctx) })

	cs := fake.NewClientset()
	h := &harness{cs: cs}
	d, err := New(Options{
		Client: fakeSlices{cs}, Namespace: testNamespace, Setter: sched, Registerer: reg,
		Prefill: &Pool{Service: "prefill", Port: "http"}, Decode: Pool{Service: "decode", Port: "http"},
		Debounce: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { d.Run(ctx) })

	eventually(t, 10*time.Second, d.Synced, func() string { return "discovery never synced" })
	if sched.Ready() {
		t.Fatal("ready before any EndpointSlice")
	}
	h.create(t, a.slice("d-a", "decode", true))
	h.create(t, b.slice("d-b", "decode", true))
	time.Sleep(50 * time.Millisecond)
	if sched.Ready() {
		t.Fatal("ready without a prefill engine")
	}
	h.create(t, prefill.slice("p-a", "prefill", true))
	eventually(t, 10*time.Second, sched.Ready, func() string { return fmt.Sprintf("not ready: %+v", sched.Endpoints()) })

	// Requests with prompts land on both decode engines and stay reserved.
	prompt := func(i int) []byte { return []byte(strings.Repeat(fmt.Sprintf("conversation %d says hello. ", i), 20)) }
	seen := map[string]int{}
	for i := range 8 {
		dec, err := sched.Pick(ctx, &scheduler.Request{ID: fmt.Sprintf("r%d", i), Prompt: prompt(i)})
		if err != nil {
			t.Fatal(err)
		}
		seen[dec.Decode.Endpoint.URL]++
	}
	if seen[a.srv.URL] == 0 || seen[b.srv.URL] == 0 {
		t.Fatalf("picks %v, want both decode engines", seen)
	}
	var reserved, blocks int64
	for _, ts := range targetsOf(sched, a.srv.URL) {
		reserved += ts.Load.Reserved
		blocks += int64(ts.PrefixBlocks)
	}
	if reserved == 0 || blocks == 0 {
		t.Fatalf("engine a: %d reserved tokens, %d prefix blocks before it leaves", reserved, blocks)
	}

	// a turns not ready: it leaves the scheduler, picks avoid it.
	h.update(t, a.slice("d-a", "decode", false))
	eventually(t, 10*time.Second, func() bool { return !hasEndpoint(sched, a.srv.URL) },
		func() string { return "engine a is still scheduled" })
	for i := range 8 {
		dec, err := sched.Pick(ctx, &scheduler.Request{ID: fmt.Sprintf("s%d", i), Prompt: prompt(i)})
		if err != nil {
			t.Fatal(err)
		}
		if dec.Decode.Endpoint.URL != b.srv.URL {
			t.Fatalf("picked %s after it left", dec.Decode.Endpoint.URL)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	aAddr := strings.TrimPrefix(a.srv.URL, "http://")
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "target" && strings.HasPrefix(lp.GetValue(), aAddr) && mf.GetName() == "duet_target_tokens" {
					t.Errorf("the ledger still reports %s: %v", aAddr, m)
				}
			}
		}
	}

	// a comes back: a fresh endpoint, with nothing reserved or indexed.
	h.update(t, a.slice("d-a", "decode", true))
	eventually(t, 10*time.Second, func() bool { return len(targetsOf(sched, a.srv.URL)) == 2 },
		func() string { return "engine a did not come back" })
	for _, ts := range targetsOf(sched, a.srv.URL) {
		if ts.Load.Reserved != 0 || ts.PrefixBlocks != 0 || ts.Picks != 0 {
			t.Errorf("engine a came back with %+v", ts)
		}
	}

	// Every decode engine gone: not ready, picks fail; the prefill pool stays.
	h.remove(t, "d-a")
	h.remove(t, "d-b")
	eventually(t, 10*time.Second, func() bool { return !sched.Ready() }, func() string { return "still ready" })
	if _, err := sched.Pick(ctx, &scheduler.Request{ID: "z"}); err == nil {
		t.Error("a pick succeeded without decode engines")
	}
	if !hasEndpoint(sched, prefill.srv.URL) || !sched.PD() {
		t.Errorf("prefill engine gone or PD mode lost: %+v", sched.Endpoints())
	}
}
