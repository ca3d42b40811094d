// Package tracing builds duet's OpenTelemetry tracer from the
// configuration's otlp section (docs/tracing.md).
//
// duet never starts a trace: Envoy decides which requests are traced
// (otlp.sampling_percent) and duet's spans join Envoy's traces, so the
// sampler records a span exactly when its parent, Envoy's span, was
// sampled ([Sampler]). Spans leave in batches over OTLP/gRPC, in plaintext,
// to otlp.endpoint; a collector that is down or slow costs dropped spans,
// never a blocked request. Without an otlp section duet builds no provider
// at all and passes no tracer on.
//
// Nothing here is global: the provider's tracer is passed to the packages
// that record spans (extproc, legtrace), and otel's global provider stays
// the no-op one.
package tracing

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/duet-router/duet/cmd/duet/internal/config"
)

// InstrumentationName names the tracer of duet's spans (the
// instrumentation scope).
const InstrumentationName = "github.com/duet-router/duet"

// Sampler is duet's sampler: it follows the parent's decision, and a span
// without a parent (which duet never starts) is not recorded.
func Sampler() sdktrace.Sampler {
	return sdktrace.ParentBased(sdktrace.NeverSample())
}

// Provider is duet's tracer provider. Shutdown flushes the spans not yet
// exported.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// New returns the provider that cfg describes: spans exported over
// OTLP/gRPC in plaintext to cfg.Endpoint, under service.name
// cfg.ServiceName and service.version version. It does not connect: the
// exporter dials the collector when the first batch leaves, and again
// whenever it must.
func New(ctx context.Context, cfg *config.OTLP, version string) (*Provider, error) {
	if cfg == nil || cfg.Endpoint == "" {
		return nil, errors.New("tracing: otlp.endpoint is required")
	}
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(cfg.Endpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter to %s: %w", cfg.Endpoint, err)
	}
	return NewWithExporter(exp, cfg.ServiceName, version)
}

// NewWithExporter returns a provider that batches spans to exp, under
// service.name serviceName and service.version version (left out when
// empty): New's, with any exporter (tests, benchmarks).
func NewWithExporter(exp sdktrace.SpanExporter, serviceName, version string) (*Provider, error) {
	res, err := serviceResource(serviceName, version)
	if err != nil {
		return nil, err
	}
	return &Provider{tp: sdktrace.NewTracerProvider(
		sdktrace.WithSampler(Sampler()),
		sdktrace.WithResource(res),
		sdktrace.WithBatcher(exp),
	)}, nil
}

// serviceResource describes duet's process: the SDK's defaults (the
// environment's OTEL_RESOURCE_ATTRIBUTES included) under duet's service
// name and version.
func serviceResource(serviceName, version string) (*resource.Resource, error) {
	if serviceName == "" {
		serviceName = config.DefaultServiceName
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(serviceName)}
	if version != "" {
		attrs = append(attrs, semconv.ServiceVersion(version))
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL, attrs...))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return res, nil
}

// Tracer returns the tracer duet records its spans with.
func (p *Provider) Tracer() trace.Tracer {
	return p.tp.Tracer(InstrumentationName)
}

// Shutdown exports the spans still queued and stops the exporter, giving
// up when ctx ends (a collector that is down must not hold up duet's
// exit).
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flush and shut down: %w", err)
	}
	return nil
}
