package scheduler

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// statusScheduler returns a PD scheduler, built without discovery, with
// one prefill engine of dp 2 and two decode engines: one of dp 2 and one
// of dp 1. Its clock stands still at the returned time until a test moves
// it.
func statusScheduler(t *testing.T) (*Scheduler, *time.Time) {
	t.Helper()
	s := newTestScheduler(t, Config{
		Prefill:       []EndpointSpec{{URL: "http://10.0.0.1:30000"}},
		Decode:        []EndpointSpec{{URL: "http://10.0.1.1:30000"}, {URL: "http://10.0.1.2:30000"}},
		DecodePolicy:  PolicySpec{Name: "least_tokens"},
		PrefillPolicy: PolicySpec{Name: "round_robin"},
		Health:        HealthConfig{FailuresToEject: 1, BaseEjection: time.Minute},
	}, nil)
	// round_robin spreads the picks predictably; marked as a prefix reader,
	// its picks record prompts in the index, for Status to show.
	s.prefillPolicy = prefixReading{s.prefillPolicy}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s.now = func() time.Time { return now }
	s.discoverMu.Lock()
	for i, m := range s.members {
		m.cur.Ready, m.cur.Source = true, sourceConfig
		m.cur.DPSize = 2
		if i == 2 {
			m.cur.DPSize = 1
		}
		if m.role == RolePrefill {
			m.cur.BootstrapPort = 8998
		}
	}
	s.publish()
	s.discoverMu.Unlock()
	return s, &now
}

// targetStatus finds one target of st by name.
func targetStatus(t *testing.T, st Status, name string) TargetStatus {
	t.Helper()
	for _, e := range st.Endpoints {
		for _, ts := range e.Targets {
			if ts.Name == name {
				return ts
			}
		}
	}
	t.Fatalf("no target %s in %+v", name, st.Endpoints)
	return TargetStatus{}
}

func TestStatusEndpointsAndTargets(t *testing.T) {
	s, _ := statusScheduler(t)
	st := s.Status()
	if !st.PD || st.PrefillPolicy != "round_robin" || st.DecodePolicy != "least_tokens" {
		t.Errorf("mode and policies = %v %q %q", st.PD, st.PrefillPolicy, st.DecodePolicy)
	}
	tests := []struct {
		url       string
		role      Role
		bootstrap int
		names     []string
		ranks     []int
	}{
		{"http://10.0.0.1:30000", RolePrefill, 8998, []string{"10.0.0.1:30000/dp0", "10.0.0.1:30000/dp1"}, []int{0, 1}},
		{"http://10.0.1.1:30000", RoleDecode, 0, []string{"10.0.1.1:30000/dp0", "10.0.1.1:30000/dp1"}, []int{0, 1}},
		{"http://10.0.1.2:30000", RoleDecode, 0, []string{"10.0.1.2:30000/dp-"}, []int{NoRank}},
	}
	if len(st.Endpoints) != len(tests) {
		t.Fatalf("%d endpoints, want %d", len(st.Endpoints), len(tests))
	}
	for i, tt := range tests {
		e := st.Endpoints[i]
		if e.Endpoint.URL != tt.url || e.Endpoint.Role != tt.role || e.Endpoint.BootstrapPort != tt.bootstrap {
			t.Errorf("endpoint %d = %+v, want %s %s bootstrap %d", i, e.Endpoint, tt.url, tt.role, tt.bootstrap)
		}
		if e.Health.State != HealthHealthy {
			t.Errorf("%s health = %+v", tt.url, e.Health)
		}
		if len(e.Targets) != len(tt.names) {
			t.Fatalf("%s: %d targets, want %d", tt.url, len(e.Targets), len(tt.names))
		}
		for j, ts := range e.Targets {
			if ts.Name != tt.names[j] || ts.Rank != tt.ranks[j] || ts.Health.State != HealthHealthy || ts.Picks != 0 {
				t.Errorf("%s target %d = %+v, want %s rank %d, healthy, no picks", tt.url, j, ts, tt.names[j], tt.ranks[j])
			}
		}
	}
	if len(st.Decisions) != 0 {
		t.Errorf("decisions before any pick: %+v", st.Decisions)
	}
}

func TestStatusLoadsPicksAndDecisions(t *testing.T) {
	s, now := statusScheduler(t)
	ctx := testContext(t)
	prompt := []byte(strings.Repeat("the same long system prompt. ", 20))
	var decisions []Decision
	for i := range 3 {
		req := &Request{ID: "r" + strconv.Itoa(i), Path: "/v1/chat/completions", Model: "m", Prompt: prompt, MaxTokens: 10}
		d, err := s.Pick(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		decisions = append(decisions, d)
	}
	// A scrape that started after the requests reached the engines reports
	// engine-side tokens on one decode rank, covering its reservation.
	key := decisions[0].Decode.Key()
	scrapedAt := now.Add(time.Second)
	s.ledger.observe([]rankLoad{{key: key, tokens: 500, capacity: 10000, running: 2, waiting: 1}}, scrapedAt, scrapedAt)

	st := s.Status()
	if !st.At.Equal(*now) {
		t.Errorf("At = %v, want %v", st.At, *now)
	}
	if st.Reservations != 3 {
		t.Errorf("Reservations = %d, want 3", st.Reservations)
	}
	var picks [2]uint64
	for _, e := range st.Endpoints {
		for _, ts := range e.Targets {
			if e.Endpoint.Role == RolePrefill {
				picks[0] += ts.Picks
			} else {
				picks[1] += ts.Picks
			}
			// Prompts are recorded only for the role whose policy reads
			// the prefix index: prefill (marked so), not decode
			// (least_tokens).
			if e.Endpoint.Role == RolePrefill && ts.Picks > 0 && ts.PrefixBlocks == 0 {
				t.Errorf("%s was picked but holds no prefix blocks", ts.Name)
			}
			if e.Endpoint.Role == RoleDecode && ts.PrefixBlocks != 0 {
				t.Errorf("%s holds %d prefix blocks, but least_tokens does not read the index", ts.Name, ts.PrefixBlocks)
			}
			if ts.Picks > 0 && ts.Load.Reserved == 0 && ts.Name != decisions[0].Decode.String() {
				t.Errorf("%s was picked but has nothing reserved: %+v", ts.Name, ts.Load)
			}
		}
	}
	if picks != [2]uint64{3, 3} {
		t.Errorf("picks per role = %v, want [3 3]", picks)
	}
	scraped := targetStatus(t, st, decisions[0].Decode.String())
	if !scraped.Load.Fresh || scraped.Load.Tokens != 500 || scraped.Load.Reserved != 0 || scraped.Load.Capacity != 10000 ||
		scraped.Load.Running != 2 || scraped.Load.Waiting != 1 || !scraped.ScrapedAt.Equal(scrapedAt) {
		t.Errorf("scraped target = %+v (the scrape covers its reservation)", scraped)
	}

	if len(st.Decisions) != 3 {
		t.Fatalf("%d decisions, want 3", len(st.Decisions))
	}
	for i, dec := range st.Decisions {
		want := decisions[2-i] // newest first
		if dec.RequestID != "r"+strconv.Itoa(2-i) || dec.Path != "/v1/chat/completions" || dec.Model != "m" || dec.Err != "" {
			t.Errorf("decision %d = %+v", i, dec)
		}
		if dec.Prefill == nil || dec.Decode == nil {
			t.Fatalf("decision %d lacks a role: %+v", i, dec)
		}
		if dec.Prefill.Target != want.Prefill.String() || dec.Prefill.Rank != want.Prefill.Rank || dec.Prefill.Policy != "round_robin" ||
			dec.Prefill.Candidates != 2 || dec.Prefill.Tokens <= 0 {
			t.Errorf("decision %d prefill = %+v, want %s", i, dec.Prefill, want.Prefill)
		}
		if dec.Decode.Target != want.Decode.String() || dec.Decode.URL != want.Decode.Endpoint.URL || dec.Decode.Policy != "least_tokens" ||
			dec.Decode.Candidates != 3 || dec.Decode.Tokens <= dec.Prefill.Tokens {
			t.Errorf("decision %d decode = %+v, want %s", i, dec.Decode, want.Decode)
		}
	}
	// round_robin sends r0 and r2 to the same prefill rank: r2's prompt
	// was indexed there by r0's pick.
	if got := [2]float64{st.Decisions[2].Prefill.Prefix, st.Decisions[0].Prefill.Prefix}; got != [2]float64{0, 1} {
		t.Errorf("prefill prefix of r0, r2 = %v, want [0 1]", got)
	}
}

func TestStatusHealth(t *testing.T) {
	s, now := statusScheduler(t)
	snap := s.snap.Load()
	target := snap.decode.states[0]
	s.health.fail(target.health, sigFailures, *now, nil)
	epRec := s.health.endpoint("http://10.0.1.2:30000")
	s.health.cfg.ProbeFailures = 1
	s.health.fail(epRec, sigProbe, *now, nil)

	tests := []struct {
		name       string
		at         time.Duration
		state      string
		until      time.Time
		epState    string
		epReason   string
		targetName string
	}{
		{"ejected", 0, HealthEjected, now.Add(time.Minute), HealthEjected, ReasonProbe, snap.decode.targets[0].String()},
		{"half open after the ejection", 2 * time.Minute, HealthHalfOpen, time.Time{}, HealthHalfOpen, ReasonProbe, snap.decode.targets[0].String()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := now.Add(tt.at)
			s.now = func() time.Time { return at }
			st := s.Status()
			ts := targetStatus(t, st, tt.targetName)
			if ts.Health.State != tt.state || !ts.Health.Until.Equal(tt.until) || ts.Health.Reason != ReasonFailures || ts.Health.Ejections != 1 {
				t.Errorf("target health = %+v, want %s until %v", ts.Health, tt.state, tt.until)
			}
			ep := st.Endpoints[2]
			if ep.Health.State != tt.epState || ep.Health.Reason != tt.epReason {
				t.Errorf("endpoint health = %+v, want %s (%s)", ep.Health, tt.epState, tt.epReason)
			}
			if st.Endpoints[1].Health.State != HealthHealthy {
				t.Errorf("healthy endpoint reported %+v", st.Endpoints[1].Health)
			}
		})
	}
}

func TestStatusFailedPicks(t *testing.T) {
	ctx := testContext(t)
	tests := []struct {
		name    string
		setup   func(s *Scheduler)
		wantErr string
	}{
		{"no ready endpoint", func(s *Scheduler) {
			s.discoverMu.Lock()
			for _, m := range s.members {
				m.cur.Ready = m.role != RoleDecode
			}
			s.publish()
			s.discoverMu.Unlock()
		}, "no ready endpoint"},
		{"every decode target ejected", func(s *Scheduler) {
			for _, ts := range s.snap.Load().decode.states {
				s.health.fail(ts.health, sigFailures, s.now(), nil)
			}
		}, "all 3 targets are ejected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := statusScheduler(t)
			tt.setup(s)
			_, err := s.Pick(ctx, &Request{ID: "x", Path: "/generate"})
			if !errors.Is(err, ErrNoEndpoints) {
				t.Fatalf("Pick error = %v", err)
			}
			st := s.Status()
			if len(st.Decisions) != 1 {
				t.Fatalf("decisions = %+v", st.Decisions)
			}
			d := st.Decisions[0]
			if d.RequestID != "x" || d.Path != "/generate" || !strings.Contains(d.Err, tt.wantErr) || d.Prefill != nil || d.Decode != nil {
				t.Errorf("decision = %+v, want an error containing %q and no choice", d, tt.wantErr)
			}
			for _, e := range st.Endpoints {
				for _, ts := range e.Targets {
					if ts.Picks != 0 || ts.Load.Reserved != 0 {
						t.Errorf("%s after a failed pick: %+v", ts.Name, ts)
					}
				}
			}
		})
	}
}

func TestStatusDecisionRingKeepsTheNewest(t *testing.T) {
	s, _ := statusScheduler(t)
	ctx := testContext(t)
	n := decisionHistory + 10
	for i := range n {
		if _, err := s.Pick(ctx, &Request{ID: strconv.Itoa(i), DecodeOnly: true}); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Status()
	if len(st.Decisions) != decisionHistory {
		t.Fatalf("%d decisions, want %d", len(st.Decisions), decisionHistory)
	}
	for i, d := range st.Decisions {
		if want := strconv.Itoa(n - 1 - i); d.RequestID != want {
			t.Fatalf("decision %d is %s, want %s", i, d.RequestID, want)
		}
		if d.Prefill != nil || d.Decode == nil || d.Decode.Tokens != 0 {
			t.Errorf("decode-only decision %d = %+v %+v", i, d.Prefill, d.Decode)
		}
	}
}

// The ring keeps its own short copies of the request's strings, which may
// share memory with a whole request body, and copies nothing while they
// repeat.
func TestStatusDecisionStringsAreCopies(t *testing.T) {
	body := `{"model":"` + strings.Repeat("m", 300) + `","path":"/v1/chat/completions?x=1"}`
	model := body[len(`{"model":"`):][:300]
	path := body[strings.Index(body, "/v1"):][:len("/v1/chat/completions?x=1")]
	tests := []struct {
		name, model, path string
		wantModel         string
	}{
		{"short", "llama", "/generate", "llama"},
		{"long model cut", model, path, strings.Repeat("m", maxShownBytes)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r decisionRing
			e := r.record(time.Time{}, "id", tt.path, tt.model)
			if e.model != tt.wantModel || e.path != tt.path {
				t.Errorf("recorded %q %q, want %q %q", e.model, e.path, tt.wantModel, tt.path)
			}
			if unsafe.StringData(e.model) == unsafe.StringData(tt.model) || unsafe.StringData(e.path) == unsafe.StringData(tt.path) {
				t.Error("the entry shares memory with the request's strings")
			}
			if n := testing.AllocsPerRun(100, func() { r.record(time.Time{}, "id", tt.path, tt.model) }); n != 0 {
				t.Errorf("recording repeated strings allocates %v times", n)
			}
		})
	}
}

// prefixReading marks a policy as a reader of the prefix index.
type prefixReading struct{ Policy }

func (prefixReading) ReadsPrefix() bool { return true }
