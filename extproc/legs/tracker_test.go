package legs

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/scheduler"
)

// recordingAborter records abort calls as "url rid,rid".
type recordingAborter struct {
	mu    sync.Mutex
	calls []string
}

func (a *recordingAborter) Abort(_ context.Context, url string, rids []string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, url+" "+strings.Join(rids, ","))
	return nil
}

func (a *recordingAborter) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

var (
	prefillEP = &scheduler.Endpoint{Role: scheduler.RolePrefill, URL: "http://p:1", Address: "10.0.0.1:1"}
	decodeEP  = &scheduler.Endpoint{Role: scheduler.RoleDecode, URL: "http://d:2", Address: "10.0.0.2:2"}
	// fallbackEP is the decode engine listed second.
	fallbackEP = &scheduler.Endpoint{Role: scheduler.RoleDecode, URL: "http://f:3", Address: "10.0.0.3:3"}
	pd         = scheduler.Decision{
		Prefill: &scheduler.Target{Endpoint: prefillEP, Rank: 1},
		Decode:  scheduler.Target{Endpoint: decodeEP, Rank: 0},
	}
)

func entry(leg accesslog.Leg, failed bool) accesslog.Completion {
	return accesslog.Completion{RequestID: "r", Leg: leg, Failed: failed}
}

// unreachable is a decode attempt that got no connection (Envoy's UF).
func unreachable() accesslog.Completion {
	return accesslog.Completion{RequestID: "r", Leg: accesslog.LegDecode, Failed: true, Unreachable: true, ResponseFlags: "UF"}
}

func TestComplete(t *testing.T) {
	ok, fail := false, true
	tests := []struct {
		name      string
		items     int
		entries   []accesslog.Completion
		want      []string
		remaining int
		fallback  *scheduler.Endpoint
	}{
		{"both legs fine", 0, []accesslog.Completion{entry(accesslog.LegPrefill, ok), entry(accesslog.LegDecode, ok)}, nil, 0, nil},
		{"prefill fails first: abort decode", 0,
			[]accesslog.Completion{entry(accesslog.LegPrefill, fail), entry(accesslog.LegDecode, fail)},
			[]string{"http://d:2 r"}, 0, nil},
		{"batch: every item's rid", 3,
			[]accesslog.Completion{entry(accesslog.LegPrefill, fail)},
			[]string{"http://d:2 r_0,r_1,r_2"}, 1, nil},
		{"decode fails first: abort prefill", 0,
			[]accesslog.Completion{entry(accesslog.LegDecode, fail), entry(accesslog.LegPrefill, fail)},
			[]string{"http://p:1 r"}, 0, nil},
		{"prefill failure after decode ended: nothing to abort", 0,
			[]accesslog.Completion{entry(accesslog.LegDecode, ok), entry(accesslog.LegPrefill, fail)}, nil, 0, nil},
		{"client gone before the prefill ended: abort prefill", 0,
			[]accesslog.Completion{entry(accesslog.LegRequest, fail)},
			[]string{"http://p:1 r"}, 1, nil},
		{"client gone, then the aborted prefill ends", 0,
			[]accesslog.Completion{entry(accesslog.LegRequest, fail), entry(accesslog.LegPrefill, fail)},
			[]string{"http://p:1 r"}, 0, nil},
		{"request fine, prefill still running: wait for it", 0,
			[]accesslog.Completion{entry(accesslog.LegDecode, ok), entry(accesslog.LegRequest, ok)}, nil, 1, nil},
		{"only one abort per leg", 0,
			[]accesslog.Completion{entry(accesslog.LegDecode, fail), entry(accesslog.LegRequest, fail)},
			[]string{"http://p:1 r"}, 1, nil},
		{"unknown request", 0,
			[]accesslog.Completion{{RequestID: "other", Leg: accesslog.LegPrefill, Failed: true}}, nil, 1, nil},
		// Envoy retries a decode attempt that could not connect (claim 24).
		{"decode unreachable, retried and served: the prefill lives", 0,
			[]accesslog.Completion{unreachable(), entry(accesslog.LegDecode, ok), entry(accesslog.LegPrefill, ok)}, nil, 0, fallbackEP},
		{"decode unreachable, then the request ends fine", 0,
			[]accesslog.Completion{unreachable(), entry(accesslog.LegRequest, ok), entry(accesslog.LegPrefill, ok)}, nil, 0, fallbackEP},
		{"the retry cannot connect either: abort prefill", 0,
			[]accesslog.Completion{unreachable(), unreachable()}, []string{"http://p:1 r"}, 1, fallbackEP},
		{"the retry failed and the request with it: abort prefill", 0,
			[]accesslog.Completion{unreachable(), entry(accesslog.LegRequest, fail)}, []string{"http://p:1 r"}, 1, fallbackEP},
		{"prefill fails after the retry: abort decode on the fallback engine", 0,
			[]accesslog.Completion{unreachable(), entry(accesslog.LegPrefill, fail)}, []string{"http://f:3 r"}, 1, fallbackEP},
		{"prefill fails after a retry on a host duet did not list: nothing to call", 0,
			[]accesslog.Completion{unreachable(), entry(accesslog.LegPrefill, fail)}, nil, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &recordingAborter{}
			tr := New(Options{Aborter: a, AbortRetries: []time.Duration{}})
			tr.Track("r", tt.items, pd, tt.fallback)
			for _, e := range tt.entries {
				tr.Complete(context.Background(), e)
			}
			tr.Wait()
			if got := a.list(); !slices.Equal(got, tt.want) {
				t.Errorf("aborts = %q, want %q", got, tt.want)
			}
			if tr.Len() != tt.remaining {
				t.Errorf("tracked = %d, want %d", tr.Len(), tt.remaining)
			}
		})
	}
}

// An abort is sent again while the aborted leg has not ended (the engine
// may not have registered its rid yet), and no more once it has.
func TestAbortRetriesUntilTheLegEnds(t *testing.T) {
	a := &recordingAborter{}
	tr := New(Options{Aborter: a, AbortRetries: []time.Duration{20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}})
	tr.Track("r", 0, pd, nil)
	tr.Complete(context.Background(), entry(accesslog.LegPrefill, true))
	deadline := time.Now().Add(5 * time.Second)
	for len(a.list()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the abort was not repeated")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tr.Complete(context.Background(), entry(accesslog.LegDecode, true))
	tr.Wait()
	if n := len(a.list()); n < 2 || n > 3 {
		t.Errorf("%d abort calls, want 2 or 3: the retries must stop once the decode leg ended", n)
	}
	if tr.Len() != 0 {
		t.Errorf("tracked = %d after both legs ended", tr.Len())
	}

	// Without an ending, every retry is sent.
	a2 := &recordingAborter{}
	tr2 := New(Options{Aborter: a2, AbortRetries: []time.Duration{time.Millisecond, time.Millisecond}})
	tr2.Track("r", 0, pd, nil)
	tr2.Complete(context.Background(), entry(accesslog.LegPrefill, true))
	tr2.Wait()
	if n := len(a2.list()); n != 3 {
		t.Errorf("%d abort calls with the leg never ending, want 1 + 2 retries", n)
	}
}

func TestTrackIgnoresAggregated(t *testing.T) {
	tr := New(Options{Aborter: &recordingAborter{}})
	tr.Track("r", 0, scheduler.Decision{Decode: pd.Decode}, nil)
	if tr.Len() != 0 {
		t.Fatal("an aggregated request was tracked")
	}
}

func TestEjected(t *testing.T) {
	other := &scheduler.Endpoint{Role: scheduler.RolePrefill, URL: "http://p2:1"}
	tests := []struct {
		name string
		role scheduler.Role
		url  string
		rank int
		want []string
	}{
		{"prefill engine: abort it and the decode partner", scheduler.RolePrefill, "http://p:1", scheduler.NoRank,
			[]string{"http://d:2 a", "http://p:1 a"}},
		{"prefill rank 1 only", scheduler.RolePrefill, "http://p:1", 1, []string{"http://d:2 a", "http://p:1 a"}},
		{"another prefill rank", scheduler.RolePrefill, "http://p:1", 0, nil},
		{"decode engine", scheduler.RoleDecode, "http://d:2", scheduler.NoRank,
			[]string{"http://d:2 a", "http://d:2 b", "http://p2:1 b", "http://p:1 a"}},
		{"unrelated engine", scheduler.RolePrefill, "http://x:1", scheduler.NoRank, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &recordingAborter{}
			tr := New(Options{Aborter: a, AbortRetries: []time.Duration{}})
			tr.Track("a", 0, pd, nil)
			tr.Track("b", 0, scheduler.Decision{Prefill: &scheduler.Target{Endpoint: other, Rank: 0}, Decode: pd.Decode}, nil)
			tr.Ejected(context.Background(), tt.role, tt.url, tt.rank)
			tr.Wait()
			got := a.list()
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("aborts = %q, want %q", got, tt.want)
			}
			// A second ejection aborts nothing more.
			tr.Ejected(context.Background(), tt.role, tt.url, tt.rank)
			tr.Wait()
			if n := len(a.list()); n != len(tt.want) {
				t.Errorf("second ejection: %d aborts, want %d", n, len(tt.want))
			}
		})
	}
}

func TestSweep(t *testing.T) {
	tr := New(Options{Aborter: &recordingAborter{}, TTL: time.Minute})
	now := time.Unix(1000, 0)
	tr.now = func() time.Time { return now }
	tr.Track("old", 0, pd, nil)
	now = now.Add(2 * time.Minute)
	tr.Track("new", 0, pd, nil)
	if n := tr.Sweep(); n != 1 || tr.Len() != 1 {
		t.Fatalf("Sweep = %d, tracked %d; want 1, 1", n, tr.Len())
	}
}

// blockingAborter blocks until released.
type blockingAborter struct{ release chan struct{} }

func (a *blockingAborter) Abort(context.Context, string, []string) error {
	<-a.release
	return nil
}

func TestAbortsAreBoundedAndCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := &blockingAborter{release: make(chan struct{})}
	tr := New(Options{Aborter: a, MaxInFlight: 1, Registerer: reg, AbortRetries: []time.Duration{}})
	for _, id := range []string{"x", "y"} {
		tr.Track(id, 0, pd, nil)
		tr.Complete(context.Background(), accesslog.Completion{RequestID: id, Leg: accesslog.LegPrefill, Failed: true})
	}
	close(a.release)
	tr.Wait()
	if got := testutil.ToFloat64(tr.aborts.WithLabelValues("decode", ReasonPrefillFailed, "ok")); got != 1 {
		t.Errorf("ok aborts = %v, want 1", got)
	}
	if got := testutil.ToFloat64(tr.aborts.WithLabelValues("decode", ReasonPrefillFailed, "dropped")); got != 1 {
		t.Errorf("dropped aborts = %v, want 1", got)
	}
}

func TestHTTPAborter(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := new(strings.Builder)
		_, _ = ioCopy(buf, r)
		mu.Lock()
		bodies = append(bodies, r.Method+" "+r.URL.Path+" "+buf.String())
		mu.Unlock()
		if strings.Contains(buf.String(), "bad") {
			http.Error(w, "nope", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	a := &HTTPAborter{Timeout: time.Second}
	if err := a.Abort(context.Background(), srv.URL, []string{"r_0", "r_1"}); err != nil {
		t.Fatal(err)
	}
	want := []string{`POST /abort_request {"rid":"r_0"}`, `POST /abort_request {"rid":"r_1"}`}
	if !slices.Equal(bodies, want) {
		t.Errorf("calls = %q, want %q", bodies, want)
	}
	if err := a.Abort(context.Background(), srv.URL, []string{"bad"}); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("error status: err = %v", err)
	}
	if err := a.Abort(context.Background(), "http://127.0.0.1:1", []string{"r"}); err == nil {
		t.Error("closed port: no error")
	}
}
