package extproc

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/extproc/internal/spantest"
	"github.com/duet-router/duet/scheduler"
)

// Envoy's span of the ext_proc call, as its gRPC client propagates it.
const (
	parentTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpanID  = "00f067aa0ba902b7"
	sampledParent = "00-" + parentTraceID + "-" + parentSpanID + "-01"
	// unsampledParent is Envoy's span of a request it did not sample.
	unsampledParent = "00-" + parentTraceID + "-" + parentSpanID + "-00"
)

// spanRecorder returns a tracer sampled as duet's is (only under a sampled
// parent) and the recorder of its ended spans.
func spanRecorder(t testing.TB) (trace.Tracer, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())), sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer("duet-test"), rec
}

// withTraceParent is a context whose streams carry traceparent in their
// gRPC metadata, as Envoy's gRPC client sends it; "" carries none.
func withTraceParent(traceparent string) context.Context {
	if traceparent == "" {
		return context.Background()
	}
	return metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent)
}

// explained is what a least_cost scheduler says of pdPick.
var explained = scheduler.DecisionStatus{
	Prefill: &scheduler.ChoiceStatus{Policy: "least_cost", Candidates: 4, LoadTokens: 300, Prefix: 0.5, CachedTokens: 64, Tokens: 128,
		Cost: []scheduler.CostTerm{{Name: "queued", Value: 300}, {Name: "own_work", Value: 192}, {Name: "eviction", Value: 1.5}}},
	Decode: &scheduler.ChoiceStatus{Policy: "least_cost", Candidates: 2, LoadTokens: 1000, Tokens: 144,
		Cost: []scheduler.CostTerm{{Name: "pace", Value: 1144}, {Name: "balance", Value: 1144}, {Name: "overflow", Value: 0}, {Name: "decode_cache", Value: 0}}},
}

// TestDecisionSpans checks duet's span of each decision: one span per
// request under Envoy's sampled span of the ext_proc call, with the
// decision's attributes and its outcome, and none without a sampled parent.
func TestDecisionSpans(t *testing.T) {
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	pools := func(picker Picker) Options {
		return Options{Pools: []Pool{{Name: "llama", Models: []string{"m"}, Picker: picker, PrefillCluster: "duet_prefill"}}}
	}
	single := func(picker Picker) Options { return Options{Picker: picker, PrefillCluster: "duet_prefill"} }
	tests := []struct {
		name        string
		opts        Options
		parent      string
		method      string
		path        string
		body        []byte
		held        bool // the request may be queued (exchangeHeld)
		wantSpan    bool
		want        map[string]string // attributes the span must have
		absent      []string          // attributes it must not have
		wantErr     string            // the span's Error description; "" for Unset
		check       func(t *testing.T, attrs map[string]string, resp *extprocv3.ProcessingResponse)
		wantRouted  bool
		wantOutcome string
	}{
		{
			name: "routed PD request", parent: sampledParent, wantSpan: true, wantRouted: true,
			opts:   single(&fakePicker{decision: pdPick, explain: explained}),
			method: "POST", path: "/v1/chat/completions", body: chat,
			want: map[string]string{
				"duet.route": "chat", "duet.pool": DefaultPool, "gen_ai.request.model": "m", "duet.client_request_id": "client-1",
				"duet.outcome": "routed", "duet.prefill.endpoint": "10.0.0.1:30000", "duet.prefill.rank": "3",
				"duet.prefill.target": "10.0.0.1:30000/dp3", "duet.prefill.policy": "least_cost", "duet.prefill.candidates": "4",
				"duet.prefill.cached_tokens": "64", "duet.prefill.load_tokens": "300", "duet.prefill.reserved_tokens": "128",
				"duet.prefill.prefix": "0.5", "duet.prefill.cost.queued": "300", "duet.prefill.cost.own_work": "192",
				"duet.prefill.cost.eviction": "1.5", "duet.prefill.cost.total": "493.5",
				"duet.decode.endpoint": "10.0.0.2:30000", "duet.decode.rank": "1", "duet.decode.policy": "least_cost",
				"duet.decode.candidates": "2", "duet.decode.load_tokens": "1000", "duet.decode.reserved_tokens": "144",
				"duet.decode.cost.pace": "1144", "duet.decode.cost.balance": "1144", "duet.decode.cost.total": "2288",
			},
			absent: []string{"http.response.status_code", "duet.message", "duet.admission.class"},
			check: func(t *testing.T, attrs map[string]string, resp *extprocv3.ProcessingResponse) {
				if id := setHeaders(common(resp))[contract.HeaderDuetRequestID]; attrs["duet.request_id"] != id || id == "" {
					t.Errorf("duet.request_id = %q, want the minted %q", attrs["duet.request_id"], id)
				}
			},
		},
		{
			name: "model not found: 404", parent: sampledParent, wantSpan: true,
			opts:   pools(&fakePicker{decision: pdPick}),
			method: "POST", path: "/v1/chat/completions", body: []byte(`{"model":"nope","messages":[]}`),
			want: map[string]string{"duet.route": "chat", "gen_ai.request.model": "nope", "duet.outcome": "model_not_found",
				"http.response.status_code": "404", "duet.client_request_id": "client-1"},
			absent: []string{"duet.pool", "duet.request_id", "duet.decode.endpoint"},
			check: func(t *testing.T, attrs map[string]string, _ *extprocv3.ProcessingResponse) {
				if !strings.Contains(attrs["duet.message"], "nope") {
					t.Errorf("duet.message = %q, want the model named", attrs["duet.message"])
				}
			},
		},
		{
			name: "no target: 503 is an error", parent: sampledParent, wantSpan: true,
			opts:   single(&fakePicker{err: fmt.Errorf("decode: %w", scheduler.ErrNoEndpoints)}),
			method: "POST", path: "/generate", body: []byte(`{"text":"x"}`),
			want:    map[string]string{"duet.route": "generate", "duet.pool": DefaultPool, "duet.outcome": "no_target", "http.response.status_code": "503"},
			absent:  []string{"duet.decode.endpoint", "gen_ai.request.model"},
			wantErr: "no inference endpoint of pool default is available: decode: no ready endpoint",
		},
		{
			name: "body too large: answered before any decision", parent: sampledParent, wantSpan: true,
			opts:   Options{Picker: &fakePicker{decision: pdPick}, PrefillCluster: "duet_prefill", MaxBodyBytes: 16},
			method: "POST", path: "/generate", body: []byte(`{"text":"a body longer than sixteen bytes"}`),
			want: map[string]string{"duet.route": "generate", "duet.outcome": "body_too_large", "http.response.status_code": "413"},
		},
		{
			name: "request without a body", parent: sampledParent, wantSpan: true, wantRouted: true,
			opts:   single(&fakePicker{decision: pdPick}),
			method: "GET", path: "/v1/models",
			want:   map[string]string{"duet.route": "other", "duet.outcome": "routed", "duet.decode.endpoint": "10.0.0.2:30000", "duet.decode.rank": "1"},
			absent: []string{"duet.prefill.endpoint", "duet.decode.policy"},
		},
		{
			name: "admission refuses after the wait limit: 429", parent: sampledParent, wantSpan: true, held: true,
			opts: admissionOptions(t, new(atomic.Bool), false),
			body: chat,
			want: map[string]string{"duet.pool": "p", "duet.outcome": "admission_wait_limit", "http.response.status_code": "429",
				"duet.admission.class": "batch", "duet.admission.queued": "true"},
			check: func(t *testing.T, attrs map[string]string, _ *extprocv3.ProcessingResponse) {
				if w, err := strconv.ParseFloat(attrs["duet.admission.wait_ms"], 64); err != nil || w < 50 {
					t.Errorf("duet.admission.wait_ms = %q, want about the 100ms wait limit", attrs["duet.admission.wait_ms"])
				}
			},
		},
		{
			name: "unsampled parent: no span", parent: unsampledParent, wantRouted: true,
			opts:   single(&fakePicker{decision: pdPick}),
			method: "POST", path: "/v1/chat/completions", body: chat,
		},
		{
			name: "no parent: no span", wantRouted: true,
			opts:   single(&fakePicker{decision: pdPick}),
			method: "POST", path: "/v1/chat/completions", body: chat,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tracer, rec := spanRecorder(t)
			tt.opts.Tracer = tracer
			tt.opts.Metrics = NewMetrics(prometheus.NewRegistry())
			c := clientFor(t, tt.opts)
			ctx := withTraceParent(tt.parent)
			hdrs := map[string]string{"x-request-id": "client-1"}
			var resp *extprocv3.ProcessingResponse
			if tt.held {
				resp, _ = exchangeHeldContext(t, ctx, c, hdrs, tt.body)
			} else {
				resp = exchangeContext(t, ctx, c, tt.method, tt.path, hdrs, tt.body)
			}
			if routed := resp.GetImmediateResponse() == nil; routed != tt.wantRouted {
				t.Fatalf("routed = %v, want %v: %v", routed, tt.wantRouted, resp)
			}
			spans := rec.Ended()
			if !tt.wantSpan {
				if len(spans) != 0 {
					t.Fatalf("%d spans, want none: %v", len(spans), spans)
				}
				return
			}
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			s := spans[0]
			if s.Name() != SpanDecision || s.SpanKind() != trace.SpanKindServer {
				t.Errorf("span %q of kind %v", s.Name(), s.SpanKind())
			}
			if p := s.Parent(); p.TraceID().String() != parentTraceID || p.SpanID().String() != parentSpanID || !p.IsRemote() {
				t.Errorf("parent = %v/%v remote %v, want Envoy's %s/%s", p.TraceID(), p.SpanID(), p.IsRemote(), parentTraceID, parentSpanID)
			}
			if s.SpanContext().TraceID().String() != parentTraceID || !s.SpanContext().IsSampled() {
				t.Errorf("span context %v, want sampled in trace %s", s.SpanContext(), parentTraceID)
			}
			attrs := spantest.Check(t, s, tt.want, tt.absent, tt.wantErr)
			if tt.check != nil {
				tt.check(t, attrs, resp)
			}
		})
	}
}

// TestClip checks that what a client sent is cut to maxAttrBytes and made
// valid UTF-8 before it becomes an attribute.
func TestClip(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"short", "llama-3", "llama-3"},
		{"long", strings.Repeat("m", 300), strings.Repeat("m", maxAttrBytes)},
		{"invalid UTF-8", "mo\xffdel", "mo\uFFFDdel"},
		{"cut inside a rune", strings.Repeat("m", maxAttrBytes-1) + "é", strings.Repeat("m", maxAttrBytes-1) + "\uFFFD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := clip(tt.in); got != tt.want {
				t.Errorf("clip = %q, want %q", got, tt.want)
			}
		})
	}
}
