package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/duet-router/duet/extproc"
)

// The floor processors: ext_proc servers that decide nothing, so that
// Envoy's own ext_proc cost (gRPC client, buffering, the round trips) can
// be told from duet's. They run in a process of their own (this command,
// re-executed with -serve-floor), pinned with the servers, with duet's
// gRPC server options.
const (
	// floorEmpty answers the headers and the buffered body with empty
	// responses: no mutation at all.
	floorEmpty = "empty"
	// floorEcho answers the buffered body with a body mutation that
	// replaces it with itself, and a content-length header: the shape and
	// size of duet's answer, without its parsing and scheduling.
	floorEcho = "echo"
	// floorDuplex is for FULL_DUPLEX_STREAMED: it holds the headers until
	// the body has arrived, then answers the headers and streams the body
	// back unchanged, as a router that must see the body before it decides
	// would.
	floorDuplex = "duplex"
)

// duplexChunk is the largest body chunk the duplex floor sends back
// (Envoy's documentation recommends at most 64 KiB).
const duplexChunk = 64 << 10

// serveFloor serves the floor processor of mode on addr until the process
// is stopped.
func serveFloor(addr, mode string, maxBody int) error {
	switch mode {
	case floorEmpty, floorEcho, floorDuplex:
	default:
		return fmt.Errorf("unknown floor mode %q (want %s, %s or %s)", mode, floorEmpty, floorEcho, floorDuplex)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	gs := grpc.NewServer(extproc.ServerOptions(maxBody)...)
	extprocv3.RegisterExternalProcessorServer(gs, floorProcessor{mode: mode})
	return gs.Serve(lis)
}

// floorProcessor is an ext_proc server that changes nothing (see
// floorEmpty, floorEcho, floorDuplex).
type floorProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	mode string
}

// Process answers one request's messages and ends the stream once the
// request is complete, as duet does.
func (f floorProcessor) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		var out []*extprocv3.ProcessingResponse
		last := false
		switch m := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			last = m.RequestHeaders.EndOfStream
			if f.mode != floorDuplex || last {
				out = append(out, headersResponse())
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, m.RequestBody.Body...)
			last = m.RequestBody.EndOfStream
			switch f.mode {
			case floorEmpty:
				out = append(out, bodyResponse(&extprocv3.CommonResponse{}))
			case floorEcho:
				out = append(out, bodyResponse(&extprocv3.CommonResponse{
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
						Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))},
					}}},
					BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}},
				}))
			case floorDuplex:
				if last {
					out = append(out, duplexAnswer(body)...)
				}
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			last = true
			if f.mode == floorDuplex {
				out = append(out, duplexAnswer(body)...)
			}
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
				RequestTrailers: &extprocv3.TrailersResponse{},
			}})
		default:
			return status.Errorf(codes.InvalidArgument, "the floor processor handles requests only, got %T", m)
		}
		for _, r := range out {
			if err := stream.Send(r); err != nil {
				return err
			}
		}
		if last {
			return nil
		}
	}
}

// headersResponse lets the request headers through unchanged.
func headersResponse() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{},
	}}
}

// duplexAnswer is the duplex floor's answer once the whole request has
// arrived: the held headers, then the body streamed back.
func duplexAnswer(body []byte) []*extprocv3.ProcessingResponse {
	return append([]*extprocv3.ProcessingResponse{headersResponse()}, streamedBody(body)...)
}

func bodyResponse(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: c},
	}}
}

// streamedBody returns body as FULL_DUPLEX_STREAMED body responses of at
// most duplexChunk bytes, the last marked end of stream.
func streamedBody(body []byte) []*extprocv3.ProcessingResponse {
	var out []*extprocv3.ProcessingResponse
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), duplexChunk)
		chunk := body[:n]
		body = body[n:]
		out = append(out, bodyResponse(&extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: len(body) == 0},
			}},
		}))
	}
	return out
}
