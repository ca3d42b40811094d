package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// The fault matrix: each test runs load through the real Envoy and duet
// while one fault happens, and holds the same bar:
//   - every request is served or answered with a clear error (an HTTP error
//     with a JSON message, an in-stream error event, an explicit abort, or a
//     terminated stream) within the test's bound: none is lost;
//   - no client waits for a KV timeout (the engines' is 60 s here);
//   - duet's reservations return to 0;
//   - nothing panics.
// With DUET_FAULT_REPORT set, each test appends its outcome line there.

// faultKVTimeout is the decode engines' KV wait in the fault matrix: long
// enough that a client waiting for it would blow every bound.
const faultKVTimeout = 60 * time.Second

// faultHealth is duet's health section in the fault matrix: fast probes so
// that detection fits the bounds.
const faultHealth = `health:
  interval: 250ms
  timeout: 250ms
  base_ejection: 1s
  max_ejection: 4s
`

// faultClient bounds every request: a client that would wait longer counts
// the request as lost.
var faultClient = &http.Client{Timeout: 20 * time.Second}

// do sends chat request i through s and classifies the answer.
func do(ctx context.Context, s *harness.Stack, i int, stream bool) harness.Result {
	return harness.Chat(ctx, faultClient, s.EnvoyURL, i, stream, 16+i%8)
}

// tally sums a fault test's results.
type tally struct {
	sent, served int
	by           map[harness.Outcome]int
	worst        time.Duration
	details      []string
	errorBodies  []string // the body of every OutcomeError
}

// load runs n requests, conc at a time, alternating streamed and not, and
// calls during (if set) once the first quarter has been sent.
func load(t *testing.T, s *harness.Stack, n, conc int, during func()) tally {
	t.Helper()
	ctx := context.Background()
	results := make([]harness.Result, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, conc)
	for i := range n {
		if during != nil && i == n/4 {
			during()
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = do(ctx, s, i, i%2 == 1)
		}()
	}
	wg.Wait()
	tl := tally{sent: n, by: map[harness.Outcome]int{}}
	for _, r := range results {
		tl.by[r.Outcome]++
		if r.Outcome == harness.OutcomeServed {
			tl.served++
		}
		tl.worst = max(tl.worst, r.Wait)
		if r.Outcome == harness.OutcomeError {
			tl.errorBodies = append(tl.errorBodies, r.Detail)
		}
		if r.Outcome != harness.OutcomeServed && len(tl.details) < 5 {
			tl.details = append(tl.details, fmt.Sprintf("%s %s status %d after %v: %.200s", r.ID, r.Outcome, r.Status, r.Wait.Round(time.Millisecond), r.Detail))
		}
	}
	return tl
}

// check asserts the fault matrix's bar for one test and reports its line.
func (tl tally) check(t *testing.T, s *harness.Stack, fault string, bound time.Duration) {
	t.Helper()
	line := fmt.Sprintf("%-34s sent %3d  served %3d  error %3d  stream_error %3d  aborted %3d  terminated %3d  lost %d  worst wait %v",
		fault, tl.sent, tl.served, tl.by[harness.OutcomeError], tl.by[harness.OutcomeStreamErr], tl.by[harness.OutcomeAborted],
		tl.by[harness.OutcomeTerminated], tl.by[harness.OutcomeLost], tl.worst.Round(time.Millisecond))
	t.Log(line)
	for _, d := range tl.details {
		t.Log("  ", d)
	}
	if path := os.Getenv("DUET_FAULT_REPORT"); path != "" {
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
	if tl.by[harness.OutcomeLost] > 0 {
		t.Errorf("%d requests lost", tl.by[harness.OutcomeLost])
	}
	if tl.worst > bound {
		t.Errorf("a client waited %v, bound %v", tl.worst, bound)
	}
	waitReservationsDrained(t, s)
	noPanics(t, s)
}

// waitReservationsDrained waits until duet holds no reservation.
func waitReservationsDrained(t *testing.T, s *harness.Stack) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := duetMetricSum(t, s, "duet_reservations", nil)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("duet_reservations = %v 10s after the load ended, want 0", n)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// noPanics fails the test if any process of the stack logged a panic.
func noPanics(t *testing.T, s *harness.Stack) {
	t.Helper()
	for _, p := range s.Processes() {
		data, err := os.ReadFile(p.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte("panic:")) || bytes.Contains(data, []byte("fatal error:")) {
			t.Errorf("%s panicked: see %s", p.Name, p.LogPath)
		}
	}
}

// faultStack starts a PD stack for the fault matrix: fast health checks and
// a KV timeout no client may wait for.
func faultStack(t *testing.T, prefill, decode []harness.SimSpec) *harness.Stack {
	t.Helper()
	return startStack(t, harness.Options{
		Prefill:   prefill,
		Decode:    decode,
		KVTimeout: faultKVTimeout,
		LogLevel:  "info",
		DuetYAML:  faultHealth,
	})
}

// The case: a prefill that fails at once. Before duet aborted the
// orphaned decode leg, the client waited the whole KV timeout.
func TestFaultPrefillFailing(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2, Args: []string{"--fault-error-rate", "1"}}}, []harness.SimSpec{{DPSize: 2}})
	tl := load(t, s, 24, 4, nil)
	tl.check(t, s, "prefill failing (500 on every request)", 2*time.Second)
	if tl.served != 0 {
		t.Errorf("%d requests served by a prefill that always fails", tl.served)
	}
	// The engines' errors reach clients in the OpenAI envelope, as duet's
	// own 503s do.
	for _, body := range tl.errorBodies {
		if e, err := parseOpenAIError([]byte(body)); err != nil || e.Message == "" || e.Type != "server_error" || e.Code < 500 {
			t.Errorf("error body is not an OpenAI error envelope: %s", body)
		}
	}
}

// setFaults switches an engine's faults at run time (POST /sim/faults).
func setFaults(t *testing.T, sim *harness.Sim, faults string) {
	t.Helper()
	resp, err := httpClient.Post(sim.URL+"/sim/faults", "application/json", strings.NewReader(faults))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: POST /sim/faults %s: status %d", sim.Name, faults, resp.StatusCode)
	}
}

// A prefill engine whose scheduler hangs: its requests never finish, its
// load scrapes never answer, its /health (which generates a token) times
// out. duet ejects it on the failed probes and aborts the decode legs
// waiting for its KV; later requests go to the healthy prefill.
func TestFaultPrefillHanging(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2}, {DPSize: 2}}, []harness.SimSpec{{DPSize: 2}})
	tl := load(t, s, 32, 4, func() { setFaults(t, s.Prefill[1], `{"hang":true}`) })
	tl.check(t, s, "prefill hanging", 4*time.Second)
	if tl.served < tl.sent/2 {
		t.Errorf("only %d of %d served: the healthy prefill should take over", tl.served, tl.sent)
	}
	if n := duetMetricSum(t, s, "duet_leg_aborts_total", map[string]string{"role": "decode", "reason": "prefill_ejected"}); n == 0 {
		t.Error("no decode leg was aborted after the hung prefill's ejection")
	}
}

// A prefill engine killed under load: the mirror's connection fails or is
// reset, duet aborts the decode legs that wait for it and ejects the engine.
func TestFaultPrefillKilled(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2}, {DPSize: 2}}, []harness.SimSpec{{DPSize: 2}})
	tl := load(t, s, 32, 4, func() { s.Prefill[1].Kill() })
	tl.check(t, s, "prefill killed", 3*time.Second)
	if tl.served < tl.sent/2 {
		t.Errorf("only %d of %d served: the other prefill should take over", tl.served, tl.sent)
	}
}

// A decode engine that fails every request: the client gets the engine's
// error at once, duet aborts the prefill legs (which would hold their KV for
// the bootstrap timeout) and ejects the failing targets.
func TestFaultDecodeFailing(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2}}, []harness.SimSpec{{DPSize: 2}, {DPSize: 2, Args: []string{"--fault-error-rate", "1"}}})
	tl := load(t, s, 32, 4, nil)
	tl.check(t, s, "decode failing (500 on every request)", 2*time.Second)
	if tl.served < tl.sent/2 {
		t.Errorf("only %d of %d served: the failing decode targets should be ejected", tl.served, tl.sent)
	}
	// Envoy may log the failed request before its decode leg: the tracker
	// then aborts the prefill as "client_gone" rather than "decode_failed".
	// Either way the prefill legs must be aborted.
	decodeFailed := duetMetricSum(t, s, "duet_leg_aborts_total", map[string]string{"role": "prefill", "reason": "decode_failed"})
	clientGone := duetMetricSum(t, s, "duet_leg_aborts_total", map[string]string{"role": "prefill", "reason": "client_gone"})
	if decodeFailed+clientGone == 0 {
		t.Error("no prefill leg was aborted after its decode failed")
	}
}

// A decode engine killed while it streams: its streams are cut (the client
// sees a terminated stream), new requests that still name it are retried by
// Envoy on the fallback decode host, and duet ejects it.
func TestFaultDecodeKilledMidStream(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2}}, []harness.SimSpec{{DPSize: 2}, {DPSize: 2}})
	tl := load(t, s, 32, 6, func() {
		time.Sleep(30 * time.Millisecond) // let streams start
		s.Decode[1].Kill()
	})
	tl.check(t, s, "decode killed mid-stream", 3*time.Second)
	if tl.served < tl.sent/2 {
		t.Errorf("only %d of %d served", tl.served, tl.sent)
	}
}

// duet killed (SIGKILL) or stopped (SIGTERM) under load: Envoy fails
// closed with a fast 503 and forwards nothing, streams already routed go on,
// and once duet is back Envoy reconnects on its own. The log line gives the
// recovery time: from the restart to the first request served.
func TestFaultDuetDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*harness.Process)
	}{
		{"killed", func(p *harness.Process) { p.Kill() }},
		{"stopped", func(p *harness.Process) { _ = p.Stop(10 * time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := faultStack(t, []harness.SimSpec{{DPSize: 2}}, []harness.SimSpec{{DPSize: 2}})
			restarted := make(chan time.Time, 1)
			tl := load(t, s, 32, 4, func() {
				tc.stop(s.Duet)
				go func() {
					time.Sleep(300 * time.Millisecond)
					restarted <- time.Now()
					if err := s.RestartDuet(context.Background()); err != nil {
						t.Errorf("restart duet: %v", err)
					}
				}()
			})
			began := <-restarted
			deadline := began.Add(10 * time.Second)
			for do(context.Background(), s, 0, false).Outcome != harness.OutcomeServed {
				if time.Now().After(deadline) {
					t.Fatal("no request served 10s after duet restarted")
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("recovered %v after duet's restart began", time.Since(began).Round(time.Millisecond))
			tl.check(t, s, "duet "+tc.name+" and restarted", 3*time.Second)
		})
	}
}

// /v1/loads answering garbage, 500 or too slowly: loads go stale, duet
// schedules on its own reservations, and nothing is ejected or lost.
func TestFaultLoadsBroken(t *testing.T) {
	for _, tc := range []struct{ name, faults string }{
		{"garbage", `{"loads":"garbage"}`},
		{"500", `{"loads":"500"}`},
		{"slow", `{"slow_scrape_ms":3000}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := faultStack(t, []harness.SimSpec{{DPSize: 2}}, []harness.SimSpec{{DPSize: 2}, {DPSize: 2}})
			for _, sim := range append(append([]*harness.Sim{}, s.Prefill...), s.Decode...) {
				setFaults(t, sim, tc.faults)
			}
			time.Sleep(1500 * time.Millisecond) // several failed scrapes
			tl := load(t, s, 24, 4, nil)
			tl.check(t, s, "/v1/loads "+tc.name, 2*time.Second)
			if tl.served != tl.sent {
				t.Errorf("%d of %d served: broken load reports must not cost requests", tl.served, tl.sent)
			}
			if n := duetMetricSum(t, s, "duet_ejections_total", nil); n != 0 {
				t.Errorf("%v ejections: broken load reports must not eject engines", n)
			}
		})
	}
}

// A decode engine that goes down, comes back and goes down again under load.
func TestFaultEngineFlapping(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2}}, []harness.SimSpec{{DPSize: 2}, {DPSize: 2}})
	tl := load(t, s, 48, 4, func() {
		go func() {
			for i := range 3 {
				if i%2 == 0 {
					s.Decode[1].Kill()
				} else if err := s.Decode[1].Restart(context.Background()); err != nil {
					t.Errorf("restart decode-1: %v", err)
				}
				time.Sleep(400 * time.Millisecond)
			}
		}()
	})
	tl.check(t, s, "decode flapping (down, up, down)", 3*time.Second)
}

// Every prefill engine down: once duet has ejected them, requests get a
// fast 503 and nothing is mirrored to nowhere; when they come back, duet
// re-admits them.
func TestFaultAllPrefillsDown(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2}, {DPSize: 2}}, []harness.SimSpec{{DPSize: 2}})
	tl := load(t, s, 32, 4, func() {
		for _, p := range s.Prefill {
			p.Kill()
		}
	})
	tl.check(t, s, "every prefill down", 2*time.Second)
	if tl.by[harness.OutcomeError] == 0 {
		t.Error("no clear error while every prefill was down")
	}
	for _, p := range s.Prefill {
		if err := p.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for do(context.Background(), s, 0, false).Outcome != harness.OutcomeServed {
		if time.Now().After(deadline) {
			t.Fatal("prefills back, but no request served within 15s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A stream whose routing is decided no longer depends on duet: duet ends
// each ext_proc stream once it has answered the request body, so killing
// (or restarting) duet cuts no stream in flight.
func TestStreamOutlivesDuet(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2}}, []harness.SimSpec{{DPSize: 2}})
	done := make(chan harness.Result, 1)
	go func() { done <- harness.Chat(context.Background(), faultClient, s.EnvoyURL, 0, true, 400) }()
	time.Sleep(200 * time.Millisecond) // the stream is flowing (400 tokens take ~0.8 s)
	s.Duet.Kill()
	r := <-done
	if r.Outcome != harness.OutcomeServed {
		t.Fatalf("stream in flight when duet died: %s after %v: %s", r.Outcome, r.Wait, r.Detail)
	}
	if r.Wait < 300*time.Millisecond {
		t.Fatalf("the stream ended after %v: it was not in flight when duet died", r.Wait)
	}
}

// A client that gives up while the prefill still computes: Envoy resets
// the decode leg, and duet aborts the prefill leg at once, which would
// otherwise compute for nothing and hold its KV for the bootstrap timeout.
func TestClientGoneAbortsPrefill(t *testing.T) {
	s := faultStack(t, []harness.SimSpec{{DPSize: 2, Args: []string{"--prefill-ms-per-1k-tokens", "200000"}}}, []harness.SimSpec{{DPSize: 2}})
	id := requestID(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.EnvoyURL+"/v1/chat/completions", bytes.NewReader(chatBody(false, "")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-request-id", id)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the request finished (%d) before the client gave up", resp.StatusCode)
	}
	_, rec := only(t, legs(t, s.Prefill, id, 1))
	if !rec.Aborted {
		t.Errorf("prefill leg not aborted: status %d after %.0f ms (%s)", rec.Status, rec.DurationMS, rec.Error)
	}
	if rec.DurationMS > 3000 {
		t.Errorf("prefill leg ended after %.0f ms, want it aborted right after the client left", rec.DurationMS)
	}
	if n := duetMetricSum(t, s, "duet_leg_aborts_total", map[string]string{"role": "prefill", "outcome": "ok"}); n != 1 {
		t.Errorf("prefill aborts = %v, want 1", n)
	}
	waitReservationsDrained(t, s)
}

// A decode engine that refuses connections: Envoy retries the decode leg on
// the fallback engine duet listed second (claim 24), and the request is
// served. The refused attempt's access-log entry must not make duet abort
// the prefill leg, whose KV the retried decode leg still needs.
func TestFaultDecodeRefusedIsRetriedAndServed(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:   []harness.SimSpec{{DPSize: 2}},
		Decode:    []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		KVTimeout: faultKVTimeout,
		LogLevel:  "info",
		// No probes: only the refused connection tells duet the engine died.
		// Round robin names the dead engine first within two requests.
		DecodePolicy: "round_robin",
		DuetYAML:     "health: {interval: -1s}\n",
	})
	dead, alive := s.Decode[1], s.Decode[0]
	dead.Kill()
	retried := false
	for i := 0; i < 4 && !retried; i++ {
		id := requestID(t, i)
		resp, body := send(t, s, "POST", "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false, ""))
		recs := legs(t, []*harness.Sim{alive}, id, 1)[alive]
		named, fallback, _ := strings.Cut(recs[0].Headers["x-duet-decode-endpoint"], ",")
		if named == dead.Address {
			retried = true
			if fallback != alive.Address {
				t.Errorf("duet listed %q after the dead engine, want %s", fallback, alive.Address)
			}
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request %d (decode hosts %s,%s): status %d: %s", i, named, fallback, resp.StatusCode, body)
		}
	}
	if !retried {
		t.Fatal("duet never named the killed decode engine first, so no retry was exercised")
	}
	if n := duetMetricSum(t, s, "duet_leg_aborts_total", map[string]string{"role": "prefill"}); n != 0 {
		t.Errorf("%v prefill legs aborted: the retried decode leg needed them", n)
	}
}
