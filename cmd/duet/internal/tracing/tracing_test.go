package tracing

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/duet-router/duet/cmd/duet/internal/config"
)

// keptExporter is an in-memory exporter whose spans outlive Shutdown
// (tracetest's clears them).
type keptExporter struct{ *tracetest.InMemoryExporter }

// Shutdown implements sdktrace.SpanExporter, keeping the spans.
func (keptExporter) Shutdown(context.Context) error { return nil }

// remoteParent returns ctx under Envoy's span, sampled or not.
func remoteParent(t *testing.T, sampled bool) context.Context {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	if err != nil {
		t.Fatal(err)
	}
	cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid, Remote: true}
	if sampled {
		cfg.TraceFlags = trace.FlagsSampled
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(cfg))
}

// The provider records a span exactly when its parent is sampled, and
// exports it at Shutdown under duet's service name and version.
func TestProviderFollowsTheParent(t *testing.T) {
	tests := []struct {
		name string
		ctx  func(t *testing.T) context.Context
		want int
	}{
		{"sampled parent", func(t *testing.T) context.Context { return remoteParent(t, true) }, 1},
		{"unsampled parent", func(t *testing.T) context.Context { return remoteParent(t, false) }, 0},
		{"no parent: duet starts no trace", func(*testing.T) context.Context { return context.Background() }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp := keptExporter{tracetest.NewInMemoryExporter()}
			p, err := NewWithExporter(exp, "duet-a", "v1.2.3")
			if err != nil {
				t.Fatal(err)
			}
			_, span := p.Tracer().Start(tt.ctx(t), "duet.route")
			span.End()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := p.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			spans := exp.GetSpans()
			if len(spans) != tt.want {
				t.Fatalf("%d spans exported, want %d", len(spans), tt.want)
			}
			if tt.want == 0 {
				return
			}
			res := map[string]string{}
			for _, kv := range spans[0].Resource.Attributes() {
				res[string(kv.Key)] = kv.Value.String()
			}
			if res["service.name"] != "duet-a" || res["service.version"] != "v1.2.3" {
				t.Errorf("resource %v", res)
			}
			if spans[0].InstrumentationScope.Name != InstrumentationName {
				t.Errorf("scope %q", spans[0].InstrumentationScope.Name)
			}
		})
	}
}

// New needs an endpoint; with one it does not dial, and Shutdown gives up
// on a collector that is not there once its context ends.
func TestNew(t *testing.T) {
	if _, err := New(context.Background(), nil, "dev"); err == nil {
		t.Error("New without an otlp section: no error")
	}
	if _, err := New(context.Background(), &config.OTLP{}, "dev"); err == nil {
		t.Error("New without an endpoint: no error")
	}
	// Nothing listens on port 1 of loopback.
	p, err := New(context.Background(), &config.OTLP{Endpoint: "127.0.0.1:1", ServiceName: "duet"}, "dev")
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer().Start(remoteParent(t, true), "duet.route")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = p.Shutdown(ctx) // the span cannot leave: an error, or nil if dropped
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Shutdown took %v with a 300ms context", took)
	}
}
