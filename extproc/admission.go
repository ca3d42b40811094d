package extproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"

	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// Admitter holds a request until its pool has room (package
// scheduler/admit implements it).
type Admitter interface {
	// Admit returns once the request may be picked, or with an error: an
	// *admit.Refusal, or the context's when the client went away.
	// onQueued is called with the longest the request may wait, as soon as
	// it is queued.
	Admit(ctx context.Context, r admit.Request, onQueued func(limit time.Duration)) (*admit.Ticket, error)
	// Config returns the queue's configuration (its classes and their
	// wait limits).
	Config() admit.Config
}

// Admission is a pool's admission control: while its engines are
// saturated, inference requests wait in duet, by class and fairly between
// tenants, and are refused early when they cannot start in time.
type Admission struct {
	// Admitter queues the pool's requests; required.
	Admitter Admitter
	// Classifier gives each request its class and tenant; required. Its
	// class indexes are the Admitter's.
	Classifier *admit.Classifier
	// Cost is the tokens a request will occupy on the engines (the
	// scheduler's Cost); required.
	Cost func(*scheduler.Request) int64
	// EnginePriority, when set, returns the value of SGLang's `priority`
	// body field for a class, and whether to write it now (the pool's
	// engines run priority scheduling). The client's own field is removed
	// either way.
	EnginePriority func(class int) (int, bool)
}

// HoldMargin is added to a queued request's wait limit in the message
// timeout duet asks Envoy for: duet answers by the limit, and Envoy must
// not give up first. Envoy's max_message_timeout must allow the longest
// limit plus this.
const HoldMargin = time.Second

// admitted is what admission decided for a request let through.
type admitted struct {
	ticket *admit.Ticket
	// priority is SGLang's priority field to write, when write is set.
	priority int
	write    bool
}

// admit classifies req and waits for its pool's admission. hold tells
// Envoy to wait up to the given time for duet's answer. It returns the
// response that ends the request when it is not let through.
func (s *Server) admit(ctx context.Context, req *request, pool *Pool, sreq *scheduler.Request, hold func(time.Duration)) (admitted, *extprocv3.ProcessingResponse) {
	a := pool.Admission
	class, tenant := a.Classifier.Classify(req.header, sreq.Model, pool.Name)
	limits := s.envoyLimits(ctx)
	// Never hold a request longer than this Envoy waits for its answer.
	r := admit.Request{Class: class, Tenant: tenant, Tokens: a.Cost(sreq), MaxWait: limits.maxWait()}
	// Admission waits on actx, which ends with the stream, its cause told
	// by the watch that a queued request starts (the fast path needs none).
	actx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	var queued bool
	var unwatch func() bool
	defer func() {
		if unwatch != nil {
			unwatch()
		}
	}()
	tk, err := a.Admitter.Admit(actx, r, func(limit time.Duration) {
		queued = true
		watch := &holdWatch{arrived: req.arrived, limits: limits, fallback: s.opts.MessageTimeout}
		unwatch = watchEnvoy(ctx, watch, cancel)
		if d, ok := limits.holdFor(limit); ok && hold != nil {
			hold(d)
			watch.hold(time.Now(), d)
		}
	})
	if err != nil {
		if req.trace != nil {
			var ref *admit.Refusal
			if errors.As(err, &ref) {
				req.trace.setAdmission(ref.Class, tenant, queued, ref.Waited)
			}
		}
		return admitted{}, s.refuseAdmission(req, err, queued)
	}
	if req.trace != nil && tk != nil {
		req.trace.setAdmission(tk.Class, tenant, tk.Queued, tk.Waited)
	}
	out := admitted{ticket: tk}
	if a.EnginePriority != nil {
		out.priority, out.write = a.EnginePriority(class)
	}
	return out, nil
}

// refuseAdmission answers a request admission did not let through: 429
// with Retry-After when the pool is too busy for it, 503 when duet is
// shutting down. A client that went away gets nothing (Envoy has
// already reset the stream).
func (s *Server) refuseAdmission(req *request, err error, queued bool) *extprocv3.ProcessingResponse {
	var ref *admit.Refusal
	if !errors.As(err, &ref) {
		s.count(req, "client_gone")
		s.log.Debug("client went away while queued", zap.String("request_id", req.requestID), zap.Error(err))
		return immediateError(499, "client_gone", "the client went away while the request was queued")
	}
	outcome := admit.Outcome(ref.Reason)
	code, e := http.StatusTooManyRequests, openAIErrorBody{Type: "requests", Code: "rate_limit_exceeded"}
	switch {
	case errors.Is(ref.Reason, admit.ErrClosed):
		code, e = http.StatusServiceUnavailable, openAIErrorBody{Type: "server_error", Code: http.StatusServiceUnavailable}
		e.Message = fmt.Sprintf("duet is shutting down; retry on another replica (class %s)", ref.Class)
	case errors.Is(ref.Reason, admit.ErrQueueFull):
		e.Message = fmt.Sprintf("the engines of pool %s are saturated and duet's queue is full for class %s; retry after %ds", req.pool, ref.Class, retrySeconds(ref.RetryAfter))
	case errors.Is(ref.Reason, admit.ErrProxyTimeout):
		// Envoy has answered the client already (504); nothing duet sends
		// now reaches anyone.
		s.count(req, outcome)
		s.log.Warn("Envoy stopped waiting for a queued request: its client got Envoy's 504 (ext_proc per-message timeout). Envoy's bootstrap does not allow the wait duet asked for: its ext_proc filter lacks max_message_timeout, or has a shorter one. Re-render it (duet envoy-config) and restart Envoy, or set max_message_timeout to the longest wait_limit plus 2s",
			zap.String("pool", req.pool), zap.String("request_id", req.requestID), zap.String("class", ref.Class), zap.Duration("waited", ref.Waited))
		return immediateError(http.StatusGatewayTimeout, "proxy_timeout", "Envoy stopped waiting for duet's answer")
	case errors.Is(ref.Reason, admit.ErrShed):
		e.Message = fmt.Sprintf("the engines of pool %s are saturated; this request (class %s) gave its place in the queue to a higher class after %v; retry after %ds", req.pool, ref.Class, ref.Waited.Round(time.Millisecond), retrySeconds(ref.RetryAfter))
	default:
		e.Message = fmt.Sprintf("the engines of pool %s are saturated and this request (class %s) cannot start within its wait limit; retry after %ds", req.pool, ref.Class, retrySeconds(ref.RetryAfter))
	}
	s.count(req, outcome)
	req.trace.setMessage(e.Message)
	s.log.Info("not admitted", zap.String("pool", req.pool), zap.String("request_id", req.requestID),
		zap.String("class", ref.Class), zap.String("reason", outcome), zap.Bool("queued", queued), zap.Duration("waited", ref.Waited))
	resp := errorResponse(code, "admission_"+outcome, e)
	retry := strconv.Itoa(retrySeconds(ref.RetryAfter))
	im := resp.GetImmediateResponse()
	im.Headers.SetHeaders = append(im.Headers.SetHeaders, setHeader("retry-after", retry),
		setHeader("retry-after-ms", strconv.FormatInt(ref.RetryAfter.Milliseconds(), 10)))
	return resp
}

// retrySeconds is a Retry-After in whole seconds, at least 1.
func retrySeconds(d time.Duration) int {
	return max(int((d+time.Second-1)/time.Second), 1)
}
