package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A request names its class by the class's API key and its tenant by
// TenantHeader, only where its session names them: a request of neither
// carries no Authorization and no tenant header, as before.
func TestSendClassHeaders(t *testing.T) {
	tests := []struct {
		name, class, tenant string
		wantAuth, wantTen   string
	}{
		{"neither", "", "", "", ""},
		{"class", ClassInteractive, "", "Bearer sk-interactive", ""},
		{"tenant", "", "tenant-2", "", "tenant-2"},
		{"both", ClassBatch, "tenant-1", "Bearer sk-batch", "tenant-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got http.Header
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = r.Header.Clone()
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write([]byte(tokenChunk + doneChunk))
			}))
			defer srv.Close()
			o := Send(context.Background(), srv.Client(), srv.URL, ChatRequest{Model: "m", MaxTokens: 1, Stream: true,
				Messages: []Message{{Role: "user", Content: "hi"}}, Class: tc.class, Tenant: tc.tenant})
			if !o.OK() {
				t.Fatalf("outcome %+v", o)
			}
			_, hasAuth := got["Authorization"]
			_, hasTenant := got[http.CanonicalHeaderKey(TenantHeader)]
			if got.Get("Authorization") != tc.wantAuth || hasAuth != (tc.wantAuth != "") {
				t.Errorf("Authorization %q (present %v), want %q", got.Get("Authorization"), hasAuth, tc.wantAuth)
			}
			if got.Get(TenantHeader) != tc.wantTen || hasTenant != (tc.wantTen != "") {
				t.Errorf("%s %q (present %v), want %q", TenantHeader, got.Get(TenantHeader), hasTenant, tc.wantTen)
			}
			if got.Get("Content-Type") != "application/json" {
				t.Errorf("Content-Type %q", got.Get("Content-Type"))
			}
		})
	}
}

// A 429 is a refusal: not OK, not an error, not unfinished, with its
// Retry-After; another error status stays an error.
func TestSendRefused(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		refused bool
		err     string
	}{
		{"429", http.StatusTooManyRequests, true, ""},
		{"503", http.StatusServiceUnavailable, false, "status 503"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "3")
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(`{"error":{"message":"saturated","code":"rate_limit_exceeded"}}`))
			}))
			defer srv.Close()
			o := Send(context.Background(), srv.Client(), srv.URL, ChatRequest{Model: "m", MaxTokens: 1, Stream: true, Class: ClassBatch})
			if o.Refused != tc.refused || o.OK() || o.Status != tc.status || o.Canceled || !strings.Contains(o.Err, tc.err) || (tc.err == "") != (o.Err == "") {
				t.Fatalf("outcome %+v", o)
			}
			if tc.refused && (o.RetryAfter != "3" || o.Done.Before(o.Sent)) {
				t.Fatalf("refusal %+v", o)
			}
		})
	}
}

// The SLO holds a streamed request to its TTFT and TPOT, a request sent
// without streaming to their sum over its tokens, and nothing that was not
// served.
func TestSLOMet(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	slo := SLO{TTFTms: 200, TPOTms: 10}
	streamed := func(first, last, tokens int) Outcome {
		return Outcome{Stream: true, Sent: t0, First: at(first), Last: at(last), Done: at(last), Chunks: tokens}
	}
	tests := []struct {
		name string
		o    Outcome
		want bool
	}{
		{"in time", streamed(200, 290, 10), true},
		{"late first token", streamed(201, 290, 10), false},
		{"slow tokens", streamed(100, 200, 10), false},
		{"one token", streamed(150, 150, 1), true},
		{"not streamed, in time", Outcome{Sent: t0, Done: at(290), Chunks: 10}, true},
		{"not streamed, late", Outcome{Sent: t0, Done: at(291), Chunks: 10}, false},
		{"refused", Outcome{Stream: true, Sent: t0, Done: at(1), Refused: true}, false},
		{"failed", Outcome{Stream: true, Sent: t0, First: at(10), Last: at(20), Done: at(20), Chunks: 2, Err: "engine error"}, false},
		{"unfinished", Outcome{Stream: true, Sent: t0, First: at(10), Chunks: 2, Canceled: true}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Scale 2: the wall times above are half the model times.
			double := SLO{TTFTms: 2 * slo.TTFTms, TPOTms: 2 * slo.TPOTms}
			if got := slo.Met(tc.o, 1); got != tc.want {
				t.Errorf("Met = %v, want %v", got, tc.want)
			}
			if got := double.Met(tc.o, 2); got != tc.want {
				t.Errorf("scaled: Met = %v, want %v", got, tc.want)
			}
		})
	}
}

// SummarizeClasses counts each class's and tenant's requests in the
// window by outcome, their TTFT over the streamed requests not refused or
// failed, and their goodput; refusals are neither errors nor unfinished
// in the summary. A run without classes has none.
func TestSummarizeClasses(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	served := func(sent, first int) Outcome {
		return Outcome{Stream: true, Sent: at(sent), First: at(first), Last: at(first + 10), Done: at(first + 10), Chunks: 2}
	}
	res := func(offset time.Duration, class, tenant string, o Outcome) Result {
		return Result{Offset: offset, Class: class, Tenant: tenant, Outcome: o}
	}
	results := []Result{
		res(0, ClassBatch, "a", served(0, 10)), // before the window
		res(2*time.Second, ClassInteractive, "a", served(100, 150)),
		res(2*time.Second, ClassInteractive, "b", served(100, 400)), // late: not good
		res(3*time.Second, ClassBatch, "a", Outcome{Stream: true, Sent: at(200), Done: at(205), Refused: true, Status: 429}),
		res(3*time.Second, ClassBatch, "a", Outcome{Stream: true, Sent: at(200), Err: "status 503: x"}),
		res(4*time.Second, ClassBatch, "b", Outcome{Stream: true, Sent: at(300), Canceled: true}),
		res(4*time.Second, ClassBatch, "b", served(300, 350)),
	}
	w := Window{From: time.Second, To: 5 * time.Second}
	var s Summary
	// Scale 10: 100 ms of wall time is one model second.
	s.Summarize(results, nil, nil, w, t0, at(500), 10)
	if s.Requests != 6 || s.Completed != 3 || s.Refused != 1 || s.Errors != 1 || s.Unfinished != 1 {
		t.Fatalf("summary counts %+v", s)
	}
	s.SummarizeClasses(results, w, at(500), 10, SLO{TTFTms: 1000, TPOTms: 200})
	if s.SLO == nil || s.SLO.TTFTms != 1000 || len(s.Classes) != 2 || s.Classes[0].Class != ClassInteractive || s.Classes[1].Class != ClassBatch {
		t.Fatalf("classes %+v, SLO %v", s.Classes, s.SLO)
	}
	in, batch := s.Classes[0], s.Classes[1]
	// Interactive: TTFT 500 and 3000 model ms, one within 1000.
	if in.Requests != 2 || in.Completed != 2 || in.Good != 1 || in.TTFTms.N != 2 || !near(in.TTFTms.P50, 1750) || !near(in.Goodput, 0.25) {
		t.Errorf("interactive %+v", in)
	}
	// Batch: a refusal after 50 model ms, an error, an unfinished request
	// (TTFT its 2000 ms to the cutoff) and one served in 500 ms.
	if batch.Requests != 4 || batch.Completed != 1 || batch.Refused != 1 || batch.Errors != 1 || batch.Unfinished != 1 || batch.Good != 1 ||
		batch.TTFTms.N != 2 || !near(batch.TTFTms.Mean, 1250) || batch.RefusedMs.N != 1 || !near(batch.RefusedMs.P50, 50) {
		t.Errorf("batch %+v", batch)
	}
	wantTenants := []TenantStats{{Tenant: "a", Requests: 2, Refused: 1}, {Tenant: "b", Requests: 2, Completed: 1, Good: 1}}
	if len(batch.Tenants) != 2 || batch.Tenants[0] != wantTenants[0] || batch.Tenants[1] != wantTenants[1] {
		t.Errorf("batch tenants %+v, want %+v", batch.Tenants, wantTenants)
	}

	var plain Summary
	for i := range results {
		results[i].Class = ""
	}
	plain.SummarizeClasses(results, w, at(500), 10, DefaultSLO())
	if plain.Classes != nil || plain.SLO != nil {
		t.Errorf("classes without any: %+v", plain)
	}
}
