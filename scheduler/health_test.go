package scheduler

import (
	"context"
	"errors"
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
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest/observer"
)

// fakeClock is a settable clock for Scheduler.now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now()} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// healthFixture is a discovered scheduler on fake engines with a fake
// clock, metrics, observed logs and the ejections OnEject received.
type healthFixture struct {
	s       *Scheduler
	clock   *fakeClock
	reg     *prometheus.Registry
	logs    *observer.ObservedLogs
	prefill []*fakeEngine
	decode  []*fakeEngine

	mu        sync.Mutex
	ejections []Ejection
}

// healthEngine is a fake engine with dp ranks whose /health answers 200.
func healthEngine(t *testing.T, dp int, mode string) *fakeEngine {
	t.Helper()
	return newFakeEngine(t, map[string]response{"/server_info": ok(info(dp, mode, 9000)), "/health": ok("")})
}

// newHealthFixture builds the fixture over nPrefill and nDecode engines of
// dp ranks each, with round_robin policies and scraping disabled (tests
// scrape by hand).
func newHealthFixture(t *testing.T, hc HealthConfig, nPrefill, nDecode, dp int) *healthFixture {
	t.Helper()
	f := &healthFixture{clock: newFakeClock(), reg: prometheus.NewRegistry()}
	cfg := Config{Health: hc, Registerer: f.reg, Load: LoadConfig{Interval: -1}}
	cfg.OnEject = func(e Ejection) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.ejections = append(f.ejections, e)
	}
	for range nPrefill {
		e := healthEngine(t, dp, "prefill")
		f.prefill = append(f.prefill, e)
		cfg.Prefill = append(cfg.Prefill, EndpointSpec{URL: e.url()})
	}
	for range nDecode {
		e := healthEngine(t, dp, "decode")
		f.decode = append(f.decode, e)
		cfg.Decode = append(cfg.Decode, EndpointSpec{URL: e.url()})
	}
	log, logs := observedLogger()
	f.logs = logs
	f.s = newTestScheduler(t, cfg, log)
	f.s.now = f.clock.now
	mustDiscover(t, f.s)
	return f
}

// target names rank of e as a leg's feedback does.
func target(e *fakeEngine, rank int) string {
	if rank == NoRank {
		return e.addr() + "/dp-"
	}
	return e.addr() + "/dp" + strconv.Itoa(rank)
}

// Leg outcomes for healthFixture.leg.
const (
	legOK = iota
	legFailed
	legUnreachable
)

// leg reports one leg's outcome on rank of the host at addr.
func (f *healthFixture) leg(role Role, addr string, rank int, outcome int) {
	f.s.Complete(Feedback{
		RequestID: "r", Role: role, Address: addr, Rank: rank,
		Failed: outcome != legOK, Unreachable: outcome == legUnreachable,
	})
}

// ejected reports whether picks skip rank of e now.
func (f *healthFixture) ejected(t *testing.T, role Role, e *fakeEngine, rank int) bool {
	t.Helper()
	p := f.s.snap.Load().pool(role)
	i, ok := p.index[TargetKey{URL: e.url(), Rank: rank}]
	if !ok {
		t.Fatalf("no target %s rank %d", e.url(), rank)
	}
	return p.states[i].ejected(f.clock.now().UnixNano())
}

// picks runs n picks, each released at once, and counts the decode (and
// prefill) targets chosen.
func (f *healthFixture) picks(t *testing.T, n int) (prefill, decode map[string]int) {
	t.Helper()
	prefill, decode = map[string]int{}, map[string]int{}
	for i := range n {
		id := fmt.Sprint("pick-", i)
		d, err := f.s.Pick(testContext(t), &Request{ID: id})
		if err != nil {
			t.Fatalf("Pick: %v", err)
		}
		decode[d.Decode.String()]++
		if d.Prefill != nil {
			prefill[d.Prefill.String()]++
		}
		f.s.Complete(Feedback{RequestID: id})
	}
	return prefill, decode
}

// got returns the ejections OnEject received so far.
func (f *healthFixture) got() []Ejection {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Ejection(nil), f.ejections...)
}

// Each signal ejects after its threshold of consecutive failures, not one
// earlier; a success in the run starts the count again. Unreachable legs,
// scrapes and probes eject the whole endpoint; failed legs one target.
func TestHealthThresholds(t *testing.T) {
	tests := []struct {
		name      string
		cfg       HealthConfig
		threshold int
		fail      func(t *testing.T, f *healthFixture)
		succeed   func(t *testing.T, f *healthFixture) // nil: no reset to check
		endpoint  bool                                 // the whole endpoint is ejected, not rank 1 alone
		reason    string
	}{
		{
			name: "unreachable legs (default 1)", threshold: 1, endpoint: true, reason: ReasonUnreachable,
			fail: func(t *testing.T, f *healthFixture) { f.leg(RoleDecode, f.decode[0].addr(), 1, legUnreachable) },
		},
		{
			name: "unreachable legs (3)", cfg: HealthConfig{UnreachableToEject: 3}, threshold: 3, endpoint: true, reason: ReasonUnreachable,
			fail:    func(t *testing.T, f *healthFixture) { f.leg(RoleDecode, f.decode[0].addr(), 1, legUnreachable) },
			succeed: func(t *testing.T, f *healthFixture) { f.leg(RoleDecode, f.decode[0].addr(), 0, legOK) },
		},
		{
			name: "a leg that reached the engine breaks a run of unreachable ones", cfg: HealthConfig{UnreachableToEject: 2}, threshold: 2, endpoint: true, reason: ReasonUnreachable,
			fail:    func(t *testing.T, f *healthFixture) { f.leg(RoleDecode, f.decode[0].addr(), 1, legUnreachable) },
			succeed: func(t *testing.T, f *healthFixture) { f.leg(RoleDecode, f.decode[0].addr(), 0, legFailed) },
		},
		{
			name: "failed legs on a target (default 5)", threshold: 5, reason: ReasonFailures,
			fail:    func(t *testing.T, f *healthFixture) { f.leg(RoleDecode, f.decode[0].addr(), 1, legFailed) },
			succeed: func(t *testing.T, f *healthFixture) { f.leg(RoleDecode, f.decode[0].addr(), 1, legOK) },
		},
		{
			name: "scrapes without an answer (default 2)", threshold: 2, endpoint: true, reason: ReasonScrape,
			fail: func(t *testing.T, f *healthFixture) {
				f.decode[0].set(map[string]response{"/v1/loads": {status: dropConnection}})
				f.s.ScrapeLoads(testContext(t))
			},
			succeed: func(t *testing.T, f *healthFixture) {
				f.decode[0].set(map[string]response{"/v1/loads": {status: http.StatusInternalServerError}})
				f.s.ScrapeLoads(testContext(t))
			},
		},
		{
			name: "failed probes (default 2)", threshold: 2, endpoint: true, reason: ReasonProbe,
			fail: func(t *testing.T, f *healthFixture) {
				f.decode[0].set(map[string]response{"/health": {status: http.StatusServiceUnavailable}})
				f.s.probeHealth(testContext(t))
			},
			succeed: func(t *testing.T, f *healthFixture) {
				f.decode[0].set(map[string]response{"/health": ok("")})
				f.s.probeHealth(testContext(t))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHealthFixture(t, tt.cfg, 0, 2, 2)
			check := func(when string, want bool) {
				t.Helper()
				if got := f.ejected(t, RoleDecode, f.decode[0], 1); got != want {
					t.Fatalf("%s: rank 1 ejected = %v, want %v", when, got, want)
				}
				if got := f.ejected(t, RoleDecode, f.decode[0], 0); got != (want && tt.endpoint) {
					t.Fatalf("%s: rank 0 ejected = %v, want %v", when, got, want && tt.endpoint)
				}
				if f.ejected(t, RoleDecode, f.decode[1], 0) || f.ejected(t, RoleDecode, f.decode[1], 1) {
					t.Fatalf("%s: the other engine was ejected", when)
				}
			}
			if tt.succeed != nil {
				for range tt.threshold - 1 {
					tt.fail(t, f)
				}
				tt.succeed(t, f)
			}
			for range tt.threshold - 1 {
				tt.fail(t, f)
			}
			check(fmt.Sprintf("after %d failures", tt.threshold-1), false)
			tt.fail(t, f)
			check(fmt.Sprintf("after %d failures", tt.threshold), true)
			got := f.got()
			if len(got) != 1 || got[0].Reason != tt.reason {
				t.Fatalf("OnEject got %+v, want one ejection for %s", got, tt.reason)
			}
		})
	}
}

// A negative threshold turns a signal off.
func TestHealthThresholdDisabled(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{UnreachableToEject: -1, FailuresToEject: -1}, 0, 1, 1)
	for range 20 {
		f.leg(RoleDecode, f.decode[0].addr(), NoRank, legUnreachable)
		f.leg(RoleDecode, f.decode[0].addr(), NoRank, legFailed)
	}
	if f.ejected(t, RoleDecode, f.decode[0], NoRank) {
		t.Error("ejected with its signals disabled")
	}
}

// Ejections last BaseEjection × 2^k, k being the ejections in a row,
// capped at MaxEjection.
func TestEjectionDuration(t *testing.T) {
	h := newHealth(HealthConfig{}, nil)
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 2 * time.Minute, 2 * time.Minute}
	for k, w := range want {
		if got := h.duration(k); got != w {
			t.Errorf("duration(%d) = %v, want %v", k, got, w)
		}
	}
	if got := h.duration(200); got != 2*time.Minute {
		t.Errorf("duration(200) = %v, want the 2m cap (no overflow)", got)
	}
	odd := newHealth(HealthConfig{BaseEjection: 3 * time.Second, MaxEjection: 10 * time.Second}, nil)
	for k, w := range []time.Duration{3 * time.Second, 6 * time.Second, 10 * time.Second, 10 * time.Second} {
		if got := odd.duration(k); got != w {
			t.Errorf("base 3s max 10s: duration(%d) = %v, want %v", k, got, w)
		}
	}
	small := newHealth(HealthConfig{BaseEjection: time.Minute, MaxEjection: time.Second}, nil)
	if got := small.duration(0); got != time.Minute {
		t.Errorf("MaxEjection below BaseEjection: duration(0) = %v, want the base", got)
	}
}

// An ejection ends in half-open: pickable again. The next failure re-ejects
// at once for twice as long; the next success recovers and resets the
// doubling. Failures during the ejection are not counted.
func TestHalfOpenReejectAndRecovery(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{}, 0, 1, 2)
	e := f.decode[0]
	fail := func() { f.leg(RoleDecode, e.addr(), 0, legUnreachable) }
	wantFor := func(want ...time.Duration) {
		t.Helper()
		got := f.got()
		if len(got) != len(want) {
			t.Fatalf("ejections %+v, want %d", got, len(want))
		}
		for i, w := range want {
			if got[i].For != w {
				t.Errorf("ejection %d lasts %v, want %v", i, got[i].For, w)
			}
		}
	}

	fail()
	wantFor(5 * time.Second)
	fail() // while ejected: ignored
	wantFor(5 * time.Second)
	f.clock.advance(5*time.Second - time.Nanosecond)
	if !f.ejected(t, RoleDecode, e, 0) {
		t.Fatal("pickable before the ejection ended")
	}
	f.clock.advance(time.Nanosecond)
	if f.ejected(t, RoleDecode, e, 0) || f.ejected(t, RoleDecode, e, 1) {
		t.Fatal("not pickable once the ejection ended (half-open)")
	}
	if _, d := f.picks(t, 2); len(d) != 2 {
		t.Errorf("half-open picks reached %v, want both ranks", d)
	}
	fail() // half-open: re-ejected at once, doubled
	wantFor(5*time.Second, 10*time.Second)
	f.clock.advance(10 * time.Second)
	fail()
	wantFor(5*time.Second, 10*time.Second, 20*time.Second)
	f.clock.advance(20 * time.Second)
	f.leg(RoleDecode, e.addr(), 1, legOK) // recovers
	if f.ejected(t, RoleDecode, e, 0) {
		t.Fatal("ejected after recovery")
	}
	fail() // healthy again: the doubling starts over
	wantFor(5*time.Second, 10*time.Second, 20*time.Second, 5*time.Second)

	// A target ejected for failures needs its threshold again after a
	// recovery, but only one failure while half-open.
	g := newHealthFixture(t, HealthConfig{FailuresToEject: 3}, 0, 1, 2)
	tg := g.decode[0].addr()
	for range 3 {
		g.leg(RoleDecode, tg, 1, legFailed)
	}
	g.clock.advance(5 * time.Second)
	g.leg(RoleDecode, tg, 1, legFailed)
	if !g.ejected(t, RoleDecode, g.decode[0], 1) {
		t.Fatal("a failure while half-open did not re-eject")
	}
	g.clock.advance(10 * time.Second)
	g.leg(RoleDecode, tg, 1, legOK)
	for range 2 {
		g.leg(RoleDecode, tg, 1, legFailed)
	}
	if g.ejected(t, RoleDecode, g.decode[0], 1) {
		t.Fatal("ejected below the threshold after a recovery")
	}
}

// Half-open and recovery are logged at info level, ejections at warn with
// their details.
func TestHealthLogs(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{FailuresToEject: 2}, 0, 1, 2)
	tg := target(f.decode[0], 1)
	f.leg(RoleDecode, f.decode[0].addr(), 1, legFailed)
	f.leg(RoleDecode, f.decode[0].addr(), 1, legFailed)
	warn := f.logs.FilterMessage("target ejected").All()
	if len(warn) != 1 {
		t.Fatalf("warnings %v, want one", f.logs.All())
	}
	fields := warn[0].ContextMap()
	if fields["target"] != tg || fields["reason"] != ReasonFailures || fields["consecutive_failures"] != int64(2) ||
		fields["duration"] != 5*time.Second || fields["role"] != "decode" || fields["endpoint"] != f.decode[0].url() {
		t.Errorf("ejection logged with %v", fields)
	}
	f.clock.advance(5 * time.Second)
	f.s.sweepHealth()
	if n := f.logs.FilterMessage("target half-open: pickable again, on probation").Len(); n != 1 {
		t.Errorf("%d half-open logs, want 1", n)
	}
	f.leg(RoleDecode, f.decode[0].addr(), 1, legOK)
	if n := f.logs.FilterMessage("target recovered").Len(); n != 1 {
		t.Errorf("%d recovery logs, want 1", n)
	}
}

// Picks skip ejected targets and the targets of ejected endpoints; when a
// role has nothing left the pick fails fast with ErrNoEndpoints, naming the
// role, without running any policy or reserving anything.
func TestPickSkipsEjected(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{FailuresToEject: 1}, 1, 2, 2)
	a, b := f.decode[0], f.decode[1]
	f.leg(RoleDecode, a.addr(), 1, legFailed) // target a/dp1
	_, decode := f.picks(t, 30)
	if len(decode) != 3 || decode[target(a, 1)] != 0 {
		t.Fatalf("with a/dp1 ejected, picks went to %v", decode)
	}
	f.leg(RoleDecode, b.addr(), 0, legUnreachable) // all of b
	_, decode = f.picks(t, 10)
	if len(decode) != 1 || decode[target(a, 0)] != 10 {
		t.Fatalf("with a/dp1 and b ejected, picks went to %v", decode)
	}

	f.leg(RoleDecode, a.addr(), 0, legUnreachable)
	_, err := f.s.Pick(testContext(t), &Request{ID: "x"})
	if !errors.Is(err, ErrNoEndpoints) || !strings.Contains(err.Error(), "decode") || !strings.Contains(err.Error(), "ejected") {
		t.Fatalf("Pick with every decode target ejected = %v, want ErrNoEndpoints naming decode and the ejection", err)
	}
	if !f.s.Ready() {
		t.Error("ejections made the scheduler unready")
	}

	// A decode-only pick still needs decode; with decode back and the
	// prefill pool ejected, a PD pick fails on prefill.
	f.clock.advance(5 * time.Second)
	p := f.prefill[0]
	f.leg(RolePrefill, p.addr(), 0, legUnreachable)
	_, err = f.s.Pick(testContext(t), &Request{ID: "y"})
	if !errors.Is(err, ErrNoEndpoints) || !strings.Contains(err.Error(), "prefill") {
		t.Fatalf("Pick with the prefill pool ejected = %v, want ErrNoEndpoints naming prefill", err)
	}
	f.s.ledger.mu.Lock()
	n := len(f.s.ledger.requests)
	f.s.ledger.mu.Unlock()
	if n != 0 {
		t.Errorf("failed picks left %d reservations", n)
	}
	if d, err := f.s.Pick(testContext(t), &Request{ID: "z", DecodeOnly: true}); err != nil || d.Decode.Endpoint == nil {
		t.Errorf("decode-only pick with prefill ejected = %v, %v", d, err)
	}
}

// Feedback naming no known target is ignored for health.
func TestHealthIgnoresUnknownTargets(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{FailuresToEject: 1}, 0, 1, 2)
	e := f.decode[0]
	for _, tg := range []struct {
		addr string
		rank int
	}{
		{"10.255.255.1:1", 0}, // unknown address
		{e.addr(), 7},         // unknown rank: not a target, and not unreachable
		{e.addr(), NoRank},    // a dp-2 engine has no NoRank target
		{"", 0},               // no host reached
	} {
		f.leg(RoleDecode, tg.addr, tg.rank, legFailed)
	}
	f.leg(RolePrefill, e.addr(), 0, legUnreachable) // wrong role
	if got := f.got(); len(got) != 0 {
		t.Errorf("ejections from unknown targets: %+v", got)
	}
}

// OnEject receives the role, URL, address, rank (NoRank for a whole
// endpoint), reason and duration of each ejection.
func TestOnEject(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{FailuresToEject: 1, BaseEjection: 2 * time.Second}, 1, 1, 2)
	p, d := f.prefill[0], f.decode[0]
	// Complete returns the ejections its leg caused, for the leg's trace.
	var returned []Ejection
	for _, leg := range []Feedback{
		{RequestID: "r", Role: RoleDecode, Address: d.addr(), Rank: 1, Failed: true},
		{RequestID: "r", Role: RolePrefill, Address: p.addr(), Rank: 0, Failed: true, Unreachable: true},
		{RequestID: "r", Role: RoleDecode, Address: d.addr(), Rank: 0},
	} {
		returned = append(returned, f.s.Complete(leg)...)
	}
	want := []Ejection{
		{Role: RoleDecode, URL: d.url(), Address: d.addr(), Rank: 1, Reason: ReasonFailures, For: 2 * time.Second},
		{Role: RolePrefill, URL: p.url(), Address: p.addr(), Rank: NoRank, Reason: ReasonUnreachable, For: 2 * time.Second},
	}
	got := f.got()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("OnEject got\n%+v\nwant\n%+v", got, want)
	}
	if fmt.Sprint(returned) != fmt.Sprint(want) {
		t.Errorf("Complete returned\n%+v\nwant\n%+v", returned, want)
	}
}

// OnEject runs outside the scheduler's locks: it may call back into the
// scheduler.
func TestOnEjectMayCallScheduler(t *testing.T) {
	eng := healthEngine(t, 1, "")
	var s *Scheduler
	done := make(chan struct{})
	s = newTestScheduler(t, Config{
		Decode: []EndpointSpec{{URL: eng.url()}},
		OnEject: func(Ejection) {
			_, err := s.Pick(testContext(t), &Request{ID: "in-hook"})
			s.Complete(Feedback{RequestID: "in-hook", Role: RoleDecode, Address: eng.addr(), Rank: NoRank})
			_ = s.Endpoints()
			if !errors.Is(err, ErrNoEndpoints) {
				t.Errorf("Pick from OnEject = %v, want ErrNoEndpoints", err)
			}
			close(done)
		},
	}, nil)
	mustDiscover(t, s)
	s.Complete(Feedback{RequestID: "r", Role: RoleDecode, Address: eng.addr(), Rank: NoRank, Failed: true, Unreachable: true})
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("OnEject not called (or deadlocked)")
	}
}

// Probes: a 200 is a success, a 503 or a closed port a failure; ejected
// endpoints are probed too, and a 200 after the backoff re-admits.
func TestHealthProbes(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{}, 0, 1, 2)
	e := f.decode[0]
	// A closed port, ready from its configured DP size.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + lis.Addr().String()
	lis.Close()
	g := &healthFixture{clock: f.clock, reg: prometheus.NewRegistry()}
	log, logs := observedLogger()
	g.logs = logs
	g.s = newTestScheduler(t, Config{
		Decode:     []EndpointSpec{{URL: e.url()}, {URL: closed, DPSize: 1}},
		Health:     HealthConfig{Timeout: 500 * time.Millisecond},
		Registerer: g.reg,
		Load:       LoadConfig{Interval: -1},
	}, log)
	g.s.now = g.clock.now
	_ = g.s.Discover(testContext(t))
	g.decode = []*fakeEngine{e}

	probe := func() { g.s.probeHealth(testContext(t)) }
	probes := func(url, outcome string) float64 {
		return testutil.ToFloat64(g.s.metrics.probes.WithLabelValues("decode", url, outcome))
	}
	closedEjected := func() bool {
		p := g.s.snap.Load().decode
		return p.states[p.index[TargetKey{URL: closed, Rank: NoRank}]].ejected(g.clock.now().UnixNano())
	}

	probe()
	if g.ejected(t, RoleDecode, e, 0) || closedEjected() {
		t.Fatal("ejected after one failed probe")
	}
	e.set(map[string]response{"/server_info": ok(info(2, "decode", -1)), "/health": {status: http.StatusServiceUnavailable}})
	probe()
	probe()
	if !g.ejected(t, RoleDecode, e, 0) || !g.ejected(t, RoleDecode, e, 1) || !closedEjected() {
		t.Fatal("not ejected after two failed probes (503, closed port)")
	}
	e.set(map[string]response{"/server_info": ok(info(2, "decode", -1)), "/health": ok("")})
	probe() // before the backoff elapsed: no re-admission
	if !g.ejected(t, RoleDecode, e, 0) {
		t.Fatal("a 200 re-admitted before the backoff elapsed")
	}
	g.clock.advance(5 * time.Second)
	probe() // the closed port fails again while half-open: re-ejected for 10s
	if g.ejected(t, RoleDecode, e, 0) || !closedEjected() {
		t.Fatal("after the backoff: the 200 engine should be back, the closed port re-ejected")
	}
	if got := probes(e.url(), "ok"); got != 3 {
		t.Errorf("ok probes of the engine = %v, want 3", got)
	}
	if got := probes(e.url(), "failed"); got != 2 {
		t.Errorf("failed probes of the engine = %v, want 2", got)
	}
	if got := probes(closed, "failed"); got != 5 {
		t.Errorf("failed probes of the closed port = %v, want 5 (ejected endpoints are probed too)", got)
	}
	if got := testutil.ToFloat64(g.s.metrics.ejections.WithLabelValues("decode", closed, ReasonProbe)); got != 2 {
		t.Errorf("probe ejections of the closed port = %v, want 2", got)
	}
	if got := testutil.ToFloat64(g.s.metrics.recoveries.WithLabelValues("decode", e.url())); got != 1 {
		t.Errorf("recoveries of the engine = %v, want 1", got)
	}
}

// A probe ejection is not cleared by a scrape that gets an answer: an
// engine can serve its loads while its /health fails. A successful leg or
// a 200 probe clears it.
func TestScrapeDoesNotClearProbeEjection(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{}, 0, 1, 1)
	e := f.decode[0]
	loads := `{"loads":[{"dp_rank":0,"num_used_tokens":1,"num_total_tokens":1}]}`
	e.set(map[string]response{"/v1/loads": ok(loads), "/health": {status: http.StatusServiceUnavailable}})
	f.s.probeHealth(testContext(t))
	f.s.probeHealth(testContext(t))
	f.clock.advance(5 * time.Second)
	f.s.ScrapeLoads(testContext(t))
	if n := testutil.ToFloat64(f.s.metrics.recoveries.WithLabelValues("decode", e.url())); n != 0 {
		t.Fatalf("a scrape recovered a probe ejection")
	}
	f.s.probeHealth(testContext(t)) // still 503 while half-open: re-ejected
	if !f.ejected(t, RoleDecode, e, NoRank) {
		t.Fatal("a failed probe while half-open did not re-eject")
	}
}

// Scrapes that get no answer eject the endpoint; scrapes answered with an
// HTTP error or an unparsable payload only leave the loads stale.
func TestScrapeHealth(t *testing.T) {
	tests := []struct {
		name      string
		loads     response
		wantEject bool
	}{
		{"connection dropped", response{status: dropConnection}, true},
		{"HTTP 500", response{status: http.StatusInternalServerError, body: "boom"}, false},
		{"garbage", ok("{not json"), false},
		{"no ranks", ok(`{"loads":[]}`), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHealthFixture(t, HealthConfig{}, 0, 1, 2)
			e := f.decode[0]
			e.set(map[string]response{"/server_info": ok(info(2, "decode", -1)), "/v1/loads": tt.loads})
			for range 4 {
				f.s.ScrapeLoads(testContext(t))
			}
			if got := f.ejected(t, RoleDecode, e, 0); got != tt.wantEject {
				t.Fatalf("ejected = %v, want %v", got, tt.wantEject)
			}
			if got := testutil.ToFloat64(f.s.metrics.scrapeErrors.WithLabelValues("decode", e.url())); got != 4 {
				t.Errorf("scrape errors = %v, want 4", got)
			}
			wantEjections := 0.0
			if tt.wantEject {
				wantEjections = 1 // the scrapes during the ejection do not count
			}
			if got := testutil.ToFloat64(f.s.metrics.ejections.WithLabelValues("decode", e.url(), ReasonScrape)); got != wantEjections {
				t.Errorf("scrape ejections = %v, want %v", got, wantEjections)
			}
		})
	}
}

// A scrape that times out is a slow /v1/loads, not a dead engine: loads go
// stale but nothing is ejected (a hung engine fails its /health probe).
func TestScrapeTimeoutDoesNotEject(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/server_info" {
			fmt.Fprint(w, info(1, "", -1))
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	s := newTestScheduler(t, Config{
		Decode: []EndpointSpec{{URL: slow.URL}},
		Load:   LoadConfig{Timeout: 20 * time.Millisecond},
		Health: HealthConfig{ProbeFailures: 1},
	}, nil)
	mustDiscover(t, s)
	for range 3 {
		s.ScrapeLoads(testContext(t))
	}
	if _, err := s.Pick(testContext(t), &Request{}); err != nil {
		t.Errorf("Pick after timed-out scrapes = %v: a slow /v1/loads must not eject the engine", err)
	}
}

// Ready waits for the first discovery round and, with scraping enabled,
// the first scrape round after it.
func TestReadyWaitsForFirstScrape(t *testing.T) {
	tests := []struct {
		name     string
		interval time.Duration
	}{
		{"scraping enabled", 0},
		{"scraping disabled", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestScheduler(t, Config{Decode: enginePool(t, 1, 2, "null"), Load: LoadConfig{Interval: tt.interval}}, nil)
			s.ScrapeLoads(testContext(t)) // before discovery: does not count
			if s.Ready() {
				t.Fatal("ready before discovery")
			}
			mustDiscover(t, s)
			if got, want := s.Ready(), tt.interval < 0; got != want {
				t.Fatalf("after discovery: Ready() = %v, want %v", got, want)
			}
			s.ScrapeLoads(testContext(t))
			if !s.Ready() {
				t.Fatal("not ready after a scrape round")
			}
		})
	}
}

// The ejection gauges are 1 from the ejection to the recovery.
func TestHealthMetrics(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{FailuresToEject: 1}, 0, 1, 2)
	e := f.decode[0]
	gauge := func(name string, labels ...string) float64 {
		t.Helper()
		switch name {
		case "endpoint":
			return testutil.ToFloat64(f.s.metrics.endpointEjected.WithLabelValues(labels...))
		default:
			return testutil.ToFloat64(f.s.metrics.targetEjected.WithLabelValues(labels...))
		}
	}
	if n, err := testutil.GatherAndCount(f.reg, "duet_endpoint_ejected"); err != nil || n != 1 {
		t.Errorf("endpoint gauges before any ejection: %d, %v; want one at 0", n, err)
	}
	f.leg(RoleDecode, e.addr(), 1, legFailed)
	f.leg(RoleDecode, e.addr(), 0, legUnreachable)
	if gauge("endpoint", "decode", e.url()) != 1 || gauge("target", "decode", target(e, 1)) != 1 {
		t.Fatal("ejection gauges not 1")
	}
	f.clock.advance(5 * time.Second)
	f.s.sweepHealth() // half-open: still 1
	if gauge("endpoint", "decode", e.url()) != 1 {
		t.Fatal("endpoint gauge dropped at half-open")
	}
	f.leg(RoleDecode, e.addr(), 1, legOK)
	if gauge("endpoint", "decode", e.url()) != 0 || gauge("target", "decode", target(e, 1)) != 0 {
		t.Fatal("ejection gauges not 0 after recovery")
	}
	for _, c := range []struct {
		reason string
		want   float64
	}{{ReasonFailures, 1}, {ReasonUnreachable, 1}, {ReasonProbe, 0}} {
		if got := testutil.ToFloat64(f.s.metrics.ejections.WithLabelValues("decode", e.url(), c.reason)); got != c.want {
			t.Errorf("ejections{reason=%s} = %v, want %v", c.reason, got, c.want)
		}
	}
	if got := testutil.ToFloat64(f.s.metrics.recoveries.WithLabelValues("decode", e.url())); got != 2 {
		t.Errorf("recoveries = %v, want 2 (the endpoint and the target)", got)
	}
}

// Run probes on its own and re-admits once the engine answers 200 again.
func TestRunProbes(t *testing.T) {
	e := newFakeEngine(t, map[string]response{"/server_info": ok(info(1, "", -1)), "/health": {status: http.StatusServiceUnavailable}})
	s := newTestScheduler(t, Config{
		Decode: []EndpointSpec{{URL: e.url()}},
		Load:   LoadConfig{Interval: -1},
		Health: HealthConfig{Interval: 5 * time.Millisecond, BaseEjection: 20 * time.Millisecond, ProbeFailures: 1},
	}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	pickErr := func() error {
		_, err := s.Pick(testContext(t), &Request{})
		return err
	}
	waitUntil(t, "ejection", func() bool { return s.Ready() && errors.Is(pickErr(), ErrNoEndpoints) })
	e.set(map[string]response{"/server_info": ok(info(1, "", -1)), "/health": ok("")})
	waitUntil(t, "re-admission", func() bool { return pickErr() == nil })
}

// waitUntil polls cond for up to 10 seconds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
