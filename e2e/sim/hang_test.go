package sim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// probe is one HTTP exchange bounded by a client timeout.
type probe struct {
	status  int
	body    []byte
	timeout bool // the client gave up
	elapsed time.Duration
}

// do sends method url (with body if not "") and gives up after timeout.
func do(t *testing.T, method, url, body string, timeout time.Duration) probe {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return probe{timeout: true, elapsed: time.Since(start)}
		}
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return probe{status: resp.StatusCode, timeout: true, elapsed: time.Since(start)}
		}
		t.Fatalf("read %s: %v", url, err)
	}
	return probe{status: resp.StatusCode, body: b, elapsed: time.Since(start)}
}

// setFaults posts a fault update and returns the answer.
func setFaults(t *testing.T, ts *testServer, body string) (int, FaultsJSON) {
	t.Helper()
	r := post(t, ts.api.URL+"/sim/faults", body)
	var f FaultsJSON
	if r.status == 200 {
		r.json(t, &f)
	}
	return r.status, f
}

func TestFaultHang(t *testing.T) {
	for _, profile := range []string{"", "dense-8b-h100"} {
		t.Run("profile="+profile, func(t *testing.T) {
			// Health timeout 2 s of model time at scale 20: 100 ms of wall time.
			ts := startTest(t, Config{Profile: profile, TimeScale: 20, DecodePerToken: 20 * time.Millisecond,
				HealthTimeout: 2 * time.Second, Faults: Faults{Hang: true}})
			const short = 150 * time.Millisecond
			for _, req := range []struct{ path, body string }{
				{"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`},
				{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`},
				{"/v1/completions", `{"prompt":"hi","max_tokens":1,"stream":true}`},
			} {
				if p := do(t, "POST", ts.api.URL+req.path, req.body, short); !p.timeout {
					t.Fatalf("%s answered while hung: %d %s", req.path, p.status, p.body)
				}
			}
			for _, path := range []string{"/v1/loads", "/metrics", "/server_info"} {
				if p := do(t, "GET", ts.api.URL+path, "", short); !p.timeout {
					t.Fatalf("%s answered while hung: %d %s", path, p.status, p.body)
				}
			}
			if p := do(t, "GET", ts.api.URL+"/v1/models", "", short); p.status != 200 {
				t.Fatalf("/v1/models (no scheduler involved): %+v", p)
			}
			// /health waits for its generation and gives up after the health timeout.
			p := do(t, "GET", ts.api.URL+"/health", "", 5*time.Second)
			if p.status != 503 || p.elapsed < 90*time.Millisecond || p.elapsed > 2*time.Second {
				t.Fatalf("/health while hung: %d after %v, want 503 after ~100ms", p.status, p.elapsed)
			}
			if p := do(t, "GET", ts.api.URL+"/health", "", 50*time.Millisecond); !p.timeout {
				t.Fatalf("a prober with a short timeout got %d", p.status)
			}

			// An accepted request is held; an abort is accepted and ignored.
			held := background(t, ts.api.URL+"/generate", `{"text":"hi","rid":"held","sampling_params":{"max_new_tokens":3}}`)
			waitStage(t, ts.sim, "held", "queued")
			abortRID(t, ts, `{"rid":"held"}`)
			time.Sleep(20 * time.Millisecond)
			if it, ok := inFlight(ts.sim, "held"); !ok || it.Aborted {
				t.Fatalf("held after an abort while hung: %+v %v", it, ok)
			}
			if st := ts.sim.Stats(); st.AbortRequests != 1 || st.Aborted != 0 {
				t.Fatalf("stats %+v", st)
			}

			// Switched off at runtime: serving again, and the held request ends normally.
			if code, f := setFaults(t, ts, `{"hang":false}`); code != 200 || f.Hang {
				t.Fatalf("unhang: %d %+v", code, f)
			}
			r := await(t, held)
			var g generateResult
			r.json(t, &g)
			if r.status != 200 || g.MetaInfo.FinishReason == nil || g.MetaInfo.FinishReason.Type != "length" {
				t.Fatalf("held request: %d %s", r.status, r.body)
			}
			for _, path := range []string{"/v1/loads", "/metrics", "/server_info", "/health"} {
				if p := do(t, "GET", ts.api.URL+path, "", 2*time.Second); p.status != 200 {
					t.Fatalf("%s after the hang: %+v", path, p)
				}
			}
			if p := do(t, "POST", ts.api.URL+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`, 2*time.Second); p.status != 200 {
				t.Fatalf("generate after the hang: %+v", p)
			}
			// The requests the client gave up on while hung were recorded as gone.
			eventually(t, "3 requests recorded as gone", func() bool {
				gone := 0
				for _, rec := range ts.sim.Records() {
					if rec.Status == statusClientClosed {
						gone++
					}
				}
				return gone == 3
			})
		})
	}
}

func TestFaultHangStopsRunningRequest(t *testing.T) {
	ts := startTest(t, Config{DecodePerToken: 2 * time.Millisecond})
	ch := background(t, ts.api.URL+"/generate", `{"text":"hi","rid":"r","stream":true,"sampling_params":{"max_new_tokens":200}}`)
	waitStage(t, ts.sim, "r", "running")
	if _, err := ts.sim.UpdateFaults(FaultUpdate{Hang: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	// 200 tokens take 400 ms; hung, the request does not finish.
	time.Sleep(500 * time.Millisecond)
	if _, ok := inFlight(ts.sim, "r"); !ok {
		t.Fatal("the request finished while the engine hung")
	}
	if _, err := ts.sim.UpdateFaults(FaultUpdate{Hang: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	if r := await(t, ch); r.status != 200 || !strings.Contains(lastData(t, r.body), `"type":"length"`) {
		t.Fatalf("after the hang: %d %s", r.status, r.body)
	}
}

func TestFaultLoads(t *testing.T) {
	ts := startTest(t, Config{DPSize: 2})
	parsesJSON := func(b []byte) bool { return json.Valid(b) }
	parsesProm := func(b []byte) bool {
		p := expfmt.NewTextParser(model.LegacyValidation)
		_, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
		return err == nil
	}
	tests := []struct {
		loads  string
		status int
		parses bool
	}{
		{"garbage", 200, false},
		{"500", 500, false},
		{"ok", 200, true},
	}
	for _, tc := range tests {
		t.Run(tc.loads, func(t *testing.T) {
			if code, f := setFaults(t, ts, `{"loads":"`+tc.loads+`"}`); code != 200 || string(f.Loads) != tc.loads {
				t.Fatalf("set loads: %d %+v", code, f)
			}
			for path, parses := range map[string]func([]byte) bool{"/v1/loads": parsesJSON, "/metrics": parsesProm} {
				r := get(t, ts.api.URL+path)
				if r.status != tc.status || parses(r.body) != tc.parses {
					t.Fatalf("%s: %d %q, want %d parsable=%v", path, r.status, r.body, tc.status, tc.parses)
				}
			}
			// Inference is unaffected.
			if r := post(t, ts.api.URL+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
				t.Fatalf("generate: %d", r.status)
			}
		})
	}
	// The same from the configuration.
	g := startTest(t, Config{Faults: Faults{Loads: LoadsGarbage}})
	if r := get(t, g.api.URL+"/v1/loads"); r.status != 200 || json.Valid(r.body) {
		t.Fatalf("configured garbage: %d %q", r.status, r.body)
	}
}

func TestSimFaultsRoundTrip(t *testing.T) {
	ts := startTest(t, Config{Faults: Faults{SpikeProb: 0.5, Spike: 10 * time.Millisecond, DieAfter: 1000}})
	var f FaultsJSON
	get(t, ts.api.URL+"/sim/faults").json(t, &f)
	want := FaultsJSON{Loads: LoadsOK, SpikeProb: 0.5, SpikeMS: 10, DieAfter: 1000}
	if f != want {
		t.Fatalf("GET /sim/faults %+v, want %+v", f, want)
	}
	code, f := setFaults(t, ts, `{"error_rate":1,"slow_scrape_ms":60,"loads":"500","spike_prob":0}`)
	want = FaultsJSON{Loads: Loads500, ErrorRate: 1, SlowScrapeMS: 60, SpikeMS: 10, DieAfter: 1000}
	if code != 200 || f != want {
		t.Fatalf("POST: %d %+v, want %+v", code, f, want)
	}
	var again FaultsJSON
	get(t, ts.api.URL+"/sim/faults").json(t, &again)
	if again != want || ts.sim.Faults().JSON() != want {
		t.Fatalf("GET after POST %+v, want %+v", again, want)
	}
	// The new knobs act at once.
	if r := post(t, ts.api.URL+"/generate", `{"text":"hi"}`); r.status != 500 || !strings.Contains(string(r.body), "simulated fault") {
		t.Fatalf("error rate 1: %d %s", r.status, r.body)
	}
	if p := do(t, "GET", ts.api.URL+"/v1/loads", "", 5*time.Second); p.status != 500 || p.elapsed < 60*time.Millisecond {
		t.Fatalf("slow 500 scrape: %+v", p)
	}
	// Invalid updates change nothing.
	for _, bad := range []string{`{"error_rate":2}`, `{"loads":"sometimes"}`, `{"slow_scrape_ms":-1}`, `{"bogus":1}`, `not json`} {
		if code, _ := setFaults(t, ts, bad); code != 400 {
			t.Fatalf("POST %s: %d, want 400", bad, code)
		}
	}
	// Unset fields are kept.
	code, f = setFaults(t, ts, `{"error_rate":0,"loads":"ok"}`)
	want = FaultsJSON{Loads: LoadsOK, SlowScrapeMS: 60, SpikeMS: 10, DieAfter: 1000}
	if code != 200 || f != want {
		t.Fatalf("partial POST: %d %+v, want %+v", code, f, want)
	}
	if r := post(t, ts.api.URL+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
		t.Fatalf("error rate 0: %d %s", r.status, r.body)
	}
}

func TestHealthDuringShutdown(t *testing.T) {
	for _, flavor := range []Flavor{FlavorSGLang, FlavorVLLM} {
		t.Run(string(flavor), func(t *testing.T) {
			ts := startTest(t, Config{Flavor: flavor})
			if r := get(t, ts.api.URL+"/health"); r.status != 200 {
				t.Fatalf("/health: %d", r.status)
			}
			if err := ts.sim.Close(); err != nil {
				t.Fatal(err)
			}
			if r := get(t, ts.api.URL+"/health"); r.status != 503 {
				t.Fatalf("/health after Close: %d, want 503", r.status)
			}
		})
	}
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }
