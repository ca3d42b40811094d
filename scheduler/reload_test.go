package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// urlsOf returns the URLs of role's schedulable targets, with their counts.
func urlsOf(s *Scheduler, role Role) map[string]int {
	got := map[string]int{}
	for _, t := range s.snap.Load().pool(role).targets {
		got[t.Endpoint.URL]++
	}
	return got
}

// specsOf lists engines as endpoint specs.
func specsOf(engines ...*fakeEngine) []EndpointSpec {
	specs := make([]EndpointSpec, len(engines))
	for i, e := range engines {
		specs[i] = EndpointSpec{URL: e.url()}
	}
	return specs
}

// pickPrompted picks n requests with a prompt each (so that the prefix
// index learns them), leaving their reservations held, and counts the
// decode URLs chosen.
func pickPrompted(t *testing.T, s *Scheduler, prefix string, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		d, err := s.Pick(testContext(t), &Request{ID: fmt.Sprintf("%s-%d", prefix, i),
			Prompt: []byte(strings.Repeat(fmt.Sprintf("prompt %s %d ", prefix, i), 20))})
		if err != nil {
			t.Fatalf("Pick: %v", err)
		}
		got[d.Decode.Endpoint.URL]++
	}
	return got
}

// SetEndpoints adds, removes and reconfigures endpoints; the snapshot then
// holds exactly the new lists' targets, and new endpoints are discovered
// before it returns.
func TestSetEndpoints(t *testing.T) {
	a := newFakeEngine(t, serverInfo200(info(2, "decode", -1)))
	b := newFakeEngine(t, serverInfo200(info(2, "decode", -1)))
	c := newFakeEngine(t, serverInfo200(info(4, "decode", -1)))
	// noInfo has no /server_info: its DP size comes from the configuration.
	noInfo := newFakeEngine(t, nil)
	p := newFakeEngine(t, serverInfo200(info(2, "prefill", 9000)))
	q := newFakeEngine(t, serverInfo200(info(1, "prefill", 9001)))

	tests := []struct {
		name            string
		prefill, decode []EndpointSpec // initial
		setPrefill      []EndpointSpec
		setDecode       []EndpointSpec
		wantPrefill     map[string]int // URL -> targets after the change
		wantDecode      map[string]int
	}{
		{
			name:        "add decode",
			decode:      specsOf(a),
			setDecode:   specsOf(a, b, c),
			wantPrefill: map[string]int{},
			wantDecode:  map[string]int{a.url(): 2, b.url(): 2, c.url(): 4},
		},
		{
			name:        "remove decode",
			decode:      specsOf(a, b, c),
			setDecode:   specsOf(c),
			wantPrefill: map[string]int{},
			wantDecode:  map[string]int{c.url(): 4},
		},
		{
			name:        "replace every decode",
			decode:      specsOf(a, b),
			setDecode:   specsOf(c),
			wantPrefill: map[string]int{},
			wantDecode:  map[string]int{c.url(): 4},
		},
		{
			name:        "add and remove prefill",
			prefill:     specsOf(p),
			decode:      specsOf(a),
			setPrefill:  specsOf(q),
			setDecode:   specsOf(a),
			wantPrefill: map[string]int{q.url(): 1},
			wantDecode:  map[string]int{a.url(): 2},
		},
		{
			name:        "change configured dp_size",
			decode:      []EndpointSpec{{URL: noInfo.url(), DPSize: 2}},
			setDecode:   []EndpointSpec{{URL: noInfo.url(), DPSize: 3}},
			wantPrefill: map[string]int{},
			wantDecode:  map[string]int{noInfo.url(): 3},
		},
		{
			name:        "same lists",
			prefill:     specsOf(p),
			decode:      specsOf(a, b),
			setPrefill:  specsOf(p),
			setDecode:   specsOf(a, b),
			wantPrefill: map[string]int{p.url(): 2},
			wantDecode:  map[string]int{a.url(): 2, b.url(): 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log, logs := observedLogger()
			s := newTestScheduler(t, Config{Prefill: tt.prefill, Decode: tt.decode, Load: LoadConfig{Interval: -1}}, log)
			_ = s.Discover(testContext(t))
			if err := s.SetEndpoints(testContext(t), tt.setPrefill, tt.setDecode); err != nil {
				t.Fatalf("SetEndpoints: %v", err)
			}
			if got := urlsOf(s, RolePrefill); fmt.Sprint(got) != fmt.Sprint(tt.wantPrefill) {
				t.Errorf("prefill targets = %v, want %v", got, tt.wantPrefill)
			}
			if got := urlsOf(s, RoleDecode); fmt.Sprint(got) != fmt.Sprint(tt.wantDecode) {
				t.Errorf("decode targets = %v, want %v", got, tt.wantDecode)
			}
			eps := s.Endpoints()
			if len(eps) != len(tt.setPrefill)+len(tt.setDecode) {
				t.Errorf("Endpoints() has %d entries, want %d", len(eps), len(tt.setPrefill)+len(tt.setDecode))
			}
			recs := *s.health.endpoints.Load()
			if len(recs) != len(eps) {
				t.Errorf("%d endpoint health records for %d endpoints", len(recs), len(eps))
			}
			for _, ep := range eps {
				if recs[ep.URL] == nil {
					t.Errorf("no health record for %s", ep.URL)
				}
			}
			if !s.Ready() {
				t.Error("not ready after the change")
			}
			// Every change is logged; an unchanged list logs nothing.
			changes := logs.FilterMessageSnippet("endpoint added").Len() +
				logs.FilterMessageSnippet("endpoint removed").Len() +
				logs.FilterMessageSnippet("endpoint configuration changed").Len()
			if (changes == 0) != (tt.name == "same lists") {
				t.Errorf("%d change log entries", changes)
			}
		})
	}
}

// Invalid lists are rejected, and leave the scheduler as it was.
func TestSetEndpointsRejects(t *testing.T) {
	a := newFakeEngine(t, serverInfo200(info(2, "decode", -1)))
	p := newFakeEngine(t, serverInfo200(info(2, "prefill", -1)))
	tests := []struct {
		name            string
		pd              bool // the scheduler has a prefill pool
		prefill, decode []EndpointSpec
		want            string
		wantErr         error
	}{
		{"aggregated to PD", false, specsOf(p), specsOf(a), "mode", ErrModeChange},
		{"PD to aggregated", true, nil, specsOf(a), "mode", ErrModeChange},
		{"no decode", true, specsOf(p), nil, "no decode endpoint", nil},
		{"duplicate decode", false, nil, []EndpointSpec{{URL: a.url()}, {URL: a.url() + "/"}}, "duplicate endpoint URL", nil},
		{"duplicate across roles", true, specsOf(p), []EndpointSpec{{URL: a.url()}, {URL: p.url()}}, "duplicate endpoint URL", nil},
		{"bad URL", false, nil, []EndpointSpec{{URL: "ftp://x"}}, "decode endpoint 0", nil},
		{"bad dp_size", false, nil, []EndpointSpec{{URL: a.url(), DPSize: -1}}, "DPSize", nil},
		{"bad bootstrap_port", true, []EndpointSpec{{URL: p.url(), BootstrapPort: 70000}}, specsOf(a), "BootstrapPort", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Decode: specsOf(a), Load: LoadConfig{Interval: -1}}
			if tt.pd {
				cfg.Prefill = specsOf(p)
			}
			s := newTestScheduler(t, cfg, nil)
			mustDiscover(t, s)
			before := s.snap.Load()
			err := s.SetEndpoints(testContext(t), tt.prefill, tt.decode)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("SetEndpoints = %v, want an error containing %q", err, tt.want)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("SetEndpoints = %v, want it to wrap %v", err, tt.wantErr)
			}
			if s.snap.Load() != before || len(s.members) != len(cfg.Prefill)+len(cfg.Decode) {
				t.Error("a rejected change changed the scheduler")
			}
		})
	}
}

// A removed endpoint's reservations and prefix entries are dropped, its
// health record retired, and picks never choose it again; the endpoints
// that stay keep their ledger entries, reservations, prefix entries and
// health.
func TestSetEndpointsRemoveKeepsOthers(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{FailuresToEject: 1, Interval: -1}, 0, 3, 2)
	s := f.s
	// A policy that reads the prefix index, so that picks record prompts in it.
	var err error
	if s.decodePolicy, err = NewPolicy(PolicySpec{Name: "cache_aware"}); err != nil {
		t.Fatal(err)
	}
	a, b, c := f.decode[0], f.decode[1], f.decode[2]
	pickPrompted(t, s, "before", 30) // distinct prompts: every target holds reservations

	// Eject a's rank 1 and all of c: health that must survive, and must go.
	f.leg(RoleDecode, a.addr(), 1, legFailed)
	f.leg(RoleDecode, c.addr(), 0, legUnreachable)
	if !f.ejected(t, RoleDecode, a, 1) || !f.ejected(t, RoleDecode, c, 0) {
		t.Fatal("ejections did not happen")
	}
	aState := s.snap.Load().decode.states[s.snap.Load().decode.index[TargetKey{URL: a.url(), Rank: 0}]]
	s.ledger.mu.Lock()
	aReserved := aState.reserved
	s.ledger.mu.Unlock()
	aEndpoint := s.health.endpoint(a.url())
	aBlocks := s.index.Blocks(TargetKey{URL: a.url(), Rank: 0})
	if aReserved == 0 || aBlocks == 0 || s.index.Blocks(TargetKey{URL: b.url(), Rank: 0}) == 0 {
		t.Fatalf("setup: a reserved %d, a blocks %d", aReserved, aBlocks)
	}
	cEndpoint := s.health.endpoint(c.url())
	unhealthy := s.health.count.Load()

	if err := s.SetEndpoints(testContext(t), nil, specsOf(a, c)); err != nil {
		t.Fatalf("SetEndpoints: %v", err)
	}
	bKeys := []TargetKey{{URL: b.url(), Rank: 0}, {URL: b.url(), Rank: 1}}
	s.ledger.mu.Lock()
	for _, k := range bKeys {
		if _, ok := s.ledger.targets[k]; ok {
			t.Errorf("ledger still has %v", k)
		}
	}
	for id, res := range s.ledger.requests {
		for _, h := range res.holds {
			if h.target.key.URL == b.url() {
				t.Errorf("request %s still holds %d tokens on %v", id, h.tokens, h.target.key)
			}
		}
	}
	gotReserved := aState.reserved
	s.ledger.mu.Unlock()
	for _, k := range bKeys {
		if n := s.index.Blocks(k); n != 0 {
			t.Errorf("prefix index still has %d blocks of %v", n, k)
		}
	}
	if s.health.endpoint(b.url()) != nil {
		t.Error("b's health record outlived b")
	}

	// a kept everything.
	snap := s.snap.Load()
	if got := snap.decode.states[snap.decode.index[TargetKey{URL: a.url(), Rank: 0}]]; got != aState || gotReserved != aReserved {
		t.Errorf("a's ledger entry: same %v, reserved %d, want %d", got == aState, gotReserved, aReserved)
	}
	if s.index.Blocks(TargetKey{URL: a.url(), Rank: 0}) != aBlocks {
		t.Error("a's prefix entries changed")
	}
	if s.health.endpoint(a.url()) != aEndpoint || s.health.endpoint(c.url()) != cEndpoint {
		t.Error("a kept endpoint lost its health record")
	}
	if !f.ejected(t, RoleDecode, a, 1) || !f.ejected(t, RoleDecode, c, 0) || s.health.count.Load() != unhealthy {
		t.Error("kept endpoints lost their ejections")
	}

	// Picks reach a/dp0 only (a/dp1 and c are ejected), never b.
	got := pickPrompted(t, s, "after", 20)
	if got[b.url()] != 0 || got[a.url()] != 20 {
		t.Errorf("picks after the removal: %v", got)
	}
	// b's late feedback and evidence are ignored.
	f.leg(RoleDecode, b.addr(), 0, legUnreachable)
	if n := len(f.got()); n != 2 {
		t.Errorf("%d ejections, want the 2 from before", n)
	}
}

// Removing an ejected endpoint takes it out of the unhealthy set, so that
// picks return to their fast path, and a late failure reported on its old
// record changes nothing.
func TestSetEndpointsRemoveEjected(t *testing.T) {
	f := newHealthFixture(t, HealthConfig{Interval: -1}, 0, 2, 2)
	s := f.s
	a, b := f.decode[0], f.decode[1]
	f.leg(RoleDecode, b.addr(), 0, legUnreachable)
	old := s.health.endpoint(b.url())
	if s.health.count.Load() != 1 {
		t.Fatalf("unhealthy count %d, want 1", s.health.count.Load())
	}
	if err := s.SetEndpoints(testContext(t), nil, specsOf(a)); err != nil {
		t.Fatal(err)
	}
	if n := s.health.count.Load(); n != 0 {
		t.Errorf("unhealthy count %d after removing the ejected endpoint, want 0", n)
	}
	f.clock.advance(time.Minute)
	if evs := s.health.fail(old, sigProbe, s.now(), nil); len(evs) != 0 || s.health.count.Load() != 0 {
		t.Errorf("a removed record took evidence: %v", evs)
	}
	// Added back, b starts healthy with a fresh record.
	if err := s.SetEndpoints(testContext(t), nil, specsOf(a, b)); err != nil {
		t.Fatal(err)
	}
	if rec := s.health.endpoint(b.url()); rec == nil || rec == old || f.ejected(t, RoleDecode, b, 0) {
		t.Errorf("re-added b: record %p (old %p), ejected %v", rec, old, f.ejected(t, RoleDecode, b, 0))
	}
	if got := urlsOf(s, RoleDecode); got[b.url()] != 2 {
		t.Errorf("decode targets after re-adding b: %v", got)
	}
}

// Picks, feedback, scrapes and probes run while the endpoint lists change
// back and forth; run with -race. Picks fail at most for want of a
// discovered endpoint, always pin valid ranks, and once the lists settle
// only the listed endpoints' targets remain.
func TestSetEndpointsConcurrent(t *testing.T) {
	engine := func(dp int, mode string) *fakeEngine {
		return newFakeEngine(t, map[string]response{"/server_info": ok(info(dp, mode, 9000)), "/health": ok(""), "/v1/loads": ok(`{"loads":[]}`)})
	}
	engines := []*fakeEngine{engine(2, "decode"), engine(1, "decode"), engine(4, "decode")}
	p := engine(2, "prefill")
	s := newTestScheduler(t, Config{
		Prefill: specsOf(p), Decode: specsOf(engines[0]),
		Load: LoadConfig{Interval: 5 * time.Millisecond}, Health: HealthConfig{Interval: 5 * time.Millisecond, Timeout: 5 * time.Millisecond},
		DiscoveryInterval: 10 * time.Millisecond,
	}, nil)
	ctx := testContext(t)
	runCtx, cancel := context.WithCancel(ctx)
	var run sync.WaitGroup
	run.Go(func() { s.Run(runCtx) })
	waitUntil(t, "ready", s.Ready)

	lists := [][]*fakeEngine{
		{engines[0], engines[1]}, {engines[2]}, {engines[1], engines[0], engines[2]}, {engines[0]},
	}
	stop := make(chan struct{})
	var changer, pickers sync.WaitGroup
	reloads := 0
	changer.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				t.Logf("%d endpoint changes during the picks", reloads)
				return
			default:
			}
			if err := s.SetEndpoints(ctx, specsOf(p), specsOf(lists[i%len(lists)]...)); err != nil {
				t.Errorf("SetEndpoints: %v", err)
				return
			}
			reloads++
		}
	})
	for g := range 6 {
		pickers.Go(func() {
			for i := range 1500 {
				id := fmt.Sprintf("g%d-%d", g, i)
				d, err := s.Pick(ctx, &Request{ID: id, Prompt: []byte("hello hello hello hello hello hello hello hello hello hello hello hello hello hello")})
				if err != nil {
					if errors.Is(err, ErrNoEndpoints) {
						continue // a new list's endpoints are briefly undiscovered
					}
					t.Errorf("Pick: %v", err)
					return
				}
				checkRank(t, d.Decode)
				outcome := Feedback{RequestID: id, Role: RoleDecode, Address: d.Decode.Endpoint.Address, Rank: d.Decode.Rank, Failed: i%50 == 0}
				s.Complete(outcome)
				s.Complete(Feedback{RequestID: id})
				_ = s.DecodeFallback(d.Decode)
			}
		})
	}
	pickers.Wait()
	close(stop)
	changer.Wait()
	cancel()
	run.Wait()

	// Settle on one list: exactly its targets remain, and nothing else
	// lingers in the ledger or the prefix index.
	if err := s.SetEndpoints(ctx, specsOf(p), specsOf(engines[2])); err != nil {
		t.Fatal(err)
	}
	if got := urlsOf(s, RoleDecode); len(got) != 1 || got[engines[2].url()] != 4 {
		t.Errorf("decode targets = %v", got)
	}
	s.ledger.mu.Lock()
	defer s.ledger.mu.Unlock()
	for k := range s.ledger.targets {
		if k.URL != engines[2].url() && k.URL != p.url() {
			t.Errorf("ledger still has %v", k)
		}
	}
}
