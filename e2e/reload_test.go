package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// reloadStreamTokens and reloadMsPerToken make the stream that spans the
// reload last about 4 s.
const (
	reloadStreamTokens = 800
	reloadMsPerToken   = 5
)

// TestReloadEndpoints: duet reloads its endpoint lists on SIGHUP, on the
// real Envoy (which lists both decode engines from the start). Removing
// decode-1 sends every new request to decode-0, while a stream that
// decode-1 was serving before the reload finishes in full; listing decode-1
// again brings it back into the rotation.
func TestReloadEndpoints(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:          []harness.SimSpec{{}},
		Decode:           []harness.SimSpec{{}, {}},
		DecodeMsPerToken: reloadMsPerToken,
		KVTimeout:        20 * time.Second,
	})
	d0, d1 := s.Decode[0], s.Decode[1]
	cfgPath := filepath.Join(s.Dir, "duet.yaml")
	original, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	d1Line := "  - url: " + d1.URL + "\n"
	if !strings.Contains(string(original), d1Line) {
		t.Fatalf("duet.yaml does not list decode-1 as %q:\n%s", d1Line, original)
	}

	// Before: round_robin spreads requests over both decode engines.
	if got := decodeServers(t, s, "before", 4); got[d0.Address] == 0 || got[d1.Address] == 0 {
		t.Fatalf("before the reload, requests reached %v; want both decode engines", got)
	}

	// A long stream on decode-1 (round_robin: one of two consecutive
	// streams lands there; the other is read to its end too).
	var onD1 *longStream
	for i := 0; i < 4 && onD1 == nil; i++ {
		ls := startLongStream(t, s, i)
		if ls.server == d1.Address {
			onD1 = ls
		}
	}
	if onD1 == nil {
		t.Fatal("no stream landed on decode-1")
	}

	// Reload without decode-1.
	reload(t, s, cfgPath, strings.Replace(string(original), d1Line, "", 1), 1)
	if onD1.finished() {
		t.Fatal("the decode-1 stream ended before the reload took effect; lengthen it")
	}
	if got := decodeServers(t, s, "removed", 8); got[d1.Address] != 0 || got[d0.Address] != 8 {
		t.Errorf("after removing decode-1, requests reached %v; want all 8 on decode-0", got)
	}
	if onD1.finished() {
		t.Error("the decode-1 stream ended before the requests after the reload; the test proves less than it claims")
	}
	if err := onD1.wait(20 * time.Second); err != nil {
		t.Errorf("the stream decode-1 served across the reload: %v", err)
	}

	// Reload with decode-1 listed again: it is discovered before the
	// reload is counted, and takes its turn again.
	reload(t, s, cfgPath, string(original), 2)
	if got := decodeServers(t, s, "re-added", 6); got[d1.Address] == 0 || got[d0.Address] == 0 {
		t.Errorf("after re-adding decode-1, requests reached %v; want both decode engines", got)
	}

	if n := duetMetricSum(t, s, "duet_config_reloads_total", map[string]string{"outcome": "invalid"}); n != 0 {
		t.Errorf("duet_config_reloads_total{outcome=invalid} = %v", n)
	}
	log := s.Duet.Tail(1 << 20)
	for _, want := range []string{"endpoint removed", "endpoint added", "configuration reloaded"} {
		if !strings.Contains(log, want) {
			t.Errorf("duet's log lacks %q", want)
		}
	}
	waitReservationsDrained(t, s)
	noPanics(t, s)
}

// reload writes cfg as duet's configuration, sends duet SIGHUP and waits
// (bounded) until duet counts reload number n as applied.
func reload(t *testing.T, s *harness.Stack, path, cfg string, n int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Duet.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for duetMetricSum(t, s, "duet_config_reloads_total", map[string]string{"outcome": "ok"}) < float64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("reload %d not applied within 10s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// decodeServers sends n short chat requests one after another and counts
// the decode engines that answered them (X-Sim-Server). Every request must
// succeed.
func decodeServers(t *testing.T, s *harness.Stack, phase string, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		resp, body := send(t, s, "POST", "/v1/chat/completions",
			map[string]string{"x-request-id": requestID(t, i) + "-" + phase}, chatBody(false, ""))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: request %d: status %d: %s", phase, i, resp.StatusCode, body)
		}
		got[resp.Header.Get("X-Sim-Server")]++
	}
	return got
}

// longStream is a streamed chat request being read in the background.
type longStream struct {
	server string        // the decode engine serving it (X-Sim-Server)
	done   chan struct{} // closed when the body has been read
	err    error         // set before done is closed
}

// startLongStream starts a streamed chat request of reloadStreamTokens
// tokens, waits for its headers and reads the rest in the background,
// checking that it ends with [DONE] and carries no error event.
func startLongStream(t *testing.T, s *harness.Stack, i int) *longStream {
	t.Helper()
	body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"long stream %d"}],"max_tokens":%d,"stream":true}`,
		i, reloadStreamTokens)
	req, err := http.NewRequest(http.MethodPost, s.EnvoyURL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-request-id", requestID(t, i)+"-long")
	resp, err := httpClient.Do(req) // 30 s timeout bounds the whole stream
	if err != nil {
		t.Fatalf("long stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("long stream: status %d", resp.StatusCode)
	}
	ls := &longStream{server: resp.Header.Get("X-Sim-Server"), done: make(chan struct{})}
	go func() {
		defer close(ls.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		chunks, sawDone := 0, false
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "data: [DONE]":
				sawDone = true
			case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"error"`):
				ls.err = fmt.Errorf("error event: %.300s", line)
				return
			case strings.HasPrefix(line, "data: "):
				chunks++
			}
		}
		switch {
		case sc.Err() != nil:
			ls.err = fmt.Errorf("after %d chunks: %w", chunks, sc.Err())
		case !sawDone:
			ls.err = fmt.Errorf("cut after %d chunks without [DONE]", chunks)
		case chunks < reloadStreamTokens/2:
			ls.err = fmt.Errorf("only %d chunks for %d tokens", chunks, reloadStreamTokens)
		}
	}()
	t.Cleanup(func() { _ = ls.wait(30 * time.Second) })
	return ls
}

// finished reports whether the stream's body has been read to its end.
func (ls *longStream) finished() bool {
	select {
	case <-ls.done:
		return true
	default:
		return false
	}
}

// wait waits up to d for the stream to end and returns its error.
func (ls *longStream) wait(d time.Duration) error {
	select {
	case <-ls.done:
		return ls.err
	case <-time.After(d):
		return fmt.Errorf("not finished after %v", d)
	}
}
