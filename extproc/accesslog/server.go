package accesslog

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Outcomes of an entry, the "outcome" label of duet_feedback_entries_total.
const (
	outcomeOK      = "ok"      // a completion that did not fail
	outcomeFailed  = "failed"  // a completion whose leg failed
	outcomeIgnored = "ignored" // not an entry duet asked for (leg "unknown")
)

// legUnknown labels entries that are not one of the three legs.
const legUnknown = "unknown"

// Server implements envoy.service.accesslog.v3.AccessLogService: it reads
// Envoy's access-log streams and delivers one Completion per HTTP entry to
// its Sink. Register it with accesslogv3.RegisterAccessLogServiceServer.
type Server struct {
	accesslogv3.UnimplementedAccessLogServiceServer

	sink     Sink
	clusters ClusterSet
	log      *zap.Logger
	entries  *prometheus.CounterVec
	streams  prometheus.Gauge
	recent   *recent

	closeOnce sync.Once
	done      chan struct{}
}

// NewServer returns a Server that delivers to sink the legs of the engine
// clusters of every pool named by clusters (DefaultClusters for a field
// left empty, or for an empty set). Its metrics,
// duet_feedback_entries_total{leg,outcome} and duet_feedback_streams, are
// registered with reg unless reg is nil.
func NewServer(sink Sink, clusters ClusterSet, log *zap.Logger, reg prometheus.Registerer) *Server {
	clusters = slices.Clone(clusters)
	if len(clusters) == 0 {
		clusters = ClusterSet{DefaultClusters}
	}
	for i := range clusters {
		if clusters[i].Decode == "" {
			clusters[i].Decode = DefaultClusters.Decode
		}
		if clusters[i].Prefill == "" {
			clusters[i].Prefill = DefaultClusters.Prefill
		}
	}
	s := &Server{
		sink:     sink,
		clusters: clusters,
		log:      log,
		entries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_feedback_entries_total",
			Help: "Access-log entries received from Envoy, by leg (decode, prefill, request, unknown) and outcome (ok, failed, ignored).",
		}, []string{"leg", "outcome"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "duet_feedback_streams",
			Help: "Open access-log streams from Envoy.",
		}),
		recent: newRecent(RecentSize),
		done:   make(chan struct{}),
	}
	if reg != nil {
		reg.MustRegister(s.entries, s.streams)
	}
	return s
}

// Close ends every open stream and refuses new ones. Envoy's access-log
// streams never end on their own, so call it before a graceful stop of the
// gRPC server, or the stop waits for them.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.done) })
}

// Recent returns up to RecentSize of the latest completions, oldest first;
// with a non-empty requestID, only those whose duet or client request id
// it is.
func (s *Server) Recent(requestID string) []Completion {
	if requestID == "" {
		return s.recent.list(nil)
	}
	return s.recent.list(func(c Completion) bool {
		return c.RequestID == requestID || c.ClientRequestID == requestID
	})
}

// StreamAccessLogs reads one access-log stream until Envoy ends it or the
// Server is closed. The log name arrives in the first message only.
func (s *Server) StreamAccessLogs(stream grpc.ClientStreamingServer[accesslogv3.StreamAccessLogsMessage, accesslogv3.StreamAccessLogsResponse]) error {
	select {
	case <-s.done:
		return status.Error(codes.Unavailable, "duet is shutting down")
	default:
	}
	s.streams.Inc()
	defer s.streams.Dec()
	// receive runs apart so that Close can end a stream blocked in Recv;
	// only this goroutine answers on the stream.
	errc := make(chan error, 1)
	go func() { errc <- s.receive(stream) }()
	select {
	case err := <-errc:
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&accesslogv3.StreamAccessLogsResponse{})
		}
		return err
	case <-s.done:
		// Returning cancels the stream's context, which ends receive.
		return status.Error(codes.Unavailable, "duet is shutting down")
	}
}

// receive handles the stream's messages until it ends: io.EOF when Envoy
// closed it, else the stream's error.
func (s *Server) receive(stream grpc.ClientStreamingServer[accesslogv3.StreamAccessLogsMessage, accesslogv3.StreamAccessLogsResponse]) error {
	ctx := stream.Context()
	var logName string
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		if id := msg.GetIdentifier(); id != nil {
			logName = id.GetLogName()
			s.log.Debug("access-log stream", zap.String("log_name", logName), zap.String("node", id.GetNode().GetId()))
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			s.handle(ctx, logName, e)
		}
		if n := len(msg.GetTcpLogs().GetLogEntry()); n > 0 {
			s.entries.WithLabelValues(legUnknown, outcomeIgnored).Add(float64(n))
		}
	}
}

// handle delivers one HTTP entry.
func (s *Server) handle(ctx context.Context, logName string, e *accesslogdatav3.HTTPAccessLogEntry) {
	c, ok := s.clusters.completion(logName, e)
	if !ok {
		s.entries.WithLabelValues(legUnknown, outcomeIgnored).Inc()
		s.log.Debug("ignored access-log entry", zap.String("log_name", logName),
			zap.String("cluster", e.GetCommonProperties().GetUpstreamCluster()))
		return
	}
	outcome := outcomeOK
	if c.Failed {
		outcome = outcomeFailed
	}
	s.entries.WithLabelValues(string(c.Leg), outcome).Inc()
	s.recent.add(c)
	if s.log.Core().Enabled(zap.DebugLevel) {
		s.log.Debug("completion", zap.String("request_id", c.RequestID), zap.String("client_request_id", c.ClientRequestID), zap.String("leg", string(c.Leg)),
			zap.String("upstream", c.Upstream), zap.Int("status", c.Status), zap.Bool("failed", c.Failed),
			zap.String("flags", c.ResponseFlags), zap.Int64("prompt_tokens", c.PromptTokens),
			zap.Int64("completion_tokens", c.CompletionTokens), zap.Duration("duration", c.Duration),
			zap.String("decode", c.DecodeTarget), zap.String("prefill", c.PrefillTarget))
	}
	s.sink.Complete(ctx, c)
}
