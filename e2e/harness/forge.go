package harness

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/duet-router/duet/envoy/contract"
)

// The tools of a caller of duet's gRPC port that is not Envoy, for tests
// of who duet listens to (docs/security.md).

// ForgedEntry is an upstream access-log entry as Envoy would send it for a
// leg of request id on cluster and upstream ("ip:port") with rank (-1:
// none), failed with status (0: no response) or, with unreachable, a
// refused connection.
func ForgedEntry(id, cluster, upstream string, rank int, status uint32, unreachable bool) *accesslogdatav3.HTTPAccessLogEntry {
	host, port, _ := net.SplitHostPort(upstream)
	p, _ := strconv.Atoi(port)
	headers := map[string]string{contract.HeaderDuetRequestID: id}
	if rank >= 0 {
		headers[contract.HeaderDPRank] = strconv.Itoa(rank)
	}
	e := &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: &accesslogdatav3.AccessLogCommon{
			UpstreamCluster: cluster,
			UpstreamRemoteAddress: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}}},
			ResponseFlags: &accesslogdatav3.ResponseFlags{UpstreamConnectionFailure: unreachable},
		},
		Request:  &accesslogdatav3.HTTPRequestProperties{RequestHeaders: headers},
		Response: &accesslogdatav3.HTTPResponseProperties{},
	}
	if status != 0 {
		e.Response.ResponseCode = wrapperspb.UInt32(status)
	}
	return e
}

// UnreachableDecodes is the forged message of issue 19: each of decodes
// ("ip:port") refused n/len(decodes) connections, for made-up request ids
// forged-0... Believed, it ejects every decode engine.
func UnreachableDecodes(decodes []string, n int) []*accesslogdatav3.HTTPAccessLogEntry {
	entries := make([]*accesslogdatav3.HTTPAccessLogEntry, n)
	for i := range entries {
		entries[i] = ForgedEntry("forged-"+strconv.Itoa(i), contract.ClusterDecode, decodes[i%len(decodes)], i%2, 0, true)
	}
	return entries
}

// SendAccessLogs sends entries on conn as one message of duet's upstream
// access log and returns the stream's final status.
func SendAccessLogs(ctx context.Context, conn *grpc.ClientConn, entries []*accesslogdatav3.HTTPAccessLogEntry) error {
	stream, err := accesslogv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		return err
	}
	err = stream.Send(&accesslogv3.StreamAccessLogsMessage{
		Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{LogName: contract.LogUpstream, Node: &corev3.Node{Id: "envoy"}},
		LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}},
	})
	if err == nil || errors.Is(err, io.EOF) { // EOF: the status comes with the close
		_, err = stream.CloseAndRecv()
	}
	return err
}

// AskRoute opens an ext_proc stream on conn, sends the headers of a
// bodiless request and returns the status of the answer.
func AskRoute(ctx context.Context, conn *grpc.ClientConn) error {
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return err
	}
	err = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers:     &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}},
		EndOfStream: true,
	}}})
	if err == nil || errors.Is(err, io.EOF) {
		_, err = stream.Recv()
	}
	return err
}
