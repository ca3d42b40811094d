package accesslog

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// entryOpt shapes a test entry.
type entryOpt func(*accesslogdatav3.HTTPAccessLogEntry)

// entry builds an HTTP access-log entry the way Envoy 1.40 fills one: the
// cluster, the upstream host, the status and the logged request headers.
func entry(cluster, upstream string, status uint32, headers map[string]string, opts ...entryOpt) *accesslogdatav3.HTTPAccessLogEntry {
	e := &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: &accesslogdatav3.AccessLogCommon{
			UpstreamCluster: cluster,
			Duration:        durationpb.New(25e6),
		},
		Request:  &accesslogdatav3.HTTPRequestProperties{RequestHeaders: headers},
		Response: &accesslogdatav3.HTTPResponseProperties{},
	}
	if upstream != "" {
		e.CommonProperties.UpstreamRemoteAddress = sockAddr(upstream)
	}
	if status != 0 {
		e.Response.ResponseCode = wrapperspb.UInt32(status)
	}
	for _, o := range opts {
		o(e)
	}
	return e
}

// sockAddr is "127.0.0.1:30001"-style test shorthand: the port is fixed.
func sockAddr(ip string) *corev3.Address { return socketAddress(ip, 30001) }

// socketAddress is an Envoy socket address.
func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// withMetadata sets the duet dynamic metadata.
func withMetadata(fields map[string]any) entryOpt {
	return func(e *accesslogdatav3.HTTPAccessLogEntry) {
		s, err := structpb.NewStruct(fields)
		if err != nil {
			panic(err)
		}
		e.CommonProperties.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"duet": s}}
	}
}

// withFlags sets the response flags.
func withFlags(f *accesslogdatav3.ResponseFlags) entryOpt {
	return func(e *accesslogdatav3.HTTPAccessLogEntry) { e.CommonProperties.ResponseFlags = f }
}

// withRequestID sets Envoy's request id field (not the logged header).
func withRequestID(id string) entryOpt {
	return func(e *accesslogdatav3.HTTPAccessLogEntry) { e.Request.RequestId = id }
}

// withoutDuration clears the duration and sets the last downstream byte.
func withoutDuration(e *accesslogdatav3.HTTPAccessLogEntry) {
	e.CommonProperties.Duration = nil
	e.CommonProperties.TimeToLastDownstreamTxByte = durationpb.New(7e6)
}

// hdr returns the logged request headers of a leg.
func hdr(id, rank string) map[string]string {
	h := map[string]string{
		"x-duet-request-id":       id,
		"x-request-id":            "client-" + id,
		"x-duet-decode-endpoint":  "127.0.0.2:30001",
		"x-duet-prefill-endpoint": "127.0.0.1:30001",
	}
	if rank != "" {
		h["x-data-parallel-rank"] = rank
	}
	return h
}
