// Package legtrace puts the end of each leg of a traced request on the
// request's trace (docs/tracing.md, "duet's spans").
//
// With tracing on, Envoy logs the W3C traceparent request header on every
// access-log entry (accesslog.Completion.TraceParent); an upstream entry's
// is the span context of that leg's own upstream span. [New] wraps the
// sink that applies believed feedback (the legs tracker and the
// schedulers): each entry whose traceparent parses and is sampled gets a
// short [SpanLeg] span, a child of that span context, around the sink's
// handling of it, with the leg's engine, rank, status and duet's
// classification; a failed leg's span has status Error. What the entry
// causes while the span is open becomes its events: the abort of the
// surviving leg ([Aborted], from the legs tracker) and the ejection of the
// leg's engine or rank ([Ejected], from the scheduler's health accounting).
//
// A traceparent only ever becomes the parent of duet's span: nothing in it
// reaches routing, feedback or health. Entries without one, or with an
// unsampled one, cost a string comparison.
package legtrace

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/scheduler"
)

// SpanLeg is the name of duet's span of one leg's access-log entry.
const SpanLeg = "duet.leg"

// Names of the events on a SpanLeg span.
const (
	// EventAbort: duet aborts the request's surviving leg on its engine.
	EventAbort = "duet.abort"
	// EventEjection: the leg's failure ejected its engine or DP rank.
	EventEjection = "duet.ejection"
)

// Outcomes of a leg, the duet.leg.outcome attribute.
const (
	OutcomeOK          = "ok"
	OutcomeFailed      = "failed"
	OutcomeUnreachable = "unreachable"
)

// Attributes of a SpanLeg span and of its events.
const (
	attrName             = "duet.leg.name"
	attrEndpoint         = "duet.leg.endpoint"
	attrRank             = "duet.leg.rank"
	attrStatusCode       = "http.response.status_code"
	attrResponseFlags    = "duet.leg.response_flags"
	attrOutcome          = "duet.leg.outcome"
	attrDuration         = "duet.leg.duration_ms"
	attrPromptTokens     = "duet.leg.prompt_tokens"
	attrCompletion       = "duet.leg.completion_tokens"
	attrRequestID        = "duet.request_id"
	attrPool             = "duet.pool"
	attrAbortRole        = "duet.abort.role"
	attrAbortEndpoint    = "duet.abort.endpoint"
	attrAbortReason      = "duet.abort.reason"
	attrEjectionRole     = "duet.ejection.role"
	attrEjectionEndpoint = "duet.ejection.endpoint"
	attrEjectionRank     = "duet.ejection.rank"
	attrEjectionReason   = "duet.ejection.reason"
	attrEjectionFor      = "duet.ejection.duration_ms"
	attrEjectionAborts   = "duet.ejection.aborts_partners"
)

// sink records a SpanLeg span around next's handling of each traced entry.
type sink struct {
	tracer trace.Tracer
	next   accesslog.Sink
}

// New returns next, wrapped so that each entry with a sampled traceparent
// gets its SpanLeg span from tracer; next itself when tracer is nil.
func New(tracer trace.Tracer, next accesslog.Sink) accesslog.Sink {
	if tracer == nil {
		return next
	}
	return sink{tracer: tracer, next: next}
}

// Complete implements accesslog.Sink: next sees the entry, with the leg's
// span in ctx when there is one.
func (s sink) Complete(ctx context.Context, c accesslog.Completion) {
	parent, ok := parentOf(ctx, c.TraceParent)
	if !ok {
		s.next.Complete(ctx, c)
		return
	}
	ctx, span := s.tracer.Start(parent, SpanLeg, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attributes(c)...))
	s.next.Complete(ctx, c)
	if c.Failed {
		span.SetStatus(codes.Error, failure(c))
	}
	span.End()
}

// parentOf returns ctx with the remote span context traceparent names, and
// whether that context is valid and sampled.
func parentOf(ctx context.Context, traceparent string) (context.Context, bool) {
	if traceparent == "" {
		return ctx, false
	}
	ctx = propagation.TraceContext{}.Extract(ctx, carrier(traceparent))
	sc := trace.SpanContextFromContext(ctx)
	return ctx, sc.IsValid() && sc.IsSampled()
}

// carrier is a propagation.TextMapCarrier holding one traceparent header.
type carrier string

// Get implements propagation.TextMapCarrier.
func (c carrier) Get(key string) string {
	if key == contract.HeaderTraceParent {
		return string(c)
	}
	return ""
}

// Set implements propagation.TextMapCarrier; the carrier is read only.
func (carrier) Set(string, string) {}

// Keys implements propagation.TextMapCarrier.
func (carrier) Keys() []string { return []string{contract.HeaderTraceParent} }

// outcome classifies a leg as duet does for feedback and health:
// OutcomeUnreachable (no connection to the engine), OutcomeFailed or
// OutcomeOK.
func outcome(c accesslog.Completion) string {
	switch {
	case c.Unreachable:
		return OutcomeUnreachable
	case c.Failed:
		return OutcomeFailed
	}
	return OutcomeOK
}

// attributes are a leg's span's attributes.
func attributes(c accesslog.Completion) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 11)
	attrs = append(attrs,
		attribute.String(attrName, string(c.Leg)),
		attribute.String(attrOutcome, outcome(c)),
		attribute.Float64(attrDuration, float64(c.Duration)/float64(time.Millisecond)),
		attribute.String(attrRequestID, c.RequestID))
	if c.Status != 0 {
		attrs = append(attrs, attribute.Int(attrStatusCode, c.Status))
	}
	if c.Upstream != "" {
		attrs = append(attrs, attribute.String(attrEndpoint, c.Upstream))
	}
	if c.DPRank != accesslog.NoRank {
		attrs = append(attrs, attribute.Int(attrRank, c.DPRank))
	}
	if c.ResponseFlags != "" {
		attrs = append(attrs, attribute.String(attrResponseFlags, c.ResponseFlags))
	}
	if c.Pool != "" {
		attrs = append(attrs, attribute.String(attrPool, c.Pool))
	}
	if c.PromptTokens > 0 {
		attrs = append(attrs, attribute.Int64(attrPromptTokens, c.PromptTokens))
	}
	if c.CompletionTokens > 0 {
		attrs = append(attrs, attribute.Int64(attrCompletion, c.CompletionTokens))
	}
	return attrs
}

// failure describes a failed leg for its span's status.
func failure(c accesslog.Completion) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s leg %s", c.Leg, outcome(c))
	if c.Status != 0 {
		fmt.Fprintf(&b, ": status %d", c.Status)
	} else {
		b.WriteString(": no response")
	}
	if c.ResponseFlags != "" {
		fmt.Fprintf(&b, ", flags %s", c.ResponseFlags)
	}
	if c.Upstream != "" {
		fmt.Fprintf(&b, ", engine %s", c.Upstream)
	}
	return b.String()
}

// Aborted records, on the leg span in ctx if one is recording, that duet
// aborts the request's role leg on the engine at engineURL for reason (a
// legs.Reason...). The abort itself runs after the span ends; its outcome
// is in duet_leg_aborts_total and the log.
func Aborted(ctx context.Context, role scheduler.Role, engineURL, reason string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent(EventAbort, trace.WithAttributes(
		attribute.String(attrAbortRole, string(role)),
		attribute.String(attrAbortEndpoint, engineURL),
		attribute.String(attrAbortReason, reason)))
}

// Ejected records, on the leg span in ctx if one is recording, that the
// leg ejected e's engine or rank; abortsPartners says whether duet aborts
// the partner legs of the requests the engine still holds.
func Ejected(ctx context.Context, e scheduler.Ejection, abortsPartners bool) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String(attrEjectionRole, string(e.Role)),
		attribute.String(attrEjectionEndpoint, e.URL),
		attribute.String(attrEjectionReason, e.Reason),
		attribute.Float64(attrEjectionFor, float64(e.For)/float64(time.Millisecond)),
		attribute.Bool(attrEjectionAborts, abortsPartners),
	}
	if e.Rank != scheduler.NoRank {
		attrs = append(attrs, attribute.Int(attrEjectionRank, e.Rank))
	}
	span.AddEvent(EventEjection, trace.WithAttributes(attrs...))
}
