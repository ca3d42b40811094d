package scheduler

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNewRejects(t *testing.T) {
	const a = "http://127.0.0.1:30000"
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"no decode endpoint", Config{Prefill: []EndpointSpec{{URL: a}}}, "no decode endpoint"},
		{"duplicate decode URL", Config{Decode: []EndpointSpec{{URL: a}, {URL: a}}}, `duplicate endpoint URL "` + a + `"`},
		{"duplicate across roles", Config{Prefill: []EndpointSpec{{URL: a}}, Decode: []EndpointSpec{{URL: a + "/"}}}, "duplicate endpoint URL"},
		{"duplicate by default port", Config{Decode: []EndpointSpec{{URL: "http://10.0.0.1"}, {URL: "HTTP://10.0.0.1:80/"}}}, "duplicate endpoint URL"},
		{"duplicate by hostname case", Config{Decode: []EndpointSpec{{URL: "http://engine:30000"}, {URL: "http://Engine:30000"}}}, "duplicate endpoint URL"},
		{"duplicate IPv6 spelling", Config{Decode: []EndpointSpec{{URL: "http://[::1]:30000"}, {URL: "http://[0::1]:30000"}}}, "duplicate endpoint URL"},
		{"empty URL", Config{Decode: []EndpointSpec{{}}}, "empty URL"},
		{"no scheme", Config{Decode: []EndpointSpec{{URL: "127.0.0.1:30000"}}}, "127.0.0.1:30000"},
		{"bad scheme", Config{Decode: []EndpointSpec{{URL: "grpc://127.0.0.1:30000"}}}, "not http or https"},
		{"no host", Config{Decode: []EndpointSpec{{URL: "http://:30000"}}}, "no host"},
		{"port zero", Config{Decode: []EndpointSpec{{URL: "http://127.0.0.1:0"}}}, "invalid port"},
		{"query", Config{Decode: []EndpointSpec{{URL: a + "?x=1"}}}, "no user info, query or fragment"},
		{"negative DPSize", Config{Decode: []EndpointSpec{{URL: a, DPSize: -1}}}, "DPSize -1 out of range"},
		{"bootstrap port too large", Config{Prefill: []EndpointSpec{{URL: a, BootstrapPort: 70000}}, Decode: []EndpointSpec{{URL: "http://127.0.0.1:1"}}}, "BootstrapPort 70000"},
		{"unknown decode policy", Config{Decode: []EndpointSpec{{URL: a}}, DecodePolicy: PolicySpec{Name: "fastest"}}, `decode policy: unknown policy "fastest" (valid: cache_aware, least_cost, least_tokens`},
		{"unknown prefill policy", Config{Decode: []EndpointSpec{{URL: a}}, PrefillPolicy: PolicySpec{Name: "rr"}}, `prefill policy: unknown policy "rr" (valid: cache_aware, least_cost, least_tokens`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.cfg, nil)
			if err == nil {
				t.Fatalf("New = %v, nil; want an error containing %q", s, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New error = %q, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewEndpoints(t *testing.T) {
	tests := []struct {
		url         string
		wantURL     string
		wantAddress string
		wantHost    string
	}{
		{"http://127.0.0.1:30000", "http://127.0.0.1:30000", "127.0.0.1:30000", "127.0.0.1"},
		{"http://127.0.0.1:30000/", "http://127.0.0.1:30000", "127.0.0.1:30000", "127.0.0.1"},
		{"http://10.0.0.1", "http://10.0.0.1", "10.0.0.1:80", "10.0.0.1"},
		{"https://10.0.0.1", "https://10.0.0.1", "10.0.0.1:443", "10.0.0.1"},
		{"http://[::1]:30000", "http://[::1]:30000", "[::1]:30000", "::1"},
		{"http://[2001:DB8:0::1]:30000", "http://[2001:DB8:0::1]:30000", "[2001:db8::1]:30000", "2001:DB8:0::1"},
		{"http://engine-0.svc:30000/sglang/", "http://engine-0.svc:30000/sglang", "", "engine-0.svc"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			s := newTestScheduler(t, Config{Decode: []EndpointSpec{{URL: tt.url, DPSize: 2}}}, nil)
			eps := s.Endpoints()
			if len(eps) != 1 {
				t.Fatalf("Endpoints() = %+v, want one", eps)
			}
			want := Endpoint{Role: RoleDecode, URL: tt.wantURL, Address: tt.wantAddress, BootstrapHost: tt.wantHost}
			if eps[0] != want {
				t.Errorf("before discovery: %+v, want %+v", eps[0], want)
			}
		})
	}
}

func TestEndpointsOrderAndCopy(t *testing.T) {
	s := newTestScheduler(t, Config{
		Prefill: []EndpointSpec{{URL: "http://127.0.0.1:2"}, {URL: "http://127.0.0.1:1"}},
		Decode:  []EndpointSpec{{URL: "http://127.0.0.1:4"}, {URL: "http://127.0.0.1:3"}},
	}, nil)
	eps := s.Endpoints()
	var got []string
	for _, ep := range eps {
		got = append(got, string(ep.Role)+" "+ep.URL)
	}
	want := []string{"prefill http://127.0.0.1:2", "prefill http://127.0.0.1:1", "decode http://127.0.0.1:4", "decode http://127.0.0.1:3"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Endpoints() = %q, want %q", got, want)
	}
	eps[0].URL = "changed"
	if s.Endpoints()[0].URL == "changed" {
		t.Error("Endpoints() returned the scheduler's own slice")
	}
}

func TestTargetString(t *testing.T) {
	ep := &Endpoint{URL: "http://127.0.0.1:30001", Address: "127.0.0.1:30001"}
	unresolved := &Endpoint{URL: "http://engine:30001"}
	tests := []struct {
		target Target
		want   string
	}{
		{Target{Endpoint: ep, Rank: 1}, "127.0.0.1:30001/dp1"},
		{Target{Endpoint: ep, Rank: 0}, "127.0.0.1:30001/dp0"},
		{Target{Endpoint: ep, Rank: NoRank}, "127.0.0.1:30001/dp-"},
		{Target{Endpoint: unresolved, Rank: 0}, "http://engine:30001/dp0"},
		{Target{Rank: NoRank}, "<nil>/dp-"},
	}
	for _, tt := range tests {
		if got := tt.target.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestTargets(t *testing.T) {
	ep := func(role Role, addr string, dp int, ready bool) Endpoint {
		return Endpoint{Role: role, URL: "http://" + addr, Address: addr, DPSize: dp, Ready: ready}
	}
	tests := []struct {
		name        string
		endpoints   []Endpoint
		wantPrefill []string
		wantDecode  []string
	}{
		{
			name:       "decode dp 1 is not pinned",
			endpoints:  []Endpoint{ep(RoleDecode, "d:1", 1, true)},
			wantDecode: []string{"d:1/dp-"},
		},
		{
			name:        "prefill dp 1 is rank 0",
			endpoints:   []Endpoint{ep(RolePrefill, "p:1", 1, true), ep(RoleDecode, "d:1", 1, true)},
			wantPrefill: []string{"p:1/dp0"},
			wantDecode:  []string{"d:1/dp-"},
		},
		{
			name:        "dp > 1 has every rank",
			endpoints:   []Endpoint{ep(RolePrefill, "p:1", 2, true), ep(RoleDecode, "d:1", 4, true)},
			wantPrefill: []string{"p:1/dp0", "p:1/dp1"},
			wantDecode:  []string{"d:1/dp0", "d:1/dp1", "d:1/dp2", "d:1/dp3"},
		},
		{
			name:       "rank-major over endpoints of different sizes",
			endpoints:  []Endpoint{ep(RoleDecode, "a:1", 2, true), ep(RoleDecode, "b:1", 1, true), ep(RoleDecode, "c:1", 3, true)},
			wantDecode: []string{"a:1/dp0", "b:1/dp-", "c:1/dp0", "a:1/dp1", "c:1/dp1", "c:1/dp2"},
		},
		{
			name:       "endpoints that are not ready have no targets",
			endpoints:  []Endpoint{ep(RolePrefill, "p:1", 2, false), ep(RoleDecode, "a:1", 2, false), ep(RoleDecode, "b:1", 2, true)},
			wantDecode: []string{"b:1/dp0", "b:1/dp1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap := newSnapshot(tt.endpoints, false, newLedger(0, 0, 0), nil, newHealth(HealthConfig{}, nil), func(TargetKey) {})
			if got := targetStrings(snap.prefill.targets); strings.Join(got, ",") != strings.Join(tt.wantPrefill, ",") {
				t.Errorf("prefill targets = %q, want %q", got, tt.wantPrefill)
			}
			if got := targetStrings(snap.decode.targets); strings.Join(got, ",") != strings.Join(tt.wantDecode, ",") {
				t.Errorf("decode targets = %q, want %q", got, tt.wantDecode)
			}
			for _, tg := range append(snap.prefill.targets, snap.decode.targets...) {
				inside := false
				for i := range snap.endpoints {
					inside = inside || tg.Endpoint == &snap.endpoints[i]
				}
				if !inside {
					t.Errorf("target %v does not point into the snapshot", tg)
				}
			}
		})
	}
}

func targetStrings(ts []Target) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.String())
	}
	return out
}

// pool starts n fake engines answering /server_info with dp ranks each and
// returns their specs.
func enginePool(t *testing.T, n, dp int, mode string) []EndpointSpec {
	t.Helper()
	specs := make([]EndpointSpec, n)
	for i := range specs {
		specs[i] = EndpointSpec{URL: newFakeEngine(t, serverInfo200(info(dp, mode, 9000+i))).url()}
	}
	return specs
}

func TestPickRoundRobin(t *testing.T) {
	tests := []struct {
		name            string
		prefillN        int
		prefillDP       int
		decodeN         int
		decodeDP        int
		wantPrefillTgts int
		wantDecodeTgts  int
	}{
		{"aggregated 2 x dp2", 0, 0, 2, 2, 0, 4},
		{"aggregated 3 x dp1", 0, 0, 3, 1, 0, 3},
		{"pd 1 x dp2 / 2 x dp2", 1, 2, 2, 2, 2, 4},
		{"pd 2 x dp1 / 1 x dp8", 2, 1, 1, 8, 2, 8},
		{"pd 3 x dp4 / 1 x dp1", 3, 4, 1, 1, 12, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Decode: enginePool(t, tt.decodeN, tt.decodeDP, "decode")}
			if tt.prefillN > 0 {
				cfg.Prefill = enginePool(t, tt.prefillN, tt.prefillDP, "prefill")
			}
			s := newTestScheduler(t, cfg, nil)
			mustDiscover(t, s)
			s.ScrapeLoads(testContext(t)) // Ready waits for a first scrape round
			if !s.Ready() || s.PD() != (tt.prefillN > 0) {
				t.Fatalf("Ready, PD = %v, %v", s.Ready(), s.PD())
			}
			const rounds = 24 // a multiple of every target count above
			prefill, decode := map[string]int{}, map[string]int{}
			ctx := testContext(t)
			picks := rounds * max(tt.wantPrefillTgts, tt.wantDecodeTgts)
			for range picks {
				d, err := s.Pick(ctx, &Request{ID: "r", Path: "/generate"})
				if err != nil {
					t.Fatalf("Pick: %v", err)
				}
				decode[d.Decode.String()]++
				if (d.Prefill != nil) != s.PD() {
					t.Fatalf("Prefill = %v with PD() = %v", d.Prefill, s.PD())
				}
				if d.Prefill != nil {
					prefill[d.Prefill.String()]++
				}
			}
			checkEven(t, "prefill", prefill, tt.wantPrefillTgts, picks)
			checkEven(t, "decode", decode, tt.wantDecodeTgts, picks)
		})
	}
}

// checkEven checks that picks were spread exactly evenly over n targets.
func checkEven(t *testing.T, role string, counts map[string]int, n, picks int) {
	t.Helper()
	if len(counts) != n {
		t.Errorf("%s: %d targets picked, want %d: %v", role, len(counts), n, counts)
		return
	}
	for tg, c := range counts {
		if c != picks/n {
			t.Errorf("%s: target %s picked %d times, want %d: %v", role, tg, c, picks/n, counts)
		}
	}
}

func TestPickNoEndpoints(t *testing.T) {
	bad := map[string]response{"/server_info": {status: 500}}
	tests := []struct {
		name     string
		prefill  map[string]response // nil: no prefill pool
		decode   map[string]response
		discover bool
		wantRole Role
	}{
		{"before discovery", nil, serverInfo200(info(1, "", -1)), false, RoleDecode},
		{"decode not ready", nil, bad, true, RoleDecode},
		{"decode not ready in pd", serverInfo200(info(1, "prefill", -1)), bad, true, RoleDecode},
		{"prefill not ready", bad, serverInfo200(info(1, "decode", -1)), true, RolePrefill},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Decode: []EndpointSpec{{URL: newFakeEngine(t, tt.decode).url()}}}
			if tt.prefill != nil {
				cfg.Prefill = []EndpointSpec{{URL: newFakeEngine(t, tt.prefill).url()}}
			}
			s := newTestScheduler(t, cfg, nil)
			if tt.discover {
				_ = s.Discover(testContext(t))
			}
			if s.Ready() {
				t.Error("Ready() = true, want false")
			}
			_, err := s.Pick(testContext(t), &Request{})
			if !errors.Is(err, ErrNoEndpoints) {
				t.Fatalf("Pick error = %v, want ErrNoEndpoints", err)
			}
			if !strings.Contains(err.Error(), string(tt.wantRole)) {
				t.Errorf("Pick error %q does not name role %s", err, tt.wantRole)
			}
		})
	}
}

func TestPickAggregated(t *testing.T) {
	s := newTestScheduler(t, Config{Decode: enginePool(t, 1, 2, "null")}, nil)
	mustDiscover(t, s)
	if s.PD() {
		t.Error("PD() = true without a prefill pool")
	}
	d, err := s.Pick(testContext(t), nil)
	if err != nil {
		t.Fatalf("Pick: %v", err)
	}
	if d.Prefill != nil {
		t.Errorf("Prefill = %v, want nil in aggregated mode", d.Prefill)
	}
	if d.Decode.Endpoint == nil || d.Decode.Rank != 0 {
		t.Errorf("Decode = %v, want the first rank of the only endpoint", d.Decode)
	}
}

// A decode-only pick in PD mode chooses no prefill target, does not advance
// the prefill policy, and works while the prefill pool is not ready.
func TestPickDecodeOnly(t *testing.T) {
	s := newTestScheduler(t, Config{Prefill: enginePool(t, 1, 2, "prefill"), Decode: enginePool(t, 1, 1, "decode")}, nil)
	mustDiscover(t, s)
	first, err := s.Pick(testContext(t), &Request{})
	if err != nil || first.Prefill == nil {
		t.Fatalf("PD pick = %v, %v; want a prefill target", first.Prefill, err)
	}
	d, err := s.Pick(testContext(t), &Request{DecodeOnly: true})
	if err != nil || d.Prefill != nil || d.Decode.Endpoint == nil {
		t.Fatalf("decode-only pick = %+v, %v; want a decode target alone", d, err)
	}
	next, err := s.Pick(testContext(t), &Request{})
	if err != nil || next.Prefill.Rank == first.Prefill.Rank {
		t.Errorf("prefill round robin did not advance past rank %d (decode-only pick consumed a turn?)", first.Prefill.Rank)
	}

	noPrefill := newTestScheduler(t, Config{
		Prefill: []EndpointSpec{{URL: newFakeEngine(t, map[string]response{"/server_info": {status: 500}}).url()}},
		Decode:  enginePool(t, 1, 1, "decode"),
	}, nil)
	_ = noPrefill.Discover(testContext(t))
	if _, err := noPrefill.Pick(testContext(t), &Request{DecodeOnly: true}); err != nil {
		t.Errorf("decode-only pick with no ready prefill: %v", err)
	}
}

func TestPickCanceled(t *testing.T) {
	s := newTestScheduler(t, Config{Decode: enginePool(t, 1, 1, "")}, nil)
	mustDiscover(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Pick(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Pick(canceled) = %v, want context.Canceled", err)
	}
}

func TestPickConcurrent(t *testing.T) {
	s := newTestScheduler(t, Config{
		Prefill: enginePool(t, 2, 2, "prefill"),
		Decode:  enginePool(t, 2, 2, "decode"),
	}, nil)
	mustDiscover(t, s)
	ctx := testContext(t)

	const workers, perWorker = 8, 500
	var mu sync.Mutex
	prefill, decode := map[string]int{}, map[string]int{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			p, d := map[string]int{}, map[string]int{}
			for range perWorker {
				dec, err := s.Pick(ctx, &Request{})
				if err != nil {
					t.Errorf("Pick: %v", err)
					return
				}
				p[dec.Prefill.String()]++
				d[dec.Decode.String()]++
			}
			mu.Lock()
			defer mu.Unlock()
			for k, v := range p {
				prefill[k] += v
			}
			for k, v := range d {
				decode[k] += v
			}
		})
	}
	wg.Wait()
	checkEven(t, "prefill", prefill, 4, workers*perWorker)
	checkEven(t, "decode", decode, 4, workers*perWorker)
}

func TestPickDuringDiscovery(t *testing.T) {
	decode := newFakeEngine(t, serverInfo200(info(2, "decode", -1)))
	prefill := newFakeEngine(t, serverInfo200(info(2, "prefill", -1)))
	s := newTestScheduler(t, Config{
		Prefill: []EndpointSpec{{URL: prefill.url()}},
		Decode:  []EndpointSpec{{URL: decode.url()}},
	}, nil)
	mustDiscover(t, s)
	ctx := testContext(t)

	stop := make(chan struct{})
	var discovery, pickers sync.WaitGroup
	rounds := 0
	discovery.Go(func() {
		// Change the DP sizes every round so that each round publishes a
		// new snapshot while picks run.
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			decode.set(serverInfo200(info(1+i%4, "decode", -1)))
			prefill.set(serverInfo200(info(1+(i+1)%3, "prefill", -1)))
			if err := s.Discover(ctx); err != nil {
				t.Errorf("Discover: %v", err)
				return
			}
			rounds++
		}
	})
	for range 8 {
		pickers.Go(func() {
			for range 2000 {
				d, err := s.Pick(ctx, &Request{})
				if err != nil {
					t.Errorf("Pick: %v", err)
					return
				}
				checkRank(t, d.Decode)
				checkRank(t, *d.Prefill)
				_ = s.Endpoints()
				_ = s.Ready()
			}
		})
	}
	pickers.Wait()
	close(stop)
	discovery.Wait()
	t.Logf("%d discovery rounds during the picks", rounds)
}

// checkRank checks that a target's rank is valid for its endpoint.
func checkRank(t *testing.T, tg Target) {
	t.Helper()
	ep := tg.Endpoint
	switch {
	case ep == nil:
		t.Errorf("target without endpoint")
	case tg.Rank == NoRank && (ep.Role != RoleDecode || ep.DPSize != 1):
		t.Errorf("target %v: NoRank on %s endpoint with dp %d", tg, ep.Role, ep.DPSize)
	case tg.Rank != NoRank && (tg.Rank < 0 || tg.Rank >= ep.DPSize):
		t.Errorf("target %v: rank out of range for dp %d", tg, ep.DPSize)
	case tg.Rank == 0 && ep.Role == RoleDecode && ep.DPSize == 1:
		t.Errorf("target %v: decode dp 1 pinned to rank 0", tg)
	}
}

func TestRun(t *testing.T) {
	engine := newFakeEngine(t, map[string]response{"/server_info": {status: 503}})
	s := newTestScheduler(t, Config{
		Decode:            []EndpointSpec{{URL: engine.url()}},
		DiscoveryInterval: 10 * time.Millisecond,
	}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()

	waitUntil(t, "a first round", func() bool { return engine.hitCount("/server_info") >= 1 })
	if s.Ready() {
		t.Error("Ready() before the engine answers")
	}
	engine.set(serverInfo200(info(2, "", -1)))
	waitUntil(t, "readiness", s.Ready)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
