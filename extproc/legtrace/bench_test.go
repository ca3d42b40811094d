package legtrace_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/legtrace"
)

// discardExporter drops every span.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkLegSpan is the cost of one access-log entry through the sink:
// without a traceparent, under an unsampled one, and under a sampled one
// (a batched SDK provider whose exporter drops the spans).
func BenchmarkLegSpan(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())),
		sdktrace.WithBatcher(discardExporter{}))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	entry := accesslog.Completion{RequestID: "r1", Leg: accesslog.LegPrefill, Upstream: "10.0.0.1:30000", DPRank: 3,
		Status: 500, Failed: true, Pool: "ds"}
	for _, tt := range []struct{ name, traceparent string }{
		{"none", ""}, {"unsampled", unsampled}, {"sampled", sampled},
	} {
		b.Run(tt.name, func(b *testing.B) {
			s := legtrace.New(tp.Tracer("duet-bench"), sinkFunc(func(context.Context, accesslog.Completion) {}))
			c := entry
			c.TraceParent = tt.traceparent
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				s.Complete(ctx, c)
			}
		})
	}
}
