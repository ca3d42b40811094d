package accesslog

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// envoyLikeEntry is an entry shaped as Envoy 1.40 sends them: the fields
// it fills for a request, the given request headers and, on the
// downstream entry, duet's metadata.
func envoyLikeEntry(headers map[string]string, meta map[string]any) *accesslogv3.StreamAccessLogsMessage {
	d := durationpb.New(3 * time.Millisecond)
	common := &accesslogdatav3.AccessLogCommon{
		DownstreamRemoteAddress:       socketAddress("127.0.0.1", 51234),
		DownstreamLocalAddress:        socketAddress("127.0.0.1", 8080),
		DownstreamDirectRemoteAddress: socketAddress("127.0.0.1", 51234),
		UpstreamRemoteAddress:         socketAddress("127.0.0.1", 30001),
		UpstreamLocalAddress:          socketAddress("127.0.0.1", 40404),
		UpstreamCluster:               "duet_decode",
		StartTime:                     timestamppb.Now(),
		TimeToLastRxByte:              d, TimeToFirstUpstreamTxByte: d, TimeToLastUpstreamTxByte: d,
		TimeToFirstUpstreamRxByte: d, TimeToLastUpstreamRxByte: d, TimeToFirstDownstreamTxByte: d, TimeToLastDownstreamTxByte: d,
		Duration:                    d,
		ResponseFlags:               &accesslogdatav3.ResponseFlags{},
		RouteName:                   "",
		StreamId:                    "1234567890",
		UpstreamRequestAttemptCount: 1,
		UpstreamWireBytesSent:       33000, UpstreamWireBytesReceived: 500, DownstreamWireBytesSent: 500, DownstreamWireBytesReceived: 33000,
	}
	if meta != nil {
		s, _ := structpb.NewStruct(meta)
		common.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"duet": s}}
	}
	e := &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: common,
		ProtocolVersion:  accesslogdatav3.HTTPAccessLogEntry_HTTP11,
		Request: &accesslogdatav3.HTTPRequestProperties{RequestMethod: corev3.RequestMethod_POST, Scheme: "http", Authority: "127.0.0.1:8080",
			Path: "/v1/chat/completions", UserAgent: "Go-http-client/1.1", RequestId: "6b1f5f2e-6f5e-4a43-9a1e-3f0d8f3c1b2a",
			RequestHeadersBytes: 400, RequestBodyBytes: 32768, RequestHeaders: headers},
		Response: &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(200), ResponseHeadersBytes: 200, ResponseBodyBytes: 400, ResponseCodeDetails: "via_upstream"},
	}
	return &accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{e}}}}
}

// BenchmarkDecodeEntry measures what decoding one access-log entry costs
// duet (three per PD request, two aggregated), with the request headers
// Envoy logs now (envoy.LoggedRequestHeaders: 3) and before (5).
func BenchmarkDecodeEntry(b *testing.B) {
	five := map[string]string{"x-duet-request-id": "6b1f5f2e-6f5e-4a43-9a1e-3f0d8f3c1b2a", "x-request-id": "7b1f5f2e-6f5e-4a43-9a1e-3f0d8f3c1b2a",
		"x-duet-decode-endpoint": "127.0.0.1:30001,127.0.0.1:30003", "x-duet-prefill-endpoint": "127.0.0.1:30002", "x-data-parallel-rank": "1"}
	three := map[string]string{"x-duet-request-id": "6b1f5f2e-6f5e-4a43-9a1e-3f0d8f3c1b2a", "x-request-id": "7b1f5f2e-6f5e-4a43-9a1e-3f0d8f3c1b2a", "x-data-parallel-rank": "1"}
	meta := map[string]any{"request_id": "6b1f5f2e-6f5e-4a43-9a1e-3f0d8f3c1b2a", "pool": "default", "client_request_id": "7b1f5f2e-6f5e-4a43-9a1e-3f0d8f3c1b2a",
		"route": "chat", "decode": "http://127.0.0.1:30001#1", "prefill": "http://127.0.0.1:30002#0", "bootstrap_room": "1234567890123", "prompt_tokens": 8000.0, "completion_tokens": 1.0}
	for _, tc := range []struct {
		name    string
		headers map[string]string
		meta    map[string]any
	}{
		{"upstream/5-headers", five, nil}, {"upstream/3-headers", three, nil},
		{"downstream/5-headers", five, meta}, {"downstream/3-headers", three, meta},
	} {
		raw, err := proto.Marshal(envoyLikeEntry(tc.headers, tc.meta))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				var m accesslogv3.StreamAccessLogsMessage
				if err := proto.Unmarshal(raw, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
