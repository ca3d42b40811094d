package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/zap"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/legtrace"
	"github.com/duet-router/duet/scheduler"
)

// Without an otlp section duet builds no tracer: nothing is traced. With
// one it has a tracer, and stopping does not wait for a collector that is
// not there past tracingFlush.
func TestStartTracing(t *testing.T) {
	tests := []struct {
		name       string
		otlp       *config.OTLP
		wantTracer bool
	}{
		{"no otlp section", nil, false},
		{"otlp section", &config.OTLP{Endpoint: "127.0.0.1:1", ServiceName: "duet"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tracer, stop, err := startTracing(context.Background(), tt.otlp, zap.NewNop())
			if err != nil || (tracer != nil) != tt.wantTracer || stop == nil {
				t.Fatalf("startTracing = %v, %v, %v; want a tracer: %v", tracer, stop != nil, err, tt.wantTracer)
			}
			start := time.Now()
			stop()
			if took := time.Since(start); took > tracingFlush+time.Second {
				t.Errorf("stop took %v", took)
			}
		})
	}
}

// A traced leg whose failure ejects its decode rank shows the ejection as
// an event of its span: the pools' feedback records it in the leg's
// context.
func TestLegSpanShowsEjection(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"dp_size":2,"disaggregation_mode":"null"}`)
	}))
	defer engine.Close()
	cfg := mustParse(t, fmt.Sprintf("decode: [{url: %q}]\nhealth: {failures_to_eject: 1}\n", engine.URL))
	pools, err := newPools(cfg, scheduler.Config{}, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := pools[0].sched.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	sink := legtrace.New(tp.Tracer("duet-test"), pools)
	sink.Complete(context.Background(), accesslog.Completion{RequestID: "r1", Pool: "default", Leg: accesslog.LegDecode,
		Upstream: strings.TrimPrefix(engine.URL, "http://"), DPRank: 1, Status: 500, Failed: true,
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Status().Code != codes.Error {
		t.Fatalf("spans %v, want the failed leg's error span", spans)
	}
	events := spans[0].Events()
	if len(events) != 1 || events[0].Name != legtrace.EventEjection {
		t.Fatalf("events %v, want the ejection", events)
	}
	got := map[string]string{}
	for _, kv := range events[0].Attributes {
		got[string(kv.Key)] = kv.Value.String()
	}
	want := map[string]string{"duet.ejection.role": "decode", "duet.ejection.endpoint": engine.URL, "duet.ejection.rank": "1",
		"duet.ejection.reason": scheduler.ReasonFailures, "duet.ejection.aborts_partners": "false"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}
