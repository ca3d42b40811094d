package load

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// engine is a fake inference engine that counts requests per path.
type engine struct {
	mu      sync.Mutex
	loads   func(w http.ResponseWriter, r *http.Request)
	metrics func(w http.ResponseWriter, r *http.Request)
	hits    map[string]int
	queries []string // raw queries of /v1/loads requests
}

// newEngine starts an engine serving the given handlers; a nil handler
// answers 404.
func newEngine(t *testing.T, loads, metrics http.HandlerFunc) (*engine, *httptest.Server) {
	t.Helper()
	e := &engine{loads: loads, metrics: metrics, hits: map[string]int{}}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return e, srv
}

// ServeHTTP implements http.Handler.
func (e *engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.hits[r.URL.Path]++
	if r.URL.Path == "/v1/loads" {
		e.queries = append(e.queries, r.URL.RawQuery)
	}
	h := map[string]func(http.ResponseWriter, *http.Request){"/v1/loads": e.loads, "/metrics": e.metrics}[r.URL.Path]
	e.mu.Unlock()
	if h == nil {
		http.NotFound(w, r)
		return
	}
	h(w, r)
}

// setLoads replaces the /v1/loads handler.
func (e *engine) setLoads(h http.HandlerFunc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.loads = h
}

// count returns how many requests path received.
func (e *engine) count(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits[path]
}

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

// now returns the current fake time.
func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// advance moves the clock forward.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newTestScraper returns a Scraper on a fake clock.
func newTestScraper(timeout time.Duration) (*Scraper, *fakeClock) {
	clock := &fakeClock{t: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)}
	s := NewScraper(nil, timeout)
	s.now = clock.now
	return s, clock
}

// body returns a handler that answers 200 with b.
func body(b string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(b)) }
}

// status returns a handler that answers code.
func status(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "nope", code) }
}

func TestScrapeLoads(t *testing.T) {
	e, srv := newEngine(t, body(sglangLoadsExample), body(sglangMetricsExample))
	s, clock := newTestScraper(time.Second)
	rep, err := s.Scrape(context.Background(), srv.URL+"/")
	if err != nil {
		t.Fatalf("Scrape() error = %v", err)
	}
	if rep.Source != SourceLoads || len(rep.Ranks) != 2 || rep.Ranks[0].TotalTokens != 45056 {
		t.Fatalf("Scrape() = %+v, want the /v1/loads example", rep)
	}
	if !rep.StartedAt.Equal(clock.now()) || !rep.FinishedAt.Equal(clock.now()) {
		t.Errorf("Scrape() times = %v, %v, want %v", rep.StartedAt, rep.FinishedAt, clock.now())
	}
	if got := e.count("/metrics"); got != 0 {
		t.Errorf("/metrics requests = %d, want 0", got)
	}
	if len(e.queries) != 1 || e.queries[0] != "include=core,disagg" {
		t.Errorf("/v1/loads queries = %q, want [include=core,disagg]", e.queries)
	}
}

func TestScrapeFallbackMemo(t *testing.T) {
	for _, code := range []int{http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			e, srv := newEngine(t, status(code), body(sglangMetricsExample))
			s, clock := newTestScraper(time.Second)
			scrape := func(wantSource string, wantLoads, wantMetrics int) {
				t.Helper()
				rep, err := s.Scrape(context.Background(), srv.URL)
				if err != nil {
					t.Fatalf("Scrape() error = %v", err)
				}
				if rep.Source != wantSource {
					t.Errorf("Scrape() source = %q, want %q", rep.Source, wantSource)
				}
				if got := e.count("/v1/loads"); got != wantLoads {
					t.Errorf("/v1/loads requests = %d, want %d", got, wantLoads)
				}
				if got := e.count("/metrics"); got != wantMetrics {
					t.Errorf("/metrics requests = %d, want %d", got, wantMetrics)
				}
			}
			scrape(SourceMetricsSGLang, 1, 1) // probe, fall back
			scrape(SourceMetricsSGLang, 1, 2) // memo: straight to /metrics
			clock.advance(reprobeInterval - time.Second)
			scrape(SourceMetricsSGLang, 1, 3) // still remembered
			clock.advance(time.Second)
			scrape(SourceMetricsSGLang, 2, 4) // re-probe, still absent
			scrape(SourceMetricsSGLang, 2, 5) // remembered again
			clock.advance(reprobeInterval)
			e.setLoads(body(sglangLoadsExample)) // engine upgraded
			scrape(SourceLoads, 3, 5)
			scrape(SourceLoads, 4, 5)
		})
	}
}

func TestScrapeMemoPerEngine(t *testing.T) {
	old, oldSrv := newEngine(t, nil, body(vllmMetricsExample))
	cur, curSrv := newEngine(t, body(sglangLoadsExample), nil)
	s, _ := newTestScraper(time.Second)
	for range 2 {
		if rep, err := s.Scrape(context.Background(), oldSrv.URL); err != nil || rep.Source != SourceMetricsVLLM {
			t.Fatalf("Scrape(old) = %+v, %v, want vLLM metrics", rep, err)
		}
		if rep, err := s.Scrape(context.Background(), curSrv.URL); err != nil || rep.Source != SourceLoads {
			t.Fatalf("Scrape(new) = %+v, %v, want /v1/loads", rep, err)
		}
	}
	if old.count("/v1/loads") != 1 || cur.count("/v1/loads") != 2 || cur.count("/metrics") != 0 {
		t.Errorf("requests: old /v1/loads %d (want 1), new /v1/loads %d (want 2), new /metrics %d (want 0)",
			old.count("/v1/loads"), cur.count("/v1/loads"), cur.count("/metrics"))
	}
}

func TestScrapeErrors(t *testing.T) {
	huge := strings.Repeat("x", maxBodyBytes+1)
	tests := []struct {
		name    string
		loads   http.HandlerFunc
		metrics http.HandlerFunc
		wantErr error  // checked with errors.Is when set
		wantIn  string // substring of the error besides the URL
		// wantLoads and wantMetrics are the request counts after two scrapes.
		wantLoads, wantMetrics int
	}{
		{name: "500 is an error without fallback", loads: status(http.StatusInternalServerError), metrics: body(sglangMetricsExample),
			wantIn: "HTTP 500: nope", wantLoads: 2},
		{name: "503 is an error without fallback", loads: status(http.StatusServiceUnavailable), metrics: body(sglangMetricsExample),
			wantIn: "HTTP 503", wantLoads: 2},
		{name: "400 is an error without fallback", loads: status(http.StatusBadRequest), metrics: body(sglangMetricsExample),
			wantIn: "HTTP 400", wantLoads: 2},
		{name: "bad JSON is an error without fallback", loads: body(`{"loads":`), metrics: body(sglangMetricsExample),
			wantIn: "invalid JSON", wantLoads: 2},
		{name: "empty loads", loads: body(`{"loads":[]}`), metrics: body(sglangMetricsExample),
			wantErr: ErrNoLoads, wantLoads: 2},
		{name: "oversize /v1/loads", loads: body(huge), metrics: body(sglangMetricsExample),
			wantErr: ErrBodyTooLarge, wantLoads: 2},
		{name: "oversize /metrics", loads: nil, metrics: body(huge),
			wantErr: ErrBodyTooLarge, wantLoads: 1, wantMetrics: 2},
		{name: "unknown metrics", loads: nil, metrics: body("up 1\n"),
			wantErr: ErrNoLoadMetrics, wantLoads: 1, wantMetrics: 2},
		{name: "no /metrics either", loads: nil, metrics: nil,
			wantIn: "HTTP 404", wantLoads: 1, wantMetrics: 2},
		{name: "/metrics 500", loads: nil, metrics: status(http.StatusInternalServerError),
			wantIn: "HTTP 500", wantLoads: 1, wantMetrics: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, srv := newEngine(t, tt.loads, tt.metrics)
			s, _ := newTestScraper(5 * time.Second)
			for range 2 {
				rep, err := s.Scrape(context.Background(), srv.URL)
				if err == nil {
					t.Fatalf("Scrape() = %+v, want error", rep)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("Scrape() error = %v, want %v", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantIn) || !strings.Contains(err.Error(), srv.URL+"/") {
					t.Errorf("Scrape() error = %q, want it to contain %q and the URL", err, tt.wantIn)
				}
				if errors.Is(err, ErrTransport) {
					t.Errorf("Scrape() error = %v matches ErrTransport, but the engine answered", err)
				}
			}
			if got := e.count("/v1/loads"); got != tt.wantLoads {
				t.Errorf("/v1/loads requests = %d, want %d", got, tt.wantLoads)
			}
			if got := e.count("/metrics"); got != tt.wantMetrics {
				t.Errorf("/metrics requests = %d, want %d", got, tt.wantMetrics)
			}
		})
	}
}

func TestScrapeTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	s, _ := newTestScraper(time.Second)
	_, err := s.Scrape(context.Background(), url)
	if err == nil || !strings.Contains(err.Error(), url+"/v1/loads") {
		t.Fatalf("Scrape() error = %v, want an error naming %s/v1/loads", err, url)
	}
	if strings.Count(err.Error(), url) != 1 {
		t.Errorf("Scrape() error = %q, want the URL named once", err)
	}
	if !errors.Is(err, ErrTransport) {
		t.Errorf("Scrape() error = %v does not match ErrTransport", err)
	}
	if s.memo.absent(url, s.now()) {
		t.Errorf("transport error was remembered as /v1/loads absent")
	}
}

func TestScrapeTimeout(t *testing.T) {
	release := make(chan struct{})
	block := func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
	tests := []struct {
		name    string
		loads   http.HandlerFunc
		metrics http.HandlerFunc
		timeout time.Duration // the Scraper's
		ctx     func() (context.Context, context.CancelFunc)
		want    error
	}{
		{name: "scraper timeout on /v1/loads", loads: block, timeout: 100 * time.Millisecond, ctx: background,
			want: context.DeadlineExceeded},
		{name: "scraper timeout on /metrics", metrics: block, timeout: 100 * time.Millisecond, ctx: background,
			want: context.DeadlineExceeded},
		{name: "caller deadline", loads: block, timeout: time.Minute, want: context.DeadlineExceeded,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 50*time.Millisecond)
			}},
		{name: "caller cancel", loads: block, timeout: time.Minute, want: context.Canceled,
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(50*time.Millisecond, cancel)
				return ctx, cancel
			}},
	}
	t.Cleanup(func() { close(release) })
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, srv := newEngine(t, tt.loads, tt.metrics)
			s := NewScraper(nil, tt.timeout)
			ctx, cancel := tt.ctx()
			defer cancel()
			start := time.Now()
			_, err := s.Scrape(ctx, srv.URL)
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Errorf("Scrape() took %v", elapsed)
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Scrape() error = %v, want %v", err, tt.want)
			}
			if !errors.Is(err, ErrTransport) {
				t.Errorf("Scrape() error = %v does not match ErrTransport", err)
			}
		})
	}
}

// background is a context factory for cases without a caller deadline.
func background() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

func TestNewScraperDefaults(t *testing.T) {
	s := NewScraper(nil, 0)
	if s.client == nil || s.timeout != defaultTimeout {
		t.Fatalf("NewScraper(nil, 0) = client %v, timeout %v; want a client and %v", s.client, s.timeout, defaultTimeout)
	}
	c := &http.Client{}
	if s := NewScraper(c, -time.Second); s.client != c || s.timeout != defaultTimeout {
		t.Fatalf("NewScraper(c, -1s) = client %p, timeout %v; want %p and %v", s.client, s.timeout, c, defaultTimeout)
	}
}

func TestScrapeConcurrent(t *testing.T) {
	_, loadsSrv := newEngine(t, body(sglangLoadsExample), nil)
	_, metricsSrv := newEngine(t, nil, body(vllmMetricsExample))
	s := NewScraper(nil, 5*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			base := loadsSrv.URL
			if i%2 == 1 {
				base = metricsSrv.URL
			}
			if _, err := s.Scrape(context.Background(), base); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestAbsentMemoPrunes(t *testing.T) {
	m := newAbsentMemo(time.Minute)
	t0 := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	m.markAbsent("http://a", t0)
	m.markAbsent("http://b", t0.Add(2*time.Minute))
	if len(m.since) != 1 || !m.absent("http://b", t0.Add(2*time.Minute)) {
		t.Fatalf("memo = %v, want only http://b", m.since)
	}
	m.markPresent("http://b")
	if m.absent("http://b", t0.Add(2*time.Minute)) {
		t.Fatalf("http://b still absent after markPresent")
	}
}
