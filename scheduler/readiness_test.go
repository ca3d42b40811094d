package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// An engine whose disaggregation_mode contradicts its role is never a
// candidate: it is not ready, /readyz's reason names it with both modes, a
// pick that needs its role fails with ErrNoEndpoints and says why, and
// duet_endpoints_not_ready counts it. Once the engine reports the right
// mode, the next round makes it ready.
func TestDiscoverWrongMode(t *testing.T) {
	tests := []struct {
		name     string
		role     Role // the listed engine's role
		pd       bool
		mode     string // what the engine reports ("" leaves it out)
		fixed    string // the mode it reports once fixed
		wrong    bool
		expected string // ExpectedMode
	}{
		{"prefill engine listed as decode", RoleDecode, true, "prefill", "decode", true, "decode"},
		{"decode engine listed as prefill", RolePrefill, true, "decode", "prefill", true, "prefill"},
		{"aggregated engine listed as prefill", RolePrefill, true, "null", "prefill", true, "prefill"},
		{"prefill engine in an aggregated pool", RoleDecode, false, "prefill", "null", true, "null"},
		{"prefill engine as prefill", RolePrefill, true, "prefill", "", false, "prefill"},
		{"decode engine as decode", RoleDecode, true, "decode", "", false, "decode"},
		{"aggregated engine as decode of a PD pool", RoleDecode, true, "null", "", false, "decode"},
		{"aggregated engine", RoleDecode, false, "null", "", false, "null"},
		{"decode engine in an aggregated pool", RoleDecode, false, "decode", "", false, "null"},
		{"mode not reported", RolePrefill, true, "", "", false, "prefill"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine := newFakeEngine(t, serverInfo200(info(2, tt.mode, 9000)))
			other := newFakeEngine(t, serverInfo200(info(1, "decode", -1)))
			if tt.role == RoleDecode {
				other = newFakeEngine(t, serverInfo200(info(1, "prefill", 9001)))
			}
			cfg := Config{Decode: []EndpointSpec{{URL: engine.url()}}, Load: LoadConfig{Interval: -1}}
			switch {
			case tt.role == RolePrefill:
				cfg.Prefill, cfg.Decode = []EndpointSpec{{URL: engine.url()}}, []EndpointSpec{{URL: other.url()}}
			case tt.pd:
				cfg.Prefill = []EndpointSpec{{URL: other.url()}}
			}
			reg := prometheus.NewPedanticRegistry()
			cfg.Registerer = reg
			s := newTestScheduler(t, cfg, nil)
			discoverErr := s.Discover(testContext(t))

			ep := findEndpoint(t, s, engine.url())
			if ep.WrongMode != tt.wrong || ep.Ready == tt.wrong || ep.Mode != tt.mode || ep.ExpectedMode != tt.expected {
				t.Fatalf("endpoint: WrongMode %v Ready %v Mode %q ExpectedMode %q, want WrongMode %v Ready %v Mode %q ExpectedMode %q",
					ep.WrongMode, ep.Ready, ep.Mode, ep.ExpectedMode, tt.wrong, !tt.wrong, tt.mode, tt.expected)
			}
			if ep.LastError != "" || discoverErr != nil {
				t.Errorf("a wrong mode is no discovery error: LastError %q, Discover %v", ep.LastError, discoverErr)
			}
			r := s.Readiness()
			_, pickErr := s.Pick(testContext(t), &Request{ID: "r"})
			wrongGauge := testutil.ToFloat64(gaugeOf(t, reg, "duet_endpoints_not_ready", string(tt.role), NotReadyWrongMode))
			if !tt.wrong {
				if !r.Ready || r.Reason != "" || len(r.NotReady) != 0 || pickErr != nil || wrongGauge != 0 {
					t.Errorf("Readiness %+v, Pick %v, wrong_mode gauge %v: want ready, a pick, 0", r, pickErr, wrongGauge)
				}
				return
			}
			why := fmt.Sprintf("%s engine %s reports disaggregation_mode %q, expected %q", tt.role, engine.url(), tt.mode, tt.expected)
			if ep.NotReadyReason() != why {
				t.Errorf("NotReadyReason = %q, want %q", ep.NotReadyReason(), why)
			}
			wantReason := fmt.Sprintf("no usable %s engine: %s", tt.role, why)
			if r.Ready || r.Reason != wantReason || len(r.NotReady) != 1 || r.NotReady[0] != why {
				t.Errorf("Readiness = %+v, want not ready with reason %q", r, wantReason)
			}
			wantPick := fmt.Sprintf("scheduler: pick %s: no ready endpoint: 1 of 1 %s engines report a disaggregation_mode other than %q (see duet's /readyz)",
				tt.role, tt.role, tt.expected)
			if !errors.Is(pickErr, ErrNoEndpoints) || pickErr.Error() != wantPick {
				t.Errorf("Pick error = %v, want %q wrapping ErrNoEndpoints", pickErr, wantPick)
			}
			if wrongGauge != 1 {
				t.Errorf("duet_endpoints_not_ready{reason=wrong_mode} = %v, want 1", wrongGauge)
			}

			// Fixing the engine heals it at the next round.
			engine.set(serverInfo200(info(2, tt.fixed, 9000)))
			if err := s.Discover(testContext(t)); err != nil {
				t.Fatal(err)
			}
			if ep := findEndpoint(t, s, engine.url()); !ep.Ready || ep.WrongMode {
				t.Errorf("after the fix: Ready %v WrongMode %v, want ready", ep.Ready, ep.WrongMode)
			}
			if r := s.Readiness(); !r.Ready {
				t.Errorf("after the fix: %+v", r)
			}
			if _, err := s.Pick(testContext(t), &Request{ID: "r2"}); err != nil {
				t.Errorf("after the fix: Pick = %v", err)
			}
		})
	}
}

// A wrong mode reported while the engine is unreachable stays known: the
// endpoint stays out until the engine answers with the right mode.
func TestWrongModeSurvivesFailedRounds(t *testing.T) {
	engine := newFakeEngine(t, serverInfo200(info(1, "prefill", 9000)))
	s := newTestScheduler(t, Config{Decode: []EndpointSpec{{URL: engine.url()}}, Load: LoadConfig{Interval: -1}}, nil)
	_ = s.Discover(testContext(t))
	engine.set(map[string]response{"/server_info": {status: http.StatusInternalServerError}})
	_ = s.Discover(testContext(t))
	if ep := findEndpoint(t, s, engine.url()); ep.Ready || !ep.WrongMode || ep.LastError == "" {
		t.Errorf("endpoint %+v: want not ready, WrongMode, with the round's error", ep)
	}
}

// Readiness names what the scheduler waits for, at each stage.
func TestReadinessReason(t *testing.T) {
	down := "http://127.0.0.1:1" // nothing listens on port 1
	tests := []struct {
		name    string
		cfg     func(up string) Config
		rounds  int
		ready   bool
		reason  func(up string) string
		pending int // duet_endpoints_not_ready{reason=pending}, both roles
	}{
		{
			name:   "before the first round",
			cfg:    func(up string) Config { return Config{Decode: []EndpointSpec{{URL: up}}} },
			reason: func(string) string { return "first discovery round pending" },
		},
		{
			name:   "before the first scrape",
			cfg:    func(up string) Config { return Config{Decode: []EndpointSpec{{URL: up}}} },
			rounds: 1,
			reason: func(string) string { return "first load scrape pending" },
		},
		{
			name: "decode engine down",
			cfg: func(up string) Config {
				return Config{Prefill: []EndpointSpec{{URL: up}}, Decode: []EndpointSpec{{URL: down}}, Load: LoadConfig{Interval: -1}}
			},
			rounds: 1,
			reason: func(string) string {
				return "no usable decode engine: waiting for decode engine " + down + ": Get \"" + down + "/server_info\": dial tcp 127.0.0.1:1: connect: connection refused"
			},
			pending: 1,
		},
		{
			name: "one of two decode engines down",
			cfg: func(up string) Config {
				return Config{Decode: []EndpointSpec{{URL: up}, {URL: down}}, Load: LoadConfig{Interval: -1}}
			},
			rounds:  1,
			ready:   true,
			pending: 1,
		},
		{
			name: "no prefill engine listed",
			cfg: func(up string) Config {
				return Config{Decode: []EndpointSpec{{URL: up}}, EmptyPools: true, PD: true, Load: LoadConfig{Interval: -1}}
			},
			rounds: 1,
			reason: func(string) string { return "no prefill engine listed" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine := newFakeEngine(t, serverInfo200(info(1, "", 9000)))
			cfg := tt.cfg(engine.url())
			reg := prometheus.NewPedanticRegistry()
			cfg.Registerer = reg
			cfg.DiscoveryTimeout = time.Second
			s := newTestScheduler(t, cfg, nil)
			for range tt.rounds {
				_ = s.Discover(testContext(t))
			}
			r := s.Readiness()
			if r.Ready != tt.ready || r.Ready != s.Ready() {
				t.Fatalf("Readiness = %+v, Ready %v; want ready %v", r, s.Ready(), tt.ready)
			}
			if !tt.ready && r.Reason != tt.reason(engine.url()) {
				t.Errorf("Reason =\n  %q\nwant\n  %q", r.Reason, tt.reason(engine.url()))
			}
			if tt.ready && (r.Reason != "" || len(r.NotReady) != tt.pending) {
				t.Errorf("ready: %+v, want no reason and %d endpoints not ready", r, tt.pending)
			}
			var pending float64
			for _, role := range []Role{RolePrefill, RoleDecode} {
				if role == RolePrefill && !s.PD() {
					continue
				}
				pending += testutil.ToFloat64(gaugeOf(t, reg, "duet_endpoints_not_ready", string(role), NotReadyPending))
			}
			if tt.rounds > 0 && pending != float64(tt.pending) {
				t.Errorf("duet_endpoints_not_ready{reason=pending} = %v, want %d", pending, tt.pending)
			}
		})
	}
}

// gaugeOf returns the sample of name with the labels role and reason, as a
// collector for testutil.ToFloat64; it fails the test if reg has none.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, role, reason string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["role"] == role && labels["reason"] == reason {
				g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
				g.Set(m.GetGauge().GetValue())
				return g
			}
		}
	}
	t.Fatalf("no %s{role=%q,reason=%q}", name, role, reason)
	return nil
}

// The retry backoff starts at its base, doubles after each retry, stops
// once it reaches the limit and starts over when nothing is pending.
func TestRetryBackoff(t *testing.T) {
	b := retryBackoff{base: 250 * time.Millisecond, limit: 10 * time.Second}
	var got []time.Duration
	for {
		d, ok := b.next(true)
		if !ok {
			break
		}
		got = append(got, d)
		b.fired()
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("delays = %v, want %v", got, want)
	}
	if _, ok := b.next(false); ok {
		t.Error("a retry is due with nothing pending")
	}
	if d, ok := b.next(true); !ok || d != b.base {
		t.Errorf("after all became ready: next = %v, %v; want the base again", d, ok)
	}
	b.fired()
	b.reset()
	if d, _ := b.next(true); d != b.base {
		t.Errorf("after reset: next = %v, want the base", d)
	}
}

// An engine down when Run starts is served soon after it comes up, long
// before the next regular discovery round; the retries back off while it
// is down, and stop once it is ready.
func TestRunRetriesPendingEndpoints(t *testing.T) {
	engine := newFakeEngine(t, map[string]response{"/server_info": {status: http.StatusServiceUnavailable}})
	good := newFakeEngine(t, serverInfo200(info(1, "", -1)))
	s := newTestScheduler(t, Config{
		Decode:            []EndpointSpec{{URL: good.url()}, {URL: engine.url()}},
		DiscoveryInterval: time.Minute, // only the retries can find it
		Load:              LoadConfig{Interval: -1},
		Health:            HealthConfig{Interval: -1},
	}, nil)
	runFastRetries(t, s)

	// Rounds at 0, 20, 60, 140, 300 ms: about 5 in 400 ms, not 20.
	time.Sleep(400 * time.Millisecond)
	if n := engine.hitCount("/server_info"); n < 3 || n > 8 {
		t.Errorf("%d probes of the down engine in 400ms, want about 5 (backoff from 20ms)", n)
	}
	if n := good.hitCount("/server_info"); n != 1 {
		t.Errorf("the ready engine was probed %d times, want once (the first round)", n)
	}
	if r := s.Readiness(); len(r.NotReady) != 1 || !strings.HasPrefix(r.NotReady[0], "waiting for decode engine "+engine.url()+": ") {
		t.Errorf("Readiness = %+v, want the down engine named", r)
	}

	engine.set(serverInfo200(info(2, "", -1)))
	up := time.Now()
	for !findEndpoint(t, s, engine.url()).Ready {
		if time.Since(up) > 3*time.Second {
			t.Fatal("the engine is not ready 3s after it came up (the next retry is due within 640ms)")
		}
		time.Sleep(5 * time.Millisecond)
	}
	hits := engine.hitCount("/server_info")
	time.Sleep(200 * time.Millisecond)
	if n := engine.hitCount("/server_info"); n != hits {
		t.Errorf("%d more probes after the engine became ready, want none before the next regular round", n-hits)
	}
}

// An endpoint that SetEndpoints adds while it is down is retried from the
// base delay again.
func TestRunRetriesAddedEndpoints(t *testing.T) {
	good := newFakeEngine(t, serverInfo200(info(1, "", -1)))
	late := newFakeEngine(t, map[string]response{"/server_info": {status: http.StatusServiceUnavailable}})
	s := newTestScheduler(t, Config{
		Decode:            []EndpointSpec{{URL: good.url()}},
		DiscoveryInterval: time.Minute,
		Load:              LoadConfig{Interval: -1},
		Health:            HealthConfig{Interval: -1},
	}, nil)
	runFastRetries(t, s)
	for !s.Ready() {
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.SetEndpoints(testContext(t), nil, []EndpointSpec{{URL: good.url()}, {URL: late.url()}}); err != nil {
		t.Fatal(err)
	}
	late.set(serverInfo200(info(1, "", -1)))
	start := time.Now()
	for !findEndpoint(t, s, late.url()).Ready {
		if time.Since(start) > 3*time.Second {
			t.Fatal("the added engine is not ready 3s after it came up")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An engine down at start is left to discovery's retries, not to the
// health probes: it comes up without an ejection earned while it was
// down, and picks can choose it as soon as discovery finds it.
func TestEngineDownAtStartComesUpUnejected(t *testing.T) {
	down := map[string]response{
		"/server_info": {status: http.StatusServiceUnavailable},
		"/health":      {status: http.StatusServiceUnavailable},
	}
	engine := newFakeEngine(t, down)
	good := newFakeEngine(t, serverInfo200(info(1, "", -1)))
	s := newTestScheduler(t, Config{
		Decode:            []EndpointSpec{{URL: good.url()}, {URL: engine.url()}},
		DiscoveryInterval: time.Minute,
		Load:              LoadConfig{Interval: -1},
		Health:            HealthConfig{Interval: 10 * time.Millisecond, ProbeFailures: 1, BaseEjection: time.Minute, MaxEjection: time.Minute},
	}, nil)
	runFastRetries(t, s)

	time.Sleep(200 * time.Millisecond) // about 20 probe rounds
	if n := engine.hitCount("/health"); n != 0 {
		t.Errorf("the engine that discovery has not found was probed %d times", n)
	}
	if n := good.hitCount("/health"); n == 0 {
		t.Error("the ready engine was never probed")
	}

	up := serverInfo200(info(2, "", -1))
	up["/health"] = response{status: http.StatusOK}
	engine.set(up)
	key := TargetKey{URL: engine.url(), Rank: 0}
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := s.snap.Load().pool(RoleDecode).index[key]; ok {
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatal("the engine is not a target 3s after it came up")
		}
	}
	p := s.snap.Load().pool(RoleDecode)
	if p.states[p.index[key]].ejected(time.Now().UnixNano()) {
		t.Error("the engine came up ejected for the probes it failed while discovery had not found it")
	}
}

// runFastRetries runs s with retries from 20ms until the test ends.
func runFastRetries(t *testing.T, s *Scheduler) {
	t.Helper()
	s.retryBase = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}
