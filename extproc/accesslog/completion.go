package accesslog

import (
	"context"
	"time"
)

// Leg says which part of a request an entry describes.
type Leg string

// The legs of a request.
const (
	// LegDecode is the upstream request to the decode engine (the main one).
	LegDecode Leg = "decode"
	// LegPrefill is the upstream request to the prefill engine (the mirror).
	LegPrefill Leg = "prefill"
	// LegRequest is the whole client request, as the client saw it.
	LegRequest Leg = "request"
)

// NoRank is Completion.DPRank when the leg carried no (valid) rank header.
const NoRank = -1

// Completion is one finished leg of a request, as Envoy logged it.
type Completion struct {
	// RequestID is the id duet minted for the request (x-duet-request-id),
	// the same on both legs and on the client request; "" when duet did not
	// route the request (it answered it itself, or Envoy did).
	RequestID string `json:"request_id"`
	// ClientRequestID is the client's x-request-id (or Envoy's request id),
	// for logs only: clients choose it, so nothing is keyed by it.
	ClientRequestID string `json:"client_request_id,omitempty"`
	// Leg is the part of the request this entry describes.
	Leg Leg `json:"leg"`
	// Cluster is Envoy's upstream cluster (the routed cluster for LegRequest).
	Cluster string `json:"cluster"`
	// Upstream is the upstream host "ip:port", or "" if none was reached.
	Upstream string `json:"upstream"`
	// Status is the HTTP status, 0 if there was no response.
	Status int `json:"status"`
	// Failed reports whether the leg failed: no response (Status 0), a 5xx,
	// or a response flag that means an upstream failure, timeout or reset
	// (UF, UO, UT, URX, UC, UR, UH, NR, DC, ...: the list is in flags.go).
	Failed bool `json:"failed"`
	// Unreachable reports that the leg got no response because no
	// connection to the engine could be made (UF, UH): the engine process
	// is down or unreachable, not merely failing. It implies Failed.
	Unreachable bool `json:"unreachable,omitempty"`
	// DPRank is the X-Data-Parallel-Rank header the leg carried (the
	// prefill leg carries its own, the mirror policy's copy), or NoRank.
	DPRank int `json:"dp_rank"`
	// ResponseFlags is Envoy's short response-flag string, e.g. "UF,URX".
	ResponseFlags string `json:"response_flags,omitempty"`
	// PromptTokens and CompletionTokens are the engine's token usage when
	// the entry carries it in duet's dynamic metadata, else 0.
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	// Duration is how long the leg took.
	Duration time.Duration `json:"duration_ns"`
	// DecodeTarget and PrefillTarget are the targets duet chose (e.g.
	// "127.0.0.1:30001/dp1"), when the entry carries duet's metadata.
	DecodeTarget  string `json:"decode_target,omitempty"`
	PrefillTarget string `json:"prefill_target,omitempty"`
	// Pool is the pool duet routed the request to, set once duet believes
	// the entry (package routed); "" before.
	Pool string `json:"pool,omitempty"`
	// TraceParent is the W3C traceparent request header the entry logged,
	// "" when none: with tracing on, Envoy logs it on every entry, an
	// upstream entry's being its leg's own span context. It only ever
	// becomes the parent of duet's span of the leg (package legtrace);
	// nothing routes by it.
	TraceParent string `json:"traceparent,omitempty"`
}

// Sink receives completions. Complete is called on the ALS stream's
// goroutine, once per entry, in the order Envoy sent them; it must not block
// for long, since Envoy's entries queue behind it.
type Sink interface {
	Complete(ctx context.Context, c Completion)
}
