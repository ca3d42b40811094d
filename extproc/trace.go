package extproc

import (
	"context"
	"net/http"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/duet-router/duet/scheduler"
)

// SpanDecision is the name of duet's span of one routing decision
// (docs/tracing.md, "duet's spans").
const SpanDecision = "duet.route"

// OutcomeRouted is the duet.outcome of a request duet routed; a request
// duet answers itself has its answer's details instead (model_not_found,
// no_target, admission_queue_full, ...).
const OutcomeRouted = "routed"

// Attributes of the decision span. A role's attributes are in roleKeys.
const (
	attrRoute           = "duet.route"
	attrPool            = "duet.pool"
	attrModel           = "gen_ai.request.model"
	attrRequestID       = "duet.request_id"
	attrClientRequestID = "duet.client_request_id"
	attrOutcome         = "duet.outcome"
	attrStatusCode      = "http.response.status_code"
	attrMessage         = "duet.message"
	attrPromptTokens    = "duet.prompt_tokens"
	attrAdmissionClass  = "duet.admission.class"
	attrAdmissionTenant = "duet.admission.tenant"
	attrAdmissionQueued = "duet.admission.queued"
	attrAdmissionWait   = "duet.admission.wait_ms"
)

// roleKeys are the attribute keys of one role's choice.
type roleKeys struct {
	endpoint, target, rank, policy, candidates    attribute.Key
	cached, load, reserved, prefix, cost, costSep attribute.Key
}

// The attribute keys of each role's choice.
var (
	prefillKeys = roleKeys{
		endpoint: "duet.prefill.endpoint", target: "duet.prefill.target", rank: "duet.prefill.rank",
		policy: "duet.prefill.policy", candidates: "duet.prefill.candidates",
		cached: "duet.prefill.cached_tokens", load: "duet.prefill.load_tokens", reserved: "duet.prefill.reserved_tokens",
		prefix: "duet.prefill.prefix", cost: "duet.prefill.cost.total", costSep: "duet.prefill.cost.",
	}
	decodeKeys = roleKeys{
		endpoint: "duet.decode.endpoint", target: "duet.decode.target", rank: "duet.decode.rank",
		policy: "duet.decode.policy", candidates: "duet.decode.candidates",
		cached: "duet.decode.cached_tokens", load: "duet.decode.load_tokens", reserved: "duet.decode.reserved_tokens",
		prefix: "duet.decode.prefix", cost: "duet.decode.cost.total", costSep: "duet.decode.cost.",
	}
)

// maxAttrBytes bounds the attributes that carry what a client sent (its
// model, request id, tenant) or a message quoting it.
const maxAttrBytes = 256

// incomingCarrier is a propagation.TextMapCarrier over the incoming gRPC
// metadata (metadata.MD) of an ext_proc stream, where Envoy's gRPC client
// puts traceparent and tracestate when it traces the call. Get reads the
// one key it is asked for (metadata.ValueFromIncomingContext) instead of
// copying the whole metadata (metadata.FromIncomingContext); extraction
// needs neither Set nor Keys.
type incomingCarrier struct{ ctx context.Context }

// Get implements propagation.TextMapCarrier.
func (c incomingCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set implements propagation.TextMapCarrier; the incoming metadata is read
// only.
func (incomingCarrier) Set(string, string) {}

// Keys implements propagation.TextMapCarrier.
func (c incomingCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	return keys
}

// decisionTrace is what a traced request's decision span will say, filled
// as the decision goes; a nil *decisionTrace (tracing off, or the parent
// not sampled) records nothing.
type decisionTrace struct {
	span trace.Span
	// attrs is the buffer end builds the span's attributes in, kept with
	// the decisionTrace for the next traced request (Server.traces).
	attrs []attribute.KeyValue
	// model is the body's model; message the error duet answered with.
	model, message string
	// explain is the scheduler's account of the pick (Request.Explain).
	explain scheduler.DecisionStatus
	// decision is the pick's result; its Decode.Endpoint is nil until the
	// pick succeeded.
	decision     scheduler.Decision
	promptTokens int64
	// admission, when admitted is set: the request's class, tenant and
	// time in the queue.
	admitted        bool
	class, tenant   string
	queued          bool
	admissionWaited time.Duration
}

// startTrace starts req's decision span when a tracer is configured and
// the ext_proc stream carries a sampled parent: duet never starts a trace
// of its own, it joins Envoy's. It returns the context of the span (ctx
// when there is none).
func (s *Server) startTrace(ctx context.Context, req *request) context.Context {
	if s.opts.Tracer == nil {
		return ctx
	}
	ctx = propagation.TraceContext{}.Extract(ctx, incomingCarrier{ctx})
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return ctx
	}
	ctx, span := s.opts.Tracer.Start(ctx, SpanDecision, trace.WithSpanKind(trace.SpanKindServer))
	t, _ := s.traces.Get().(*decisionTrace)
	if t == nil {
		t = &decisionTrace{attrs: make([]attribute.KeyValue, 0, 48)}
	}
	*t = decisionTrace{span: span, attrs: t.attrs[:0]}
	req.trace = t
	return ctx
}

// setModel records the body's model.
func (t *decisionTrace) setModel(model string) {
	if t != nil {
		t.model = clip(model)
	}
}

// setMessage records the error duet answers with.
func (t *decisionTrace) setMessage(message string) {
	if t != nil {
		t.message = message
	}
}

// setAdmission records what admission made of the request.
func (t *decisionTrace) setAdmission(class, tenant string, queued bool, waited time.Duration) {
	if t != nil {
		t.admitted, t.class, t.tenant, t.queued, t.admissionWaited = true, class, clip(tenant), queued, waited
	}
}

// setDecision records the pick's targets.
func (t *decisionTrace) setDecision(d scheduler.Decision, promptTokens int64) {
	if t != nil {
		t.decision, t.promptTokens = d, promptTokens
	}
}

// endTrace ends req's decision span (nothing when it has none) with what
// the decision came to, answered by resp: routed, or the outcome and status
// of the answer duet gave itself. A 5xx answer sets the span's status to
// Error. Process calls it once per request, whatever the path.
func (s *Server) endTrace(req *request, resp *extprocv3.ProcessingResponse) {
	t := req.trace
	if t == nil {
		return
	}
	req.trace = nil
	t.end(req, resp)
	// The span copied the attributes: the buffer is free again.
	clear(t.attrs)
	s.traces.Put(t)
}

// end sets t's attributes and status, and ends its span.
func (t *decisionTrace) end(req *request, resp *extprocv3.ProcessingResponse) {
	attrs := append(t.attrs[:0], attribute.String(attrRoute, req.route.String()))
	attrs = appendString(attrs, attrPool, req.pool)
	attrs = appendString(attrs, attrModel, t.model)
	attrs = appendString(attrs, attrRequestID, req.duetID)
	attrs = appendString(attrs, attrClientRequestID, clip(req.requestID))
	code := 0
	outcome := OutcomeRouted
	if im := resp.GetImmediateResponse(); im != nil {
		code = int(im.GetStatus().GetCode())
		outcome = strings.TrimPrefix(im.GetDetails(), "duet_")
		attrs = append(attrs, attribute.Int(attrStatusCode, code))
	}
	attrs = append(attrs, attribute.String(attrOutcome, outcome))
	attrs = appendString(attrs, attrMessage, clip(t.message))
	if t.admitted {
		attrs = append(attrs, attribute.String(attrAdmissionClass, t.class), attribute.Bool(attrAdmissionQueued, t.queued),
			attribute.Float64(attrAdmissionWait, float64(t.admissionWaited)/float64(time.Millisecond)))
		attrs = appendString(attrs, attrAdmissionTenant, t.tenant)
	}
	if t.promptTokens > 0 {
		attrs = append(attrs, attribute.Int64(attrPromptTokens, t.promptTokens))
	}
	if t.decision.Decode.Endpoint != nil {
		if t.decision.Prefill != nil {
			attrs = appendChoice(attrs, prefillKeys, *t.decision.Prefill, t.explain.Prefill)
		}
		attrs = appendChoice(attrs, decodeKeys, t.decision.Decode, t.explain.Decode)
	}
	t.attrs = attrs
	t.span.SetAttributes(attrs...)
	if code >= http.StatusInternalServerError {
		msg := t.message
		if msg == "" {
			msg = outcome
		}
		t.span.SetStatus(codes.Error, clip(msg))
	}
	t.span.End()
}

// appendChoice adds one role's choice: the target the pick chose and, when
// the scheduler explained it, the policy's numbers.
func appendChoice(attrs []attribute.KeyValue, k roleKeys, t scheduler.Target, c *scheduler.ChoiceStatus) []attribute.KeyValue {
	if t.Endpoint != nil {
		attrs = append(attrs, k.endpoint.String(t.Endpoint.Address), k.target.String(t.String()))
	}
	if t.Rank != scheduler.NoRank {
		attrs = append(attrs, k.rank.Int(t.Rank))
	}
	if c == nil {
		return attrs
	}
	attrs = append(attrs, k.policy.String(c.Policy), k.candidates.Int(c.Candidates),
		k.cached.Int64(c.CachedTokens), k.load.Int64(c.LoadTokens), k.reserved.Int64(c.Tokens), k.prefix.Float64(c.Prefix))
	if len(c.Cost) > 0 {
		var sum float64
		for _, term := range c.Cost {
			sum += term.Value
			attrs = append(attrs, attribute.Float64(string(k.costSep)+term.Name, term.Value))
		}
		attrs = append(attrs, k.cost.Float64(sum))
	}
	return attrs
}

// appendString adds a string attribute unless v is empty.
func appendString(attrs []attribute.KeyValue, k, v string) []attribute.KeyValue {
	if v == "" {
		return attrs
	}
	return append(attrs, attribute.String(k, v))
}

// clip cuts what a client sent to maxAttrBytes, as valid UTF-8 (OTLP
// carries strings as protobuf strings, which must be).
func clip(s string) string {
	if len(s) > maxAttrBytes {
		s = s[:maxAttrBytes]
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
