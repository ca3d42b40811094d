package status

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// fakeSource returns the status it holds.
type fakeSource struct {
	mu sync.Mutex
	st scheduler.Status
}

func (f *fakeSource) Status() scheduler.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

func (f *fakeSource) set(st scheduler.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st = st
}

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func healthy() scheduler.HealthStatus { return scheduler.HealthStatus{State: scheduler.HealthHealthy} }

// target builds a target's status with the given tokens and picks.
func target(name string, rank int, scraped, reserved int64, picks uint64) scheduler.TargetStatus {
	return scheduler.TargetStatus{
		Rank: rank, Name: name, Health: healthy(), Picks: picks, PrefixBlocks: int(picks) * 3,
		Load:      scheduler.Load{Tokens: scraped + reserved, Reserved: reserved, Capacity: 100000, Running: 1, Waiting: 2, Fresh: true},
		ScrapedAt: t0.Add(-500 * time.Millisecond),
	}
}

// pdStatus is a PD scheduler's status: one prefill engine (dp 2), two
// decode engines (dp 2 and dp 1).
func pdStatus() scheduler.Status {
	return scheduler.Status{
		At: t0, Ready: true, PD: true, PrefillPolicy: "round_robin", DecodePolicy: "least_tokens", Reservations: 3,
		Endpoints: []scheduler.EndpointStatus{
			{
				Endpoint: scheduler.Endpoint{Role: scheduler.RolePrefill, URL: "http://p:1", Address: "10.0.0.1:1", BootstrapPort: 8998, DPSize: 2, Source: "server_info", Ready: true},
				Health:   healthy(),
				Targets:  []scheduler.TargetStatus{target("10.0.0.1:1/dp0", 0, 100, 50, 4), target("10.0.0.1:1/dp1", 1, 100, 50, 4)},
			},
			{
				Endpoint: scheduler.Endpoint{Role: scheduler.RoleDecode, URL: "http://d:1", Address: "10.0.1.1:1", BootstrapPort: 8998, DPSize: 2, Source: "server_info", Ready: true,
					DecodeCache: scheduler.DecodeCache{Radix: true, HostRatio: 2}},
				Health:  healthy(),
				Targets: []scheduler.TargetStatus{target("10.0.1.1:1/dp0", 0, 300, 0, 2), target("10.0.1.1:1/dp1", 1, 100, 0, 2)},
			},
			{
				Endpoint: scheduler.Endpoint{Role: scheduler.RoleDecode, URL: "http://d:2", Address: "10.0.1.2:1", DPSize: 1, Source: "config", Ready: true},
				Health:   healthy(),
				Targets:  []scheduler.TargetStatus{target("10.0.1.2:1/dp-", scheduler.NoRank, 200, 0, 4)},
			},
		},
		Decisions: []scheduler.DecisionStatus{
			{
				At: t0, RequestID: "r2", Path: "/v1/chat/completions?api_key=secret", Model: "m",
				Prefill: &scheduler.ChoiceStatus{URL: "http://p:1", Target: "10.0.0.1:1/dp1", Rank: 1, Policy: "round_robin", Candidates: 2, LoadTokens: 10, Tokens: 50},
				Decode:  &scheduler.ChoiceStatus{URL: "http://d:2", Target: "10.0.1.2:1/dp-", Rank: scheduler.NoRank, Policy: "least_tokens", Candidates: 3, LoadTokens: 20, Prefix: 0.5, Tokens: 306},
			},
			{At: t0.Add(-time.Second), RequestID: "r1", Path: "/generate", Err: "scheduler: pick decode: no ready endpoint"},
		},
	}
}

func ptr[T any](v T) *T { return &v }

func TestPage(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*scheduler.Status)
		check  func(t *testing.T, p Page)
	}{
		{"modes and roles", nil, func(t *testing.T, p Page) {
			if p.Mode != "pd" || !p.Ready || p.Version != "v1" || p.Reservations != 3 || p.RateWindowSeconds != 5 || !p.Time.Equal(t0) {
				t.Errorf("header = %+v", p)
			}
			want := []Role{
				{Role: "prefill", Policy: "round_robin", Endpoints: 1, ReadyEndpoints: 1, Ranks: 2, PickableRanks: 2, Tokens: 300, TokenImbalance: ptr(1.0)},
				{Role: "decode", Policy: "least_tokens", Endpoints: 2, ReadyEndpoints: 2, Ranks: 3, PickableRanks: 3, Tokens: 600, TokenImbalance: ptr(1.5)},
			}
			if got, _ := json.Marshal(p.Roles); string(got) != mustJSON(t, want) {
				t.Errorf("roles = %s, want %s", got, mustJSON(t, want))
			}
		}},
		{"ranks", nil, func(t *testing.T, p Page) {
			if len(p.Endpoints) != 3 {
				t.Fatalf("%d endpoints", len(p.Endpoints))
			}
			pre, dec := p.Endpoints[0], p.Endpoints[2]
			if pre.BootstrapPort != 8998 || pre.DPSize != 2 || pre.Address != "10.0.0.1:1" || pre.Source != "server_info" || pre.Health.State != "healthy" {
				t.Errorf("prefill endpoint = %+v", pre)
			}
			if p.Endpoints[1].BootstrapPort != 0 {
				t.Errorf("decode endpoint shows bootstrap port %d", p.Endpoints[1].BootstrapPort)
			}
			for i, want := range []string{"", "radix+host", "off"} {
				if got := p.Endpoints[i].DecodeCache; got != want {
					t.Errorf("endpoint %d: decode_cache %q, want %q", i, got, want)
				}
			}
			r := pre.Ranks[1]
			if *r.Rank != 1 || r.Target != "10.0.0.1:1/dp1" || r.Tokens != 150 || r.ScrapedTokens != 100 || r.ReservedTokens != 50 ||
				r.CapacityTokens != 100000 || r.Running != 1 || r.Waiting != 2 || !r.LoadFresh || *r.LoadAgeSeconds != 0.5 ||
				r.Picks != 4 || r.PrefixBlocks != 12 || !r.Pickable || r.PicksPerSecond != nil {
				t.Errorf("prefill rank 1 = %+v", r)
			}
			if dec.Ranks[0].Rank != nil {
				t.Errorf("a single-rank decode engine shows rank %d", *dec.Ranks[0].Rank)
			}
		}},
		{"decisions", nil, func(t *testing.T, p Page) {
			want := `[{"time":"2026-11-23T12:00:00Z","request_id":"r2","path":"/v1/chat/completions","model":"m",` +
				`"prefill":{"target":"10.0.0.1:1/dp1","url":"http://p:1","rank":1,"policy":"round_robin","candidates":2,"load_tokens":10,"prefix":0,"cached_tokens":0,"tokens":50},` +
				`"decode":{"target":"10.0.1.2:1/dp-","url":"http://d:2","rank":null,"policy":"least_tokens","candidates":3,"load_tokens":20,"prefix":0.5,"cached_tokens":0,"tokens":306}},` +
				`{"time":"2026-11-23T11:59:59Z","request_id":"r1","path":"/generate","prefill":null,"decode":null,"error":"scheduler: pick decode: no ready endpoint"}]`
			if got, _ := json.Marshal(p.Decisions); string(got) != want {
				t.Errorf("decisions = %s\nwant %s", got, want)
			}
		}},
		{"ejected ranks leave the balance", func(st *scheduler.Status) {
			until := t0.Add(30 * time.Second)
			st.Endpoints[1].Targets[0].Health = scheduler.HealthStatus{State: scheduler.HealthEjected, Reason: scheduler.ReasonFailures, Until: until, Ejections: 1}
		}, func(t *testing.T, p Page) {
			r := p.Endpoints[1].Ranks[0]
			if r.Pickable || r.Health.State != "ejected" || r.Health.Reason != "failures" || !r.Health.Until.Equal(t0.Add(30*time.Second)) || r.Health.Ejections != 1 {
				t.Errorf("ejected rank = %+v", r)
			}
			d := p.Roles[1]
			if d.PickableRanks != 2 || d.Tokens != 600 || *d.TokenImbalance != 200.0/150 {
				t.Errorf("decode role = %+v (imbalance %v), want 2 pickable ranks, imbalance 200/150", d, *d.TokenImbalance)
			}
		}},
		{"an ejected endpoint makes its ranks unpickable", func(st *scheduler.Status) {
			st.Endpoints[0].Health = scheduler.HealthStatus{State: scheduler.HealthEjected, Reason: scheduler.ReasonProbe, Until: t0.Add(time.Second)}
		}, func(t *testing.T, p Page) {
			if p.Endpoints[0].Ranks[0].Pickable || p.Endpoints[0].Ranks[1].Pickable || p.Roles[0].PickableRanks != 0 || p.Roles[0].TokenImbalance != nil {
				t.Errorf("prefill role = %+v, ranks %+v", p.Roles[0], p.Endpoints[0].Ranks)
			}
		}},
		{"aggregated and idle", func(st *scheduler.Status) {
			st.PD, st.PrefillPolicy = false, ""
			st.Endpoints = st.Endpoints[1:]
			for i := range st.Endpoints {
				for j := range st.Endpoints[i].Targets {
					st.Endpoints[i].Targets[j].Load = scheduler.Load{}
					st.Endpoints[i].Targets[j].ScrapedAt = time.Time{}
				}
			}
		}, func(t *testing.T, p Page) {
			if p.Mode != "aggregated" || len(p.Roles) != 1 || p.Roles[0].Role != "decode" || p.Roles[0].TokenImbalance != nil {
				t.Errorf("page = %+v", p)
			}
			if r := p.Endpoints[0].Ranks[0]; r.LoadAgeSeconds != nil || r.LoadFresh {
				t.Errorf("never-scraped rank = %+v", r)
			}
		}},
		{"a not-ready endpoint has no ranks", func(st *scheduler.Status) {
			st.Endpoints[2].Endpoint.Ready, st.Endpoints[2].Endpoint.LastError = false, "connection refused"
			st.Endpoints[2].Targets = nil
		}, func(t *testing.T, p Page) {
			e := p.Endpoints[2]
			if e.Ready || e.LastError != "connection refused" || e.Ranks == nil || len(e.Ranks) != 0 || p.Roles[1].ReadyEndpoints != 1 || p.Roles[1].Ranks != 2 {
				t.Errorf("endpoint = %+v, decode role = %+v", e, p.Roles[1])
			}
		}},
		{"an engine in the wrong disaggregation mode is not scheduled and says why", func(st *scheduler.Status) {
			ep := &st.Endpoints[0].Endpoint
			ep.Ready, ep.Mode, ep.ExpectedMode, ep.WrongMode = false, "decode", "prefill", true
			st.Endpoints[0].Targets = nil
		}, func(t *testing.T, p Page) {
			e := p.Endpoints[0]
			want := `prefill engine http://p:1 reports disaggregation_mode "decode", expected "prefill"`
			if e.Ready || !e.WrongMode || e.DisaggregationMode != "decode" || e.ExpectedMode != "prefill" || e.NotReadyReason != want || len(e.Ranks) != 0 || p.Roles[0].ReadyEndpoints != 0 {
				t.Errorf("endpoint = %+v, want not ready with reason %q", e, want)
			}
			if got := mustJSON(t, e); !strings.Contains(got, `"disaggregation_mode":"decode","expected_mode":"prefill","wrong_mode":true,"not_ready_reason":`) {
				t.Errorf("endpoint JSON = %s", got)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := pdStatus()
			if tt.modify != nil {
				tt.modify(&st)
			}
			h := New(Single(&fakeSource{st: st}), Options{Version: "v1"})
			p := h.Page()
			tt.check(t, p)
			// The single pool is the top level, again under pools.
			if len(p.Pools) != 1 || p.Pools[0].Name != "default" || p.Pools[0].Models == nil || len(p.Pools[0].Models) != 0 {
				t.Fatalf("pools = %s", mustJSON(t, p.Pools))
			}
			if got, want := mustJSON(t, p.Pools[0]), mustJSON(t, topLevel(p, "default", []string{})); got != want {
				t.Errorf("pools[0] = %s\nwant the top level %s", got, want)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRates follows one target's pick rate over a sequence of fetches.
func TestRates(t *testing.T) {
	steps := []struct {
		name  string
		at    time.Duration // since t0
		picks uint64
		want  *float64 // the target's picks per second
	}{
		{"first fetch: no rate yet", 0, 10, nil},
		{"one second later", time.Second, 20, ptr(10.0)},
		{"against the oldest sample in the window", 4 * time.Second, 50, ptr(10.0)},
		{"older samples leave the window", 6 * time.Second, 50, ptr(30.0 / 5)}, // base: the sample at 1s
		{"a counter that went down has no rate", 7 * time.Second, 3, nil},
		{"it has one again from the next sample", 8 * time.Second, 7, ptr(4.0)},
		{"until older samples leave the window", 13 * time.Second, 7, ptr(0.0)},
		{"the clock went back: start over", 2 * time.Second, 9, nil},
		{"and go on", 3 * time.Second, 11, ptr(2.0)},
	}
	src := &fakeSource{}
	h := New(Single(src), Options{RateWindow: 5 * time.Second})
	for _, s := range steps {
		st := pdStatus()
		st.At = t0.Add(s.at)
		st.Endpoints[2].Targets[0].Picks = s.picks
		src.set(st)
		p := h.Page()
		got := p.Endpoints[2].Ranks[0].PicksPerSecond
		switch {
		case (got == nil) != (s.want == nil):
			t.Fatalf("%s: rate = %v, want %v", s.name, deref(got), deref(s.want))
		case got != nil && *got != *s.want:
			t.Fatalf("%s: rate = %v, want %v", s.name, *got, *s.want)
		}
		// The other targets' counts never change: their rates are 0 once known.
		if got != nil && (p.Roles[1].PicksPerSecond == nil || *p.Roles[1].PicksPerSecond != *got || *p.Roles[0].PicksPerSecond != 0) {
			t.Fatalf("%s: role rates = %v, %v", s.name, deref(p.Roles[0].PicksPerSecond), deref(p.Roles[1].PicksPerSecond))
		}
	}
	if n := len(h.pools[0].rates.samples); n > 11 {
		t.Errorf("%d samples kept", n)
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestPickImbalance(t *testing.T) {
	src := &fakeSource{}
	h := New(Single(src), Options{})
	st := pdStatus()
	src.set(st)
	h.Page()
	// One second later the decode ranks took 6, 2 and 4 picks.
	st.At = t0.Add(time.Second)
	for i, n := range []uint64{6, 2} {
		st.Endpoints[1].Targets[i].Picks += n
	}
	st.Endpoints[2].Targets[0].Picks += 4
	src.set(st)
	d := h.Page().Roles[1]
	if d.PicksPerSecond == nil || *d.PicksPerSecond != 12 || d.PickImbalance == nil || *d.PickImbalance != 1.5 {
		t.Errorf("decode role = %+v, want 12 picks/s, pick imbalance 1.5", d)
	}
}

func TestImbalance(t *testing.T) {
	tests := []struct {
		xs   []float64
		want *float64
	}{
		{nil, nil},
		{[]float64{0, 0}, nil},
		{[]float64{5}, ptr(1.0)},
		{[]float64{2, 2, 2}, ptr(1.0)},
		{[]float64{3, 1}, ptr(1.5)},
		{[]float64{4, 0, 0, 0}, ptr(4.0)},
	}
	for _, tt := range tests {
		got := imbalance(tt.xs)
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("imbalance(%v) = %v, want %v", tt.xs, deref(got), deref(tt.want))
		}
	}
}

func TestHandler(t *testing.T) {
	mux := http.NewServeMux()
	agg := aggregatedStatus()
	New([]Pool{
		{Name: "default", Models: []string{"m"}, Source: &fakeSource{st: pdStatus()},
			Admission: fakeAdmission{admit.Snapshot{Queued: 3, QueuedTokens: 900, ByClass: map[string]int{"batch": 3}, DrainRate: 1500}}},
		{Name: "small", Models: []string{"s", "s-instruct"}, Source: &fakeSource{st: agg}},
	}, Options{Version: "v1"}).Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	tests := []struct {
		method, path string
		status       int
		contentType  string
		check        func(t *testing.T, body string)
	}{
		{"GET", "/status", 200, "text/html; charset=utf-8", func(t *testing.T, body string) {
			for _, want := range []string{"<title>duet status</title>", `fetch("status.json"`, "setTimeout(poll, 1000)"} {
				if !strings.Contains(body, want) {
					t.Errorf("page lacks %q", want)
				}
			}
			// Self-contained: no external script, style sheet, image or font.
			if m := regexp.MustCompile(`(?i)(src|href)\s*=|@import|url\(|https?://`).FindString(body); m != "" {
				t.Errorf("page references an external resource: %q", m)
			}
		}},
		{"GET", "/status.json", 200, "application/json", func(t *testing.T, body string) {
			var p Page
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatal(err)
			}
			if p.Mode != "pd" || len(p.Endpoints) != 3 || len(p.Decisions) != 2 || len(p.Roles) != 2 {
				t.Errorf("status.json = %s", body)
			}
			if len(p.Pools) != 2 || p.Pools[0].Name != "default" || p.Pools[1].Name != "small" || p.Pools[1].Mode != "aggregated" || len(p.Pools[1].Endpoints) != 1 {
				t.Errorf("status.json pools = %s", mustJSON(t, p.Pools))
			}
			// The top level keeps the fields it had before pools, and
			// gains only pools; each pool has the per-pool ones.
			var doc struct {
				Top   map[string]json.RawMessage
				Pools []map[string]json.RawMessage `json:"pools"`
			}
			if err := json.Unmarshal([]byte(body), &doc.Top); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(body), &doc); err != nil {
				t.Fatal(err)
			}
			wantTop := []string{"decisions", "endpoints", "engine_ranks", "mode", "pools", "rate_window_seconds", "ready", "reservations", "roles", "time", "version"}
			if got := slices.Sorted(maps.Keys(doc.Top)); !slices.Equal(got, wantTop) {
				t.Errorf("top-level fields %v, want %v", got, wantTop)
			}
			wantPool := []string{"admission", "decisions", "endpoints", "engine_ranks", "mode", "models", "name", "ready", "reservations", "roles", "time"}
			for i, pl := range doc.Pools {
				if got := slices.Sorted(maps.Keys(pl)); !slices.Equal(got, wantPool) {
					t.Errorf("pools[%d] fields %v, want %v", i, got, wantPool)
				}
			}
			if got, want := string(doc.Pools[0]["admission"]), `{"open":false,"queued":3,"queued_tokens":900,"by_class":{"batch":3},"drain_tokens_per_second":1500}`; got != want {
				t.Errorf("pools[0].admission = %s, want %s", got, want)
			}
			if got := string(doc.Pools[1]["admission"]); got != "null" {
				t.Errorf("pools[1].admission = %s, want null (no queue)", got)
			}
			for _, k := range []string{"time", "ready", "mode", "engine_ranks", "reservations", "roles", "endpoints", "decisions"} {
				if string(doc.Top[k]) != string(doc.Pools[0][k]) {
					t.Errorf("top-level %s = %s, pools[0].%s = %s", k, doc.Top[k], k, doc.Pools[0][k])
				}
			}
		}},
		{"POST", "/status.json", 405, "", nil},
		{"GET", "/status/", 404, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			if tt.contentType != "" && resp.Header.Get("Content-Type") != tt.contentType {
				t.Errorf("content type %q, want %q", resp.Header.Get("Content-Type"), tt.contentType)
			}
			if tt.check != nil {
				tt.check(t, string(body))
			}
		})
	}
}

// The page carries the replicas this one shares state with, and nothing
// about replicas when it runs alone.
func TestPageSync(t *testing.T) {
	src := &fakeSource{st: scheduler.Status{At: time.Unix(100, 0)}}
	if p := New(Single(src), Options{}).Page(); p.Sync != nil {
		t.Errorf("a replica running alone shows sync %+v", p.Sync)
	}
	want := &Sync{Replica: "duet-0", Connected: true, Peers: []SyncPeer{{Name: "duet-1", Alive: true, LagMs: 0.4}}}
	p := New(Single(src), Options{Sync: func() *Sync { return want }}).Page()
	if p.Sync == nil || p.Sync.Replica != "duet-0" || len(p.Sync.Peers) != 1 || !p.Sync.Peers[0].Alive {
		t.Errorf("sync %+v, want %+v", p.Sync, want)
	}
}

// aggregatedStatus is an aggregated scheduler's status: one decode engine
// (dp 2) at the same URL as pdStatus's first decode engine, one decision.
func aggregatedStatus() scheduler.Status {
	return scheduler.Status{
		At: t0, Ready: false, DecodePolicy: "round_robin", Reservations: 1, EngineRanks: true,
		Endpoints: []scheduler.EndpointStatus{{
			Endpoint: scheduler.Endpoint{Role: scheduler.RoleDecode, URL: "http://d:1", Address: "10.0.1.1:1", DPSize: 2, Source: "config", Ready: true},
			Health:   healthy(),
			Targets:  []scheduler.TargetStatus{target("10.0.1.1:1/dp0", 0, 50, 0, 1), target("10.0.1.1:1/dp1", 1, 50, 0, 1)},
		}},
		Decisions: []scheduler.DecisionStatus{{
			At: t0, RequestID: "s1", Path: "/v1/completions", Model: "s",
			Decode: &scheduler.ChoiceStatus{URL: "http://d:1", Target: "10.0.1.1:1/dp0", Rank: 0, Policy: "round_robin", Candidates: 2, Tokens: 10},
		}},
	}
}

// topLevel returns the first pool's part of p as a PoolPage.
func topLevel(p Page, name string, models []string) PoolPage {
	return PoolPage{
		Name: name, Models: models, Time: p.Time, Ready: p.Ready, Mode: p.Mode, EngineRanks: p.EngineRanks,
		Reservations: p.Reservations, Roles: p.Roles, Endpoints: p.Endpoints, Decisions: p.Decisions,
	}
}

// TestPools shows two pools: a PD one and an aggregated one whose engine
// has the URL of one of the first pool's.
func TestPools(t *testing.T) {
	tests := []struct {
		name  string
		pools func(pd, agg Source) []Pool
		check func(t *testing.T, p Page)
	}{
		{"both pools, in order", func(pd, agg Source) []Pool {
			return []Pool{{Name: "big", Models: []string{"m", "m-chat"}, Source: pd}, {Name: "small", Models: []string{"s"}, Source: agg}}
		}, func(t *testing.T, p Page) {
			if len(p.Pools) != 2 {
				t.Fatalf("pools = %s", mustJSON(t, p.Pools))
			}
			big, small := p.Pools[0], p.Pools[1]
			if big.Name != "big" || !slices.Equal(big.Models, []string{"m", "m-chat"}) || big.Mode != "pd" || !big.Ready || big.Reservations != 3 ||
				len(big.Roles) != 2 || len(big.Endpoints) != 3 || len(big.Decisions) != 2 {
				t.Errorf("pools[0] = %s", mustJSON(t, big))
			}
			if small.Name != "small" || !slices.Equal(small.Models, []string{"s"}) || small.Mode != "aggregated" || small.Ready || !small.EngineRanks ||
				small.Reservations != 1 || len(small.Roles) != 1 || small.Roles[0].Policy != "round_robin" || small.Roles[0].Tokens != 100 ||
				len(small.Endpoints) != 1 || len(small.Decisions) != 1 || small.Decisions[0].RequestID != "s1" {
				t.Errorf("pools[1] = %s", mustJSON(t, small))
			}
		}},
		{"the first pool is the top level", func(pd, agg Source) []Pool {
			return []Pool{{Name: "small", Models: []string{"s"}, Source: agg}, {Name: "big", Source: pd}}
		}, func(t *testing.T, p Page) {
			if got, want := mustJSON(t, topLevel(p, "small", []string{"s"})), mustJSON(t, p.Pools[0]); got != want {
				t.Errorf("top level %s\nwant pools[0] %s", got, want)
			}
			if p.Mode != "aggregated" || p.Ready || p.Reservations != 1 || p.Version != "v1" || p.RateWindowSeconds != 5 {
				t.Errorf("top level = %+v", p)
			}
			if p.Pools[1].Models == nil {
				t.Errorf("a pool without models has models null, want []")
			}
		}},
		{"no pool", func(pd, agg Source) []Pool { return nil }, func(t *testing.T, p Page) {
			want := `{"time":"0001-01-01T00:00:00Z","version":"v1","ready":false,"mode":"aggregated","engine_ranks":false,"rate_window_seconds":5,` +
				`"reservations":0,"roles":[],"endpoints":[],"decisions":[],"pools":[]}`
			if got := mustJSON(t, p); got != want {
				t.Errorf("page = %s\nwant %s", got, want)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := New(tt.pools(&fakeSource{st: pdStatus()}, &fakeSource{st: aggregatedStatus()}), Options{Version: "v1"})
			tt.check(t, h.Page())
		})
	}
}

// TestPoolRates follows two pools' pick rates over a sequence of fetches:
// each has its own samples, even for an engine URL both list, and a clock
// that goes back in one does not reset the other.
func TestPoolRates(t *testing.T) {
	steps := []struct {
		name         string
		atA, atB     time.Duration // each pool's clock, since t0
		picksA       uint64        // pool a's http://d:1 dp0
		picksB       uint64        // pool b's http://d:1 dp0
		wantA, wantB *float64
	}{
		{"first fetch: no rates", 0, 0, 10, 100, nil, nil},
		{"each from its own counts", time.Second, time.Second, 12, 130, ptr(2.0), ptr(30.0)},
		{"and its own clock", 2 * time.Second, 3 * time.Second, 14, 160, ptr(2.0), ptr(20.0)},
		{"b's clock went back: only b starts over", 4 * time.Second, time.Second, 18, 170, ptr(2.0), nil},
		{"b has a rate again", 5 * time.Second, 2 * time.Second, 20, 180, ptr(2.0), ptr(10.0)},
	}
	a, b := &fakeSource{}, &fakeSource{}
	h := New([]Pool{{Name: "a", Source: a}, {Name: "b", Source: b}}, Options{RateWindow: 5 * time.Second})
	for _, s := range steps {
		sa, sb := pdStatus(), aggregatedStatus()
		sa.At, sb.At = t0.Add(s.atA), t0.Add(s.atB)
		sa.Endpoints[1].Targets[0].Picks = s.picksA
		sb.Endpoints[0].Targets[0].Picks = s.picksB
		a.set(sa)
		b.set(sb)
		p := h.Page()
		for _, c := range []struct {
			pool string
			got  *float64
			want *float64
		}{
			{"a", p.Pools[0].Endpoints[1].Ranks[0].PicksPerSecond, s.wantA},
			{"a (top level)", p.Endpoints[1].Ranks[0].PicksPerSecond, s.wantA},
			{"b", p.Pools[1].Endpoints[0].Ranks[0].PicksPerSecond, s.wantB},
		} {
			if (c.got == nil) != (c.want == nil) || (c.got != nil && *c.got != *c.want) {
				t.Fatalf("%s: pool %s rate = %v, want %v", s.name, c.pool, deref(c.got), deref(c.want))
			}
		}
	}
}

// fakeAdmission is an admission queue with a fixed snapshot.
type fakeAdmission struct{ s admit.Snapshot }

func (f fakeAdmission) Snapshot() admit.Snapshot { return f.s }
