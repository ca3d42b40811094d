package legtrace_test

import (
	"context"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/internal/spantest"
	"github.com/duet-router/duet/extproc/legs"
	"github.com/duet-router/duet/extproc/legtrace"
	"github.com/duet-router/duet/scheduler"
)

// The span context of a leg's upstream span, as Envoy logs it.
const (
	legTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	legSpanID  = "00f067aa0ba902b7"
	sampled    = "00-" + legTraceID + "-" + legSpanID + "-01"
	unsampled  = "00-" + legTraceID + "-" + legSpanID + "-00"
)

// spanRecorder returns a tracer sampled as duet's is (only under a sampled
// parent) and the recorder of its ended spans.
func spanRecorder(t *testing.T) (trace.Tracer, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())), sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer("duet-test"), rec
}

// sinkFunc is an accesslog.Sink.
type sinkFunc func(context.Context, accesslog.Completion)

func (f sinkFunc) Complete(ctx context.Context, c accesslog.Completion) { f(ctx, c) }

// eventAttrs returns an event's attributes as their values' String.
func eventAttrs(e sdktrace.Event) map[string]string { return spantest.Attrs(e.Attributes) }

// TestLegSpans checks which entries get a span, its parent, attributes and
// status, and that the next sink sees every entry, with the span in its
// context when there is one.
func TestLegSpans(t *testing.T) {
	failedPrefill := accesslog.Completion{RequestID: "r1", Leg: accesslog.LegPrefill, Upstream: "10.0.0.1:30000", DPRank: 3,
		Status: 500, Failed: true, Duration: 12 * time.Millisecond, Pool: "ds", TraceParent: sampled}
	unreachable := accesslog.Completion{RequestID: "r2", Leg: accesslog.LegPrefill, Upstream: "10.0.0.1:30000", DPRank: accesslog.NoRank,
		Failed: true, Unreachable: true, ResponseFlags: "UF", TraceParent: sampled}
	decodeOK := accesslog.Completion{RequestID: "r3", Leg: accesslog.LegDecode, Upstream: "10.0.0.2:30000", DPRank: 1,
		Status: 200, PromptTokens: 9, CompletionTokens: 8, TraceParent: sampled}
	without := func(c accesslog.Completion, traceparent string) accesslog.Completion {
		c.TraceParent = traceparent
		return c
	}
	tests := []struct {
		name     string
		entry    accesslog.Completion
		wantSpan bool
		want     map[string]string
		absent   []string
		wantErr  string
	}{
		{
			name: "failed prefill leg: an error span", entry: failedPrefill, wantSpan: true,
			want: map[string]string{"duet.leg.name": "prefill", "duet.leg.endpoint": "10.0.0.1:30000", "duet.leg.rank": "3",
				"http.response.status_code": "500", "duet.leg.outcome": "failed", "duet.leg.duration_ms": "12",
				"duet.request_id": "r1", "duet.pool": "ds"},
			absent:  []string{"duet.leg.response_flags", "duet.leg.prompt_tokens"},
			wantErr: "prefill leg failed: status 500, engine 10.0.0.1:30000",
		},
		{
			name: "unreachable engine", entry: unreachable, wantSpan: true,
			want:    map[string]string{"duet.leg.outcome": "unreachable", "duet.leg.response_flags": "UF"},
			absent:  []string{"duet.leg.rank", "http.response.status_code"},
			wantErr: "prefill leg unreachable: no response, flags UF, engine 10.0.0.1:30000",
		},
		{
			name: "decode leg that succeeded", entry: decodeOK, wantSpan: true,
			want: map[string]string{"duet.leg.name": "decode", "duet.leg.outcome": "ok", "http.response.status_code": "200",
				"duet.leg.prompt_tokens": "9", "duet.leg.completion_tokens": "8"},
		},
		{name: "unsampled traceparent: no span", entry: without(failedPrefill, unsampled)},
		{name: "no traceparent: no span", entry: without(failedPrefill, "")},
		{name: "malformed traceparent: no span", entry: without(failedPrefill, "00-nothex-00f067aa0ba902b7-01")},
		{name: "all-zero trace id: no span", entry: without(failedPrefill, "00-00000000000000000000000000000000-00f067aa0ba902b7-01")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tracer, rec := spanRecorder(t)
			var seen []accesslog.Completion
			var recording bool
			s := legtrace.New(tracer, sinkFunc(func(ctx context.Context, c accesslog.Completion) {
				seen = append(seen, c)
				recording = trace.SpanFromContext(ctx).IsRecording()
			}))
			s.Complete(context.Background(), tt.entry)
			if len(seen) != 1 || seen[0] != tt.entry {
				t.Fatalf("next saw %v, want the entry once", seen)
			}
			if recording != tt.wantSpan {
				t.Errorf("next's context has a recording span: %v, want %v", recording, tt.wantSpan)
			}
			spans := rec.Ended()
			if !tt.wantSpan {
				if len(spans) != 0 {
					t.Fatalf("%d spans, want none", len(spans))
				}
				return
			}
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			sp := spans[0]
			if sp.Name() != legtrace.SpanLeg || sp.Parent().TraceID().String() != legTraceID || sp.Parent().SpanID().String() != legSpanID {
				t.Errorf("span %q with parent %v/%v, want %s under %s/%s", sp.Name(), sp.Parent().TraceID(), sp.Parent().SpanID(),
					legtrace.SpanLeg, legTraceID, legSpanID)
			}
			spantest.Check(t, sp, tt.want, tt.absent, tt.wantErr)
		})
	}
}

// Without a tracer the sink is the next one itself.
func TestNewWithoutTracer(t *testing.T) {
	next := sinkFunc(func(context.Context, accesslog.Completion) {})
	if s := legtrace.New(nil, next); s == nil {
		t.Fatal("nil sink")
	} else if _, wrapped := s.(sinkFunc); !wrapped {
		t.Errorf("New(nil, next) = %T, want next", s)
	}
}

// recordingAborter records the engines it was asked to abort on.
type recordingAborter struct {
	mu   sync.Mutex
	urls []string
}

func (a *recordingAborter) Abort(_ context.Context, url string, _ []string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.urls = append(a.urls, url)
	return nil
}

// A failed prefill leg's span shows the abort of the decode leg that the
// legs tracker starts, and the ejection its failure causes.
func TestLegSpanEvents(t *testing.T) {
	tracer, rec := spanRecorder(t)
	ab := &recordingAborter{}
	tracker := legs.New(legs.Options{Aborter: ab, AbortRetries: []time.Duration{}})
	prefill := &scheduler.Endpoint{Role: scheduler.RolePrefill, URL: "http://10.0.0.1:30000", Address: "10.0.0.1:30000", DPSize: 4}
	decode := &scheduler.Endpoint{Role: scheduler.RoleDecode, URL: "http://10.0.0.2:30000", Address: "10.0.0.2:30000", DPSize: 2}
	tracker.Track("r1", 0, scheduler.Decision{Prefill: &scheduler.Target{Endpoint: prefill, Rank: 3}, Decode: scheduler.Target{Endpoint: decode, Rank: 1}}, nil)
	ejection := scheduler.Ejection{Role: scheduler.RolePrefill, URL: prefill.URL, Address: prefill.Address, Rank: 3,
		Reason: scheduler.ReasonFailures, For: 5 * time.Second}
	// The scheduler's side of the feedback, as cmd/duet wires it.
	health := sinkFunc(func(ctx context.Context, c accesslog.Completion) {
		if c.Failed {
			legtrace.Ejected(ctx, ejection, false)
		}
	})
	s := legtrace.New(tracer, fanout{tracker, health})
	s.Complete(context.Background(), accesslog.Completion{RequestID: "r1", Leg: accesslog.LegPrefill, Upstream: prefill.Address,
		DPRank: 3, Status: 500, Failed: true, TraceParent: sampled})
	tracker.Wait()
	if len(ab.urls) != 1 || ab.urls[0] != decode.URL {
		t.Errorf("aborted on %v, want the decode engine", ab.urls)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	events := spans[0].Events()
	if len(events) != 2 {
		t.Fatalf("events %v, want an abort and an ejection", events)
	}
	want := []struct {
		name  string
		attrs map[string]string
	}{
		{legtrace.EventAbort, map[string]string{"duet.abort.role": "decode", "duet.abort.endpoint": decode.URL, "duet.abort.reason": legs.ReasonPrefillFailed}},
		{legtrace.EventEjection, map[string]string{"duet.ejection.role": "prefill", "duet.ejection.endpoint": prefill.URL, "duet.ejection.rank": "3",
			"duet.ejection.reason": scheduler.ReasonFailures, "duet.ejection.duration_ms": "5000", "duet.ejection.aborts_partners": "false"}},
	}
	for i, w := range want {
		if events[i].Name != w.name {
			t.Errorf("event %d is %q, want %q", i, events[i].Name, w.name)
		}
		got := eventAttrs(events[i])
		for k, v := range w.attrs {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", w.name, k, got[k], v)
			}
		}
	}
	// Outside a leg's span the events go nowhere.
	legtrace.Aborted(context.Background(), scheduler.RoleDecode, decode.URL, legs.ReasonPrefillFailed)
	legtrace.Ejected(context.Background(), ejection, true)
}

// fanout delivers each entry to every sink in order, as cmd/duet does.
type fanout []accesslog.Sink

func (f fanout) Complete(ctx context.Context, c accesslog.Completion) {
	for _, s := range f {
		s.Complete(ctx, c)
	}
}
