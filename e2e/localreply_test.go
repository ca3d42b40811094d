package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy"
	"github.com/duet-router/duet/envoy/contract"
)

// fakeMode is the request header that tells fakeRouter how to answer.
const fakeMode = "x-fake-router"

// fakeRouter stands in for duet on Envoy's ext_proc and access-log streams,
// to make Envoy's own local replies happen on demand. By the request's
// fakeMode header it never answers ("hang"), fails the stream ("fail"),
// lets the request through without naming a pool ("continue"), or names
// the pool "p" ("route"). It keeps every downstream access-log entry.
type fakeRouter struct {
	extprocv3.UnimplementedExternalProcessorServer
	accesslogv3.UnimplementedAccessLogServiceServer

	mu      sync.Mutex
	entries []*accesslogdatav3.HTTPAccessLogEntry
}

// Process answers one ext_proc stream as its request's fakeMode says.
func (f *fakeRouter) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	switch mode := modeOf(req); mode {
	case "hang":
		<-stream.Context().Done()
		return nil
	case "fail":
		return status.Error(codes.Internal, "the fake router fails this stream")
	default:
		return letThrough(stream, mode == "route")
	}
}

// modeOf returns the fakeMode header of a request-headers message.
func modeOf(req *extprocv3.ProcessingRequest) string {
	for _, h := range req.GetRequestHeaders().GetHeaders().GetHeaders() {
		if h.Key == fakeMode {
			return string(h.RawValue)
		}
	}
	return ""
}

// letThrough answers the headers, naming the pool "p" (and having Envoy
// choose the route again) when route is set, then every body unchanged.
func letThrough(stream extprocv3.ExternalProcessor_ProcessServer, route bool) error {
	headers := &extprocv3.HeadersResponse{}
	if route {
		headers.Response = &extprocv3.CommonResponse{
			ClearRouteCache: true,
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
				Header: &corev3.HeaderValue{Key: contract.HeaderPool, RawValue: []byte("p")},
			}}},
		}
	}
	if err := stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: headers}}); err != nil {
		return err
	}
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		if req.GetRequestBody() == nil {
			continue
		}
		if err := stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}); err != nil {
			return err
		}
	}
}

// StreamAccessLogs keeps the downstream entries of one access-log stream
// (only its first message names its log).
func (f *fakeRouter) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	logName := ""
	for {
		msg, err := stream.Recv()
		if err != nil {
			return nil
		}
		if id := msg.GetIdentifier(); id != nil {
			logName = id.GetLogName()
		}
		if logName != contract.LogDownstream {
			continue
		}
		f.mu.Lock()
		f.entries = append(f.entries, msg.GetHttpLogs().GetLogEntry()...)
		f.mu.Unlock()
	}
}

// entry waits for the downstream access-log entry of request id.
func (f *fakeRouter) entry(t *testing.T, id string) *accesslogdatav3.HTTPAccessLogEntry {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		for _, e := range f.entries {
			if e.GetRequest().GetRequestHeaders()[contract.HeaderRequestID] == id {
				f.mu.Unlock()
				return e
			}
		}
		f.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no access-log entry for request %s", id)
	return nil
}

// fakeStack is Envoy, on duet's rendered bootstrap, in front of a
// fakeRouter.
type fakeStack struct {
	*harness.Stack
	router *fakeRouter
	server *grpc.Server
	envoy  *harness.Process
	// maxBody is the bootstrap's request.max_body_bytes.
	maxBody int
}

// startFakeStack renders duet's bootstrap with one pool "p", whose only
// decode engine is a closed port, for a fakeRouter, and starts both.
func startFakeStack(t *testing.T, messageTimeout time.Duration) *fakeStack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ports, err := harness.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeStack{router: &fakeRouter{}, server: grpc.NewServer(), maxBody: 64 << 10}
	extprocv3.RegisterExternalProcessorServer(fs.server, fs.router)
	accesslogv3.RegisterAccessLogServiceServer(fs.server, fs.router)
	healthpb.RegisterHealthServer(fs.server, health.NewServer())
	go fs.server.Serve(lis)
	t.Cleanup(fs.server.Stop)

	addr := func(p int) envoy.Address { return envoy.Address{Host: "127.0.0.1", Port: p} }
	p := envoy.Params{
		Listen: addr(ports[1]), Admin: addr(ports[2]), Duet: addr(ports[0]),
		MaxBodyBytes: fs.maxBody, MessageTimeout: messageTimeout, StreamIdleTimeout: time.Minute, MaxRoutingRequests: 64,
		Pools: []envoy.Pool{{Name: "p", DecodeCluster: "p_decode", PrefillCluster: "p_prefill", Decode: []envoy.Address{addr(ports[3])}}},
	}
	var buf bytes.Buffer
	if err := envoy.Render(&buf, p); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", ports[2])
	if fs.envoy, err = harness.StartEnvoy(ctx, dir, cfg, adminURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.envoy.Stop(5 * time.Second) })
	fs.Stack = &harness.Stack{EnvoyURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), EnvoyAdminURL: adminURL}
	return fs
}

// envoyLogLine waits for the line of Envoy's stdout access log that names
// request id.
func envoyLogLine(t *testing.T, p *harness.Process, id string) string {
	t.Helper()
	// Envoy flushes its stdout access log every 10 s or so.
	deadline := time.Now().Add(25 * time.Second)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(p.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "downstream ") && strings.Contains(line, "request_id="+id) {
				return line
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no access-log line for request %s in %s", id, p.LogPath)
	return ""
}

// checkLocalReply asserts that a reply of Envoy's own is the OpenAI error
// envelope, {"error":{"message","type","code"}}, with exactly message,
// and that none of Envoy's details reached the client.
func checkLocalReply(t *testing.T, resp *http.Response, body []byte, code int, typ, message, details string) {
	t.Helper()
	if resp.StatusCode != code {
		t.Errorf("status %d, want %d: %s", resp.StatusCode, code, body)
	}
	checkOpenAIError(t, resp, body, code, typ)
	if e, _ := parseOpenAIError(body); e.Message != message {
		t.Errorf("message %q, want %q", e.Message, message)
	}
	if bytes.Contains(body, []byte(details)) || bytes.Contains(body, []byte(envoy.DetailsExtProcPrefix)) {
		t.Errorf("the body shows Envoy's details %q: %s", details, body)
	}
}

// Claim: with duet down, the client's 503 says in plain words that the
// router is unavailable, in the OpenAI error envelope; Envoy's details
// (ext_proc_error_gRPC_error_14{...}) stay in its access log. Before, the
// message was " (ext_proc_error_gRPC_error_14{upstream_connect_error_or_...})".
func TestLocalReplyDuetDown(t *testing.T) {
	s := startStack(t, harness.Options{Prefill: []harness.SimSpec{{}}, Decode: []harness.SimSpec{{}}})
	if resp, body := send(t, s, "POST", "/v1/chat/completions", nil, chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("before stopping duet: %d %s", resp.StatusCode, body)
	}
	if err := s.Duet.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ method, path string }{{"POST", "/v1/chat/completions"}, {"GET", "/v1/models"}} {
		id := requestID(t, i)
		var body []byte
		if tc.method == "POST" {
			body = chatBody(false, "")
		}
		resp, out := send(t, s, tc.method, tc.path, map[string]string{"x-request-id": id}, body)
		checkLocalReply(t, resp, out, 503, "server_error", envoy.MessageRouterUnavailable, "ext_proc_error_gRPC_error_14")
		if line := envoyLogLine(t, s.Envoy, id); !strings.Contains(line, " 503 - ext_proc_error_gRPC_error_14{") {
			t.Errorf("%s %s: Envoy's access log lacks the details: %s", tc.method, tc.path, line)
		}
	}
}

// Claim: a request duet does not answer within the ext_proc filter's
// message timeout gets a 504 that says the router did not answer in time;
// Envoy's details (ext_proc_error_per-message_timeout_exceeded) are on
// both access logs. Before, the message was
// " (ext_proc_error_per-message_timeout_exceeded)".
func TestLocalReplyMessageTimeout(t *testing.T) {
	const timeout = time.Second
	fs := startFakeStack(t, timeout)
	id := requestID(t, 0)
	start := time.Now()
	resp, out := send(t, fs.Stack, "POST", "/v1/chat/completions", map[string]string{fakeMode: "hang", "x-request-id": id}, chatBody(false, ""))
	if took := time.Since(start); took < timeout {
		t.Errorf("answered after %v, before the %v message timeout", took, timeout)
	}
	checkLocalReply(t, resp, out, 504, "server_error", envoy.MessageRouterTimeout, envoy.DetailsExtProcTimeout)
	if got := fs.router.entry(t, id).GetResponse().GetResponseCodeDetails(); got != envoy.DetailsExtProcTimeout {
		t.Errorf("gRPC access-log entry: details %q, want %q", got, envoy.DetailsExtProcTimeout)
	}
	if line := envoyLogLine(t, fs.envoy, id); !strings.Contains(line, " 504 - "+envoy.DetailsExtProcTimeout+" ") {
		t.Errorf("Envoy's access log lacks the details: %s", line)
	}
}

// Claim: every other reply Envoy makes itself on duet's rendered bootstrap
// is the OpenAI error envelope with a message that says what happened,
// and its details are in the gRPC access-log entry and the stdout line,
// not in the body: a failed ext_proc stream (503), a body above the
// limit (413), no route (404, a request duet named no pool for) and an
// engine that cannot be reached (503); then duet gone (503).
func TestLocalReplyEnvoyErrors(t *testing.T) {
	fs := startFakeStack(t, 2*time.Second)
	// The stdout access log's lines, checked at the end: Envoy flushes it
	// every 10 s or so.
	logged := map[string]string{}
	for i, tc := range []struct {
		name, mode string
		body       []byte
		code       int
		typ, msg   string
		// details starts Envoy's response code details.
		details string
	}{
		{"ext_proc stream failed", "fail", chatBody(false, ""), 503, "server_error", envoy.MessageRouterUnavailable,
			"ext_proc_error_gRPC_error_13{the_fake_router_fails_this_stream"},
		{"body above the limit", "continue", []byte(`{"model":"m","prompt":"` + strings.Repeat("a", fs.maxBody) + `"}`), 413,
			"invalid_request_error", contract.BodyTooLargeMessage(fs.maxBody), "request_payload_too_large"},
		{"no route", "continue", chatBody(false, ""), 404, "invalid_request_error", envoy.MessageNoRoute, "route_not_found"},
		{"engine unreachable", "route", chatBody(false, ""), 503, "server_error", envoy.MessageEngineFailed,
			"upstream_reset_before_response_started{remote_connection_failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := requestID(t, i)
			resp, out := send(t, fs.Stack, "POST", "/v1/chat/completions", map[string]string{fakeMode: tc.mode, "x-request-id": id}, tc.body)
			checkLocalReply(t, resp, out, tc.code, tc.typ, tc.msg, tc.details)
			if got := fs.router.entry(t, id).GetResponse().GetResponseCodeDetails(); !strings.HasPrefix(got, tc.details) {
				t.Errorf("gRPC access-log entry: details %q, want %q...", got, tc.details)
			}
			logged[id] = tc.details
		})
	}
	t.Run("router gone", func(t *testing.T) {
		fs.server.Stop()
		id := requestID(t, 0)
		resp, out := send(t, fs.Stack, "POST", "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false, ""))
		checkLocalReply(t, resp, out, 503, "server_error", envoy.MessageRouterUnavailable, "ext_proc_error_gRPC_error_14")
		logged[id] = "ext_proc_error_gRPC_error_14{"
	})
	for id, details := range logged {
		if line := envoyLogLine(t, fs.envoy, id); !strings.Contains(line, details) {
			t.Errorf("Envoy's access log lacks the details %q: %s", details, line)
		}
	}
}
