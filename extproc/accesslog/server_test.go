package accesslog

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// recorder is a Sink that keeps what it gets.
type recorder struct {
	mu  sync.Mutex
	got []Completion
}

func (r *recorder) Complete(ctx context.Context, c Completion) {
	if ctx == nil {
		panic("Complete without a context")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, c)
}

func (r *recorder) completions() []Completion {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// serve runs srv on a loopback gRPC server and returns a client for it.
func serve(t *testing.T, srv *Server) accesslogv3.AccessLogServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	accesslogv3.RegisterAccessLogServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return accesslogv3.NewAccessLogServiceClient(cc)
}

// httpLogs builds a message of HTTP entries; with a log name it carries the
// stream identifier, as Envoy's first message does.
func httpLogs(logName string, entries ...*accesslogdatav3.HTTPAccessLogEntry) *accesslogv3.StreamAccessLogsMessage {
	m := &accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries},
	}}
	if logName != "" {
		m.Identifier = &accesslogv3.StreamAccessLogsMessage_Identifier{LogName: logName}
	}
	return m
}

// counts reads duet_feedback_entries_total as "leg/outcome" -> value.
func counts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "duet_feedback_entries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var leg, outcome string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "leg":
					leg = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			out[leg+"/"+outcome] = m.GetCounter().GetValue()
		}
	}
	return out
}

// gauge reads duet_feedback_streams.
func gauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "duet_feedback_streams" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("duet_feedback_streams not registered")
	return 0
}

func TestStreamAccessLogs(t *testing.T) {
	decode := entry("duet_decode", "127.0.0.2", 200, hdr("r1", "1"))
	prefill := entry("duet_prefill", "127.0.0.1", 0, hdr("r1", "0"),
		withFlags(&accesslogdatav3.ResponseFlags{UpstreamConnectionFailure: true}))
	request := entry("duet_decode", "127.0.0.2", 200, hdr("r1", "1"),
		withMetadata(map[string]any{"prompt_tokens": float64(9), "completion_tokens": float64(8)}))
	tcp := &accesslogv3.StreamAccessLogsMessage{
		Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{LogName: "duet_upstream"},
		LogEntries: &accesslogv3.StreamAccessLogsMessage_TcpLogs{TcpLogs: &accesslogv3.StreamAccessLogsMessage_TCPAccessLogEntries{
			LogEntry: []*accesslogdatav3.TCPAccessLogEntry{{}, {}},
		}},
	}
	type leg struct {
		id  string
		leg Leg
	}
	tests := []struct {
		name    string
		streams [][]*accesslogv3.StreamAccessLogsMessage
		want    []leg
		counts  map[string]float64
	}{
		{"identifier only on the first message",
			[][]*accesslogv3.StreamAccessLogsMessage{{httpLogs("duet_upstream", decode), httpLogs("", prefill)}},
			[]leg{{"r1", LegDecode}, {"r1", LegPrefill}},
			map[string]float64{"decode/ok": 1, "prefill/failed": 1}},
		{"several entries in one message",
			[][]*accesslogv3.StreamAccessLogsMessage{{httpLogs("duet_upstream", prefill, decode, decode)}},
			[]leg{{"r1", LegPrefill}, {"r1", LegDecode}, {"r1", LegDecode}},
			map[string]float64{"decode/ok": 2, "prefill/failed": 1}},
		{"one stream per log",
			[][]*accesslogv3.StreamAccessLogsMessage{{httpLogs("duet_downstream", request)}, {httpLogs("duet_upstream", decode)}},
			[]leg{{"r1", LegRequest}, {"r1", LegDecode}},
			map[string]float64{"request/ok": 1, "decode/ok": 1}},
		{"another log is ignored",
			[][]*accesslogv3.StreamAccessLogsMessage{{httpLogs("other", decode), httpLogs("", request)}},
			nil,
			map[string]float64{"unknown/ignored": 2}},
		{"a stream without identifier is ignored",
			[][]*accesslogv3.StreamAccessLogsMessage{{httpLogs("", decode)}},
			nil,
			map[string]float64{"unknown/ignored": 1}},
		{"TCP entries are ignored",
			[][]*accesslogv3.StreamAccessLogsMessage{{tcp, httpLogs("", decode)}},
			[]leg{{"r1", LegDecode}},
			map[string]float64{"unknown/ignored": 2, "decode/ok": 1}},
		{"an empty stream",
			[][]*accesslogv3.StreamAccessLogsMessage{{}},
			nil, map[string]float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := &recorder{}
			reg := prometheus.NewRegistry()
			srv := NewServer(sink, nil, zap.NewNop(), reg)
			client := serve(t, srv)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, msgs := range tt.streams {
				stream, err := client.StreamAccessLogs(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range msgs {
					if err := stream.Send(m); err != nil {
						t.Fatal(err)
					}
				}
				// The server answers once it has handled every message.
				if _, err := stream.CloseAndRecv(); err != nil {
					t.Fatal(err)
				}
			}
			var got []leg
			for _, c := range sink.completions() {
				got = append(got, leg{c.RequestID, c.Leg})
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("completions %v, want %v", got, tt.want)
			}
			if c := counts(t, reg); !mapsEqual(c, tt.counts) {
				t.Errorf("duet_feedback_entries_total %v, want %v", c, tt.counts)
			}
			if n := len(srv.Recent("")); n != len(tt.want) {
				t.Errorf("Recent kept %d completions, want %d", n, len(tt.want))
			}
			if g := gauge(t, reg); g != 0 {
				t.Errorf("duet_feedback_streams = %v after the streams ended", g)
			}
		})
	}
}

func mapsEqual(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestRecentByRequest(t *testing.T) {
	sink := &recorder{}
	srv := NewServer(sink, nil, zap.NewNop(), nil)
	client := serve(t, srv)
	stream, err := client.StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(httpLogs("duet_upstream",
		entry("duet_decode", "127.0.0.2", 200, hdr("a", "")),
		entry("duet_prefill", "127.0.0.1", 200, hdr("b", "")),
		entry("duet_decode", "127.0.0.2", 200, hdr("b", "")))); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	var legs []Leg
	for _, c := range srv.Recent("b") {
		legs = append(legs, c.Leg)
	}
	if !slices.Equal(legs, []Leg{LegPrefill, LegDecode}) {
		t.Errorf("Recent(b) legs = %v", legs)
	}
	if n := len(srv.Recent("")); n != 3 {
		t.Errorf("Recent() = %d completions, want 3", n)
	}
	if n := len(srv.Recent("c")); n != 0 {
		t.Errorf("Recent(c) = %d completions, want 0", n)
	}
}

// Envoy's streams never end on their own: Close ends them (so a graceful
// stop of the gRPC server does not wait) and refuses new ones.
func TestCloseEndsStreams(t *testing.T) {
	sink := &recorder{}
	reg := prometheus.NewRegistry()
	srv := NewServer(sink, nil, zap.NewNop(), reg)
	client := serve(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := client.StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(httpLogs("duet_upstream", entry("duet_decode", "127.0.0.2", 200, hdr("a", "")))); err != nil {
		t.Fatal(err)
	}
	for len(sink.completions()) == 0 {
		if ctx.Err() != nil {
			t.Fatal("the entry never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	if g := gauge(t, reg); g != 1 {
		t.Errorf("duet_feedback_streams = %v with one open stream", g)
	}
	srv.Close()
	srv.Close() // idempotent
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Errorf("open stream after Close: %v, want Unavailable", err)
	}
	again, err := client.StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Errorf("new stream after Close: %v, want Unavailable", err)
	}
	if g := gauge(t, reg); g != 0 {
		t.Errorf("duet_feedback_streams = %v after Close", g)
	}
}
