package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/e2e/harness"
)

// freePortRange returns a base port such that base..base+n-1 are free
// on loopback now.
func freePortRange(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if base+n > 65535 {
			continue
		}
		free := true
		for p := base + 1; p < base+n; p++ {
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err != nil {
				free = false
			} else {
				l.Close()
			}
		}
		if free {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// kvEventRanks returns the kv_events states of the endpoint url's ranks in
// a /status.json body, in rank order ("" for a rank without).
func kvEventRanks(body []byte, url string) (states []string, blocks int64) {
	for _, ep := range gjson.GetBytes(body, "endpoints").Array() {
		if ep.Get("url").Str != url {
			continue
		}
		for _, r := range ep.Get("ranks").Array() {
			states = append(states, r.Get("kv_events.state").Str)
			blocks += r.Get("kv_events.blocks").Int()
		}
	}
	return states, blocks
}

// allStates reports whether every state is want.
func allStates(states []string, want string) bool {
	for _, s := range states {
		if s != want {
			return false
		}
	}
	return len(states) > 0
}

// TestKVEventsFallBackAndRecover runs a prefill engine that publishes
// SGLang's KV events (duet-sim --kv-events-config, two DP ranks, replay)
// behind a real Envoy and duet following them (kv_events.mode on: the
// requests carry input_ids). Both ranks' views go live from the
// advertised ports; the publisher then dies for 3 s (its sockets close and
// its cache empties, as a restarted SGLang process), duet's probes see
// the ports refuse and both ranks fall back to the prefix estimate, and
// when the publisher is back (sequence from 0, AllBlocksCleared first)
// they are live again. Every request sent meanwhile is served.
func TestKVEventsFallBackAndRecover(t *testing.T) {
	pub, replay := freePortRange(t, 2), freePortRange(t, 2)
	events := fmt.Sprintf(`{"publisher":"zmq","endpoint":"tcp://*:%d","replay_endpoint":"tcp://*:%d"}`, pub, replay)
	simArgs := []string{"--profile", "dense-8b-h100", "--time-scale", "10"}
	s := startStack(t, harness.Options{
		Prefill:       []harness.SimSpec{{DPSize: 2, Args: append([]string{"--kv-events-config", events}, simArgs...)}},
		Decode:        []harness.SimSpec{{DPSize: 1, Args: simArgs}},
		PrefillPolicy: "least_cost",
		DecodePolicy:  "least_cost",
		DuetYAML:      "kv_events:\n  mode: on\n  probe_interval: 100ms\n",
		KVTimeout:     60 * time.Second,
	})
	prefill := s.Prefill[0]

	served := 0
	generate := func(i int) {
		t.Helper()
		ids := make([]string, 600)
		for j := range ids {
			ids[j] = fmt.Sprint((i*7919+j*31)%50000 + 1)
		}
		body := `{"input_ids":[` + strings.Join(ids, ",") + `],"sampling_params":{"max_new_tokens":4}}`
		resp, data := send(t, s, http.MethodPost, "/generate", map[string]string{"x-request-id": requestID(t, i)}, []byte(body))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, data)
		}
		served++
	}
	waitRanks := func(what string, ok func(states []string, blocks int64) bool, during func(i int)) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		var last []byte
		for i := 0; time.Now().Before(deadline); i++ {
			if during != nil {
				during(i)
			}
			resp, err := http.Get(s.DuetAdminURL + "/status.json")
			if err == nil {
				last, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				if json.Valid(last) && ok(kvEventRanks(last, prefill.URL)) {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		states, blocks := kvEventRanks(last, prefill.URL)
		t.Fatalf("waiting for %s: prefill ranks %q, %d blocks", what, states, blocks)
	}

	// Distinct prompts spread over both ranks (least_cost sends a new
	// prompt where the cache holds least); their prefills fill both views.
	waitRanks("both ranks live, with blocks", func(st []string, b int64) bool { return allStates(st, "live") && b > 0 },
		func(i int) { generate(i) })

	setFaults(t, prefill, `{"kv_events_down_ms": 3000}`)
	waitRanks("both ranks falling back", func(st []string, _ int64) bool { return allStates(st, "fallback") }, nil)
	for i := range 4 { // served on the estimate
		generate(100 + i)
	}
	waitRanks("both ranks live again", func(st []string, b int64) bool { return allStates(st, "live") && b > 0 },
		func(i int) { generate(200 + i) })

	metrics := scrapeText(t, s.DuetAdminURL+"/metrics")
	for r := range 2 {
		name := fmt.Sprintf(`duet_kv_events_fallbacks_total{pool="default",reason="unreachable",target="%s#%d"}`, prefill.URL, r)
		if !strings.Contains(metrics, name+" 1") {
			t.Errorf("metrics lack %s 1", name)
		}
	}
	t.Logf("%d requests served; every one answered 200", served)
}

// TestKVEventsIdleEngineAfterDuetRestart: duet restarts beside engines
// that have been idle for longer than kv_events.max_lag (1 s here), as the
// issue's repro does with SGLang-shaped duet-sim engines (--profile
// dense-8b-h100 --tokenizer-path qwen3 --kv-events-config with a replay
// endpoint) behind a real Envoy. The engines hold caches that the new duet
// has not seen; it fetches them by replay on subscribing, and that history
// is not lag: both prefill ranks are live again at once, with their
// blocks, and stay live while the engines publish nothing, with no lag
// fallback counted or logged. (Before, the replayed batches' age made
// every rank fall back until its engine published again, which an idle
// one never does.)
func TestKVEventsIdleEngineAfterDuetRestart(t *testing.T) {
	tok := filepath.Join(tokenizersDir(t), "qwen3")
	pub, replay := freePortRange(t, 2), freePortRange(t, 2)
	events := fmt.Sprintf(`{"publisher":"zmq","endpoint":"tcp://*:%d","replay_endpoint":"tcp://*:%d"}`, pub, replay)
	engine := []string{"--profile", "dense-8b-h100", "--tokenizer-path", tok, "--time-scale", "10"}
	const maxLag = time.Second
	s := startStack(t, harness.Options{
		Prefill:       []harness.SimSpec{{DPSize: 2, Args: append([]string{"--kv-events-config", events}, engine...)}},
		Decode:        []harness.SimSpec{{DPSize: 1, Args: engine}},
		PrefillPolicy: "least_cost",
		DecodePolicy:  "least_cost",
		KVTimeout:     30 * time.Second,
		DuetYAML: fmt.Sprintf("tokenizer:\n  file: %s\n  config: %s\n  page_size: 16\nkv_events:\n  max_lag: %s\n  probe_interval: 100ms\n",
			filepath.Join(tok, "tokenizer.json"), filepath.Join(tok, "tokenizer_config.json"), maxLag),
	})
	prefill := s.Prefill[0]
	status := func() ([]string, int64) {
		resp, err := httpClient.Get(s.DuetAdminURL + "/status.json")
		if err != nil {
			return nil, 0
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return kvEventRanks(body, prefill.URL)
	}
	waitLive := func(what string, during func(i int)) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for i := 0; ; i++ {
			if during != nil {
				during(i)
			}
			states, blocks := status()
			if allStates(states, "live") && len(states) == 2 && blocks > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: prefill ranks %q, %d blocks; duet's log:\n%s", what, states, blocks, s.Duet.Tail(8000))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Distinct tenants' chats, tokenized by duet and by the engines alike,
	// until both prefill ranks' views hold blocks.
	waitLive("both ranks live, with blocks", func(i int) {
		system := strings.Repeat(fmt.Sprintf("You are a careful assistant for tenant %d. ", i), 40)
		body := fmt.Sprintf(`{"model":"sim-model","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d?"}]}`, system, i)
		resp, data := send(t, s, http.MethodPost, "/v1/chat/completions", map[string]string{"x-request-id": requestID(t, i)}, []byte(body))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, data)
		}
	})

	// duet goes away; the engines stay idle for twice max_lag; duet comes
	// back to caches it has forgotten.
	if err := s.Duet.Stop(10 * time.Second); err != nil {
		t.Logf("duet stopped: %v", err)
	}
	time.Sleep(2 * maxLag)
	before, err := os.ReadFile(s.Duet.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.RestartDuet(ctx); err != nil {
		t.Fatalf("restart duet: %v", err)
	}
	restarted := time.Now()
	waitLive("both ranks live again from the engines' replayed history, with no new batch", nil)
	t.Logf("both prefill ranks live %s after duet's restart", time.Since(restarted).Round(time.Millisecond))
	time.Sleep(2 * maxLag) // still idle: nothing may turn them back to fallback
	if states, _ := status(); !allStates(states, "live") {
		t.Fatalf("prefill ranks %q %s after the restart, the engines idle: want live", states, time.Since(restarted).Round(time.Millisecond))
	}

	metrics := scrapeText(t, s.DuetAdminURL+"/metrics")
	for r := range 2 {
		target := fmt.Sprintf(`pool="default",target="%s#%d"`, prefill.URL, r)
		for _, want := range []string{
			fmt.Sprintf(`duet_kv_events_state{%s} 2`, target),
			fmt.Sprintf(`duet_kv_events_fallbacks_total{pool="default",reason="lag",target="%s#%d"} 0`, prefill.URL, r),
		} {
			if !strings.Contains(metrics, want+"\n") {
				t.Errorf("metrics lack %s", want)
			}
		}
		if !strings.Contains(metrics, fmt.Sprintf(`duet_kv_events_replayed_total{%s}`, target)) ||
			strings.Contains(metrics, fmt.Sprintf(`duet_kv_events_replayed_total{%s} 0`, target)) {
			t.Errorf("rank %d: want batches replayed on subscribing", r)
		}
		if !strings.Contains(metrics, fmt.Sprintf(`duet_kv_events_batches_total{%s}`, target)) {
			t.Errorf("rank %d: no batch count", r)
		}
	}
	log, err := os.ReadFile(s.Duet.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if after := string(log[len(before):]); strings.Contains(after, "KV events lag") {
		t.Errorf("duet logged a lag after its restart:\n%s", after)
	}
}

// TestKVEventsUnreachablePort: duet follows engines that do not advertise
// their publisher at a configured kv_events.port where nothing listens
// (the repro). Each rank counts one "unreachable" fallback though
// it was never anything but fallback, and its state change is logged once
// (a warning from the probe, an info line from the subscription), not
// again at every retry. (Before: the counter stayed 0, and an info line
// came every few seconds per rank, forever.)
func TestKVEventsUnreachablePort(t *testing.T) {
	port := freePortRange(t, 2)
	s := startStack(t, harness.Options{
		Prefill:  []harness.SimSpec{{DPSize: 2}},
		Decode:   []harness.SimSpec{{DPSize: 1}},
		LogLevel: "info",
		DuetYAML: fmt.Sprintf("kv_events:\n  mode: on\n  port: %d\n  probe_interval: 100ms\n", port),
	})
	prefill := s.Prefill[0]
	// Several probes, and several of the subscription's retries (each
	// dials for about a second, then backs off 0.1 s, 0.2 s, 0.4 s...).
	time.Sleep(4 * time.Second)
	metrics := scrapeText(t, s.DuetAdminURL+"/metrics")
	log, err := os.ReadFile(s.Duet.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		target := fmt.Sprintf("%s#%d", prefill.URL, r)
		want := fmt.Sprintf(`duet_kv_events_fallbacks_total{pool="default",reason="unreachable",target="%s"} 1`, target)
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
		// Rank 0's port is also the decode engine's (mode on follows it
		// too, on the same loopback host): two subscriptions dial it.
		subscriptions := 2 - r
		endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", port+r)
		var warned, retried int
		for _, line := range strings.Split(string(log), "\n") {
			switch {
			case strings.Contains(line, "KV event port unreachable"): // the probe's, one per target
				if strings.Contains(line, `"`+target+`"`) {
					warned++
				}
			case strings.Contains(line, "KV event") && strings.Contains(line, `"`+endpoint+`"`):
				retried++
			}
		}
		if warned != 1 || retried > subscriptions {
			t.Errorf("rank %d: %d warnings that its port is unreachable (want 1), %d lines from the retries of its port's %d subscriptions (want at most one each); duet's log:\n%s",
				r, warned, retried, subscriptions, log)
		}
	}
}

// scrapeText returns the body of a GET of url.
func scrapeText(t *testing.T, url string) string {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
