package main

import (
	"context"
	"encoding/json"
	"net/http"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/scheduler"
)

// toFeedback converts a completion into the scheduler's terms. A leg's
// target is the host Envoy reached and the rank header the leg carried.
func toFeedback(c accesslog.Completion) scheduler.Feedback {
	f := scheduler.Feedback{RequestID: c.RequestID, Failed: c.Failed, Unreachable: c.Unreachable,
		PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens, Rank: scheduler.NoRank}
	switch c.Leg {
	case accesslog.LegDecode:
		f.Role = scheduler.RoleDecode
	case accesslog.LegPrefill:
		f.Role = scheduler.RolePrefill
	default:
		return f
	}
	f.Address = c.Upstream
	if c.DPRank != accesslog.NoRank {
		f.Rank = c.DPRank
	}
	return f
}

// fanout delivers each completion to every sink, in order.
type fanout []accesslog.Sink

// Complete implements accesslog.Sink.
func (f fanout) Complete(ctx context.Context, c accesslog.Completion) {
	for _, s := range f {
		s.Complete(ctx, c)
	}
}

// abortsPartners reports whether an ejection means the engine is dead or
// hung, so that the partner legs of the requests it holds will never
// complete: it failed its health probe, or a prefill engine stopped
// accepting connections. An engine ejected for failing requests (or for
// failing load scrapes, which a merely slow /v1/loads causes) still finishes
// or fails its requests on its own. A decode engine that refuses connections
// does not either: Envoy retries those requests on a fallback decode engine,
// whose prefill legs must live, and the legs that did reach the engine end
// with an access-log entry of their own.
func abortsPartners(role scheduler.Role, reason string) bool {
	return reason == scheduler.ReasonProbe || (reason == scheduler.ReasonUnreachable && role == scheduler.RolePrefill)
}

// registerFeedback serves Envoy's gRPC access-log streams on gs, delivering
// the completions of the legs of clusters to sink. The streams never end on their own, so they are
// closed when ctx ends; otherwise the graceful stop of gs would wait for
// them until its deadline.
func registerFeedback(ctx context.Context, gs *grpc.Server, sink accesslog.Sink, clusters accesslog.ClusterSet, log *zap.Logger, reg prometheus.Registerer) *accesslog.Server {
	srv := accesslog.NewServer(sink, clusters, log, reg)
	accesslogv3.RegisterAccessLogServiceServer(gs, srv)
	context.AfterFunc(ctx, srv.Close)
	return srv
}

// withFeedbackDebug adds GET /debug/completions to the admin handler: the
// latest completions as JSON, oldest first, or only those of one request
// with ?request_id=ID.
func withFeedbackDebug(next http.Handler, srv *accesslog.Server) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(srv.Recent(r.URL.Query().Get("request_id")))
	})
	mux.Handle("/", next)
	return mux
}
