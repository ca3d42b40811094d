package scheduler

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// response is a canned HTTP answer of a fake engine.
type response struct {
	status int
	body   string
}

// dropConnection as a response status makes the fake engine close the
// connection without answering: a transport failure for the client.
const dropConnection = -1

// fakeEngine is a loopback HTTP server that answers a configurable set of
// paths; any other path gets 404.
type fakeEngine struct {
	srv *httptest.Server

	mu        sync.Mutex
	responses map[string]response
	hits      map[string]int
}

func newFakeEngine(t *testing.T, responses map[string]response) *fakeEngine {
	t.Helper()
	f := &fakeEngine{hits: make(map[string]int)}
	f.set(responses)
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	resp, ok := f.responses[r.URL.Path]
	f.hits[r.URL.Path]++
	f.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	if resp.status == dropConnection {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.status)
	fmt.Fprint(w, resp.body)
}

// set replaces the engine's answers.
func (f *fakeEngine) set(responses map[string]response) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.responses = make(map[string]response, len(responses))
	for k, v := range responses {
		f.responses[k] = v
	}
}

func (f *fakeEngine) hitCount(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[path]
}

// url returns the engine's base URL.
func (f *fakeEngine) url() string { return f.srv.URL }

// addr returns the engine's host:port.
func (f *fakeEngine) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

// info returns a /server_info body. A negative port leaves
// disaggregation_bootstrap_port out; an empty mode leaves
// disaggregation_mode out.
func info(dp int, mode string, port int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"dp_size":%d,"tp_size":1,"model_path":"m"`, dp)
	if mode != "" {
		fmt.Fprintf(&b, `,"disaggregation_mode":%q`, mode)
	}
	if port >= 0 {
		fmt.Fprintf(&b, `,"disaggregation_bootstrap_port":%d`, port)
	}
	b.WriteString(`,"internal_states":[{}]}`)
	return b.String()
}

// ok is a 200 answer with body.
func ok(body string) response { return response{status: http.StatusOK, body: body} }

// serverInfo200 answers /server_info only, with body.
func serverInfo200(body string) map[string]response {
	return map[string]response{"/server_info": ok(body)}
}

// observedLogger returns a logger that records entries at info level and
// above.
func observedLogger() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	return zap.New(core), logs
}

// testConfig fills in the timing fields tests rely on.
func testConfig(cfg Config) Config {
	if cfg.DiscoveryTimeout == 0 {
		cfg.DiscoveryTimeout = 2 * time.Second
	}
	return cfg
}

// newTestScheduler builds a scheduler or fails the test.
func newTestScheduler(t *testing.T, cfg Config, log *zap.Logger) *Scheduler {
	t.Helper()
	if log == nil {
		log = zap.NewNop()
	}
	s, err := New(testConfig(cfg), log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// testContext returns a context that ends with the test or after a bound.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dialTo returns an HTTP client that connects to addr whatever host a URL
// names, so that tests can use hostnames without DNS.
func dialTo(addr string) *http.Client {
	var d net.Dialer
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}}
}

// mustDiscover runs one discovery round that must succeed.
func mustDiscover(t *testing.T, s *Scheduler) {
	t.Helper()
	if err := s.Discover(testContext(t)); err != nil {
		t.Fatalf("Discover: %v", err)
	}
}
