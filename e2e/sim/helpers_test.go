package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// testServer is a simulator behind httptest servers.
type testServer struct {
	sim  *Server
	api  *httptest.Server
	boot *httptest.Server // prefill only
}

// bootHost and bootPort are the bootstrap address of a prefill.
func (ts *testServer) bootHostPort(t *testing.T) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(strings.TrimPrefix(ts.boot.URL, "http://"))
	if err != nil {
		t.Fatalf("split %s: %v", ts.boot.URL, err)
	}
	p, _ := strconv.Atoi(port)
	return host, p
}

// startTest builds a simulator with cfg and serves it on loopback.
func startTest(t *testing.T, cfg Config) *testServer {
	t.Helper()
	if cfg.KVPollInterval == 0 {
		cfg.KVPollInterval = 2 * time.Millisecond
	}
	s, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// Registered first, so it runs last: stops the engine model.
	t.Cleanup(func() { _ = s.Close() })
	ts := &testServer{sim: s, api: httptest.NewServer(s.Handler())}
	t.Cleanup(ts.api.Close)
	if h := s.BootstrapHandler(); h != nil {
		ts.boot = httptest.NewServer(h)
		t.Cleanup(ts.boot.Close)
	}
	return ts
}

// startPD starts a prefill and a decode; the decode's own bootstrap port
// is the prefill's, so a null bootstrap_port works.
func startPD(t *testing.T, prefillDP, decodeDP int, kvTimeout time.Duration) (p, d *testServer) {
	t.Helper()
	p = startTest(t, Config{Mode: ModePrefill, DPSize: prefillDP})
	_, port := p.bootHostPort(t)
	d = startTest(t, Config{Mode: ModeDecode, DPSize: decodeDP, BootstrapPort: port, KVTimeout: kvTimeout})
	return p, d
}

// response is a finished HTTP exchange.
type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into v.
func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
}

// post sends a JSON body with optional headers (name, value pairs).
func post(t *testing.T, url, body string, headers ...string) response {
	t.Helper()
	return postCtx(context.Background(), t, url, body, headers...)
}

// newPost builds a JSON POST with headers given as name, value pairs.
func newPost(ctx context.Context, t *testing.T, url, body string, headers ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return req
}

// postCtx is post with a context.
func postCtx(ctx context.Context, t *testing.T, url, body string, headers ...string) response {
	t.Helper()
	req := newPost(ctx, t, url, body, headers...)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return response{}
		}
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil && ctx.Err() == nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// get fetches url.
func get(t *testing.T, url string) response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// lastRecord returns the newest record of s.
func lastRecord(t *testing.T, s *Server) Record {
	t.Helper()
	recs := s.Records()
	if len(recs) == 0 {
		t.Fatal("no records")
	}
	return recs[len(recs)-1]
}

// sseEvents splits an SSE body into its data payloads, checking that every
// event is framed as "[event: x\n]data: ...\n\n".
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	if !bytes.HasSuffix(body, []byte("\n\n")) {
		t.Fatalf("SSE body does not end with a blank line: %q", body)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		sc := bufio.NewScanner(strings.NewReader(ev))
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			case strings.HasPrefix(line, "event: "):
			default:
				t.Fatalf("bad SSE line %q in %q", line, body)
			}
		}
		if len(data) != 1 {
			t.Fatalf("event without exactly one data line: %q", ev)
		}
		out = append(out, data[0])
	}
	return out
}

// eventually polls cond until it holds or 5s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// pdBody builds a chat body with bootstrap fields and extra JSON fields.
func pdBody(host string, port any, room any, extra string) string {
	portJSON, _ := json.Marshal(port)
	roomJSON, _ := json.Marshal(room)
	hostJSON, _ := json.Marshal(host)
	b := `{"model":"sim-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":3,` +
		`"bootstrap_host":` + string(hostJSON) + `,"bootstrap_port":` + string(portJSON) + `,"bootstrap_room":` + string(roomJSON)
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// intp returns a pointer to v.
func intp(v int) *int { return &v }
