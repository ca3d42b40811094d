package extproc

import (
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// cpuClock measures the CPU time (user and system, every thread) the
// process spends over a benchmark loop. An exchange's wall time is mostly
// goroutine wake-ups across loopback; its CPU time is what it costs a core
// that Envoy, duet and the engines share.
type cpuClock struct{ start time.Duration }

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU(b *testing.B) cpuClock { return cpuClock{processCPU(b)} }

// report adds cpu-ns/op: process CPU per iteration, client (the Go stand-in
// for Envoy) and server together.
func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(processCPU(b)-c.start)/float64(b.N), "cpu-ns/op")
}

// chatOfSize returns a chat request body of about n bytes.
func chatOfSize(n int) []byte {
	const head = `{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"`
	const tail = `"}]}`
	fill := max(n-len(head)-len(tail), 0)
	return []byte(head + strings.Repeat("lorem ipsum ", fill/12+1)[:fill] + tail)
}

// BenchmarkExchange is the whole ext_proc exchange of one request, as Envoy
// drives it over loopback gRPC: request headers, then the buffered body,
// then duet's body response with its header and body mutations. The picker
// is a fixed fake, so this measures duet's own path (gRPC, protobuf, JSON
// parsing and rewriting, prompt hashing) without the scheduler; the pick is
// BenchmarkPick in package scheduler.
func BenchmarkExchange(b *testing.B) {
	// pd-pools routes by model among four pools (the body's model is the
	// third pool's): the cost of the pool lookup, the model rewrite aside.
	var pools []Pool
	for i, m := range []string{"a", "b", "m", "d"} {
		pools = append(pools, Pool{Name: fmt.Sprint("pool", i), Models: []string{m}, Picker: &fakePicker{decision: pdPick},
			PrefillCluster: fmt.Sprint("duet_pool", i, "_prefill")})
	}
	for _, mode := range []struct {
		name string
		opts Options
	}{
		{"pd", Options{Picker: &fakePicker{decision: pdPick}, PrefillCluster: "duet_prefill"}},
		{"aggregated", Options{Picker: &fakePicker{decision: aggPick}, PrefillCluster: "duet_prefill"}},
		{"pd-pools", Options{Pools: pools}},
	} {
		mode.opts.MaxBodyBytes, mode.opts.Metrics = 4<<20, NewMetrics(prometheus.NewRegistry())
		c := clientFor(b, mode.opts)
		for _, size := range []int{1 << 10, 32 << 10, 256 << 10} {
			body := chatOfSize(size)
			b.Run(fmt.Sprintf("%s/%dKiB", mode.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				cpu := startCPU(b)
				for b.Loop() {
					resp := exchange(b, c, "POST", "/v1/chat/completions", nil, body)
					if common(resp).GetBodyMutation() == nil {
						b.Fatalf("no body mutation: %v", resp)
					}
				}
				cpu.report(b)
			})
		}
	}
}

// discardExporter drops every span: the cost of recording and batching
// spans without a collector's.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// procStream is an ext_proc stream in process: Envoy's two messages of one
// request, and the gRPC metadata they came with. Benchmarks drive
// Server.Process with it, so that they count duet's own work and
// allocations, without gRPC's and the client's.
type procStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
	next int
	last *extprocv3.ProcessingResponse
}

func (s *procStream) Context() context.Context { return s.ctx }

func (s *procStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if s.next == len(s.msgs) {
		return nil, io.EOF
	}
	s.next++
	return s.msgs[s.next-1], nil
}

func (s *procStream) Send(resp *extprocv3.ProcessingResponse) error {
	s.last = resp
	return nil
}

// BenchmarkExchangeTracing is BenchmarkExchange's PD exchange with tracing
// off (no Tracer), on under a parent Envoy did not sample (duet reads the
// traceparent and records nothing), and on under a sampled parent (a
// batched SDK provider whose exporter drops the spans; the picker explains
// its decision as least_cost does). "grpc" runs the exchange over loopback
// gRPC, as BenchmarkExchange does; "inproc" calls Server.Process with an
// in-process stream, so that allocs/op are duet's alone.
func BenchmarkExchangeTracing(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())),
		sdktrace.WithBatcher(discardExporter{}))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	for _, mode := range []struct {
		name   string
		tracer trace.Tracer
		parent string
	}{
		{"off", nil, sampledParent},
		{"unsampled", tp.Tracer("duet-bench"), unsampledParent},
		{"sampled", tp.Tracer("duet-bench"), sampledParent},
	} {
		opts := Options{Picker: &fakePicker{decision: pdPick, explain: explained}, PrefillCluster: "duet_prefill",
			MaxBodyBytes: 4 << 20, Metrics: NewMetrics(prometheus.NewRegistry()), Tracer: mode.tracer}
		c := clientFor(b, opts)
		srv, err := NewServer(opts)
		if err != nil {
			b.Fatal(err)
		}
		ctx := withTraceParent(mode.parent)
		incoming := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", mode.parent))
		for _, size := range []int{1 << 10, 32 << 10} {
			body := chatOfSize(size)
			b.Run(fmt.Sprintf("grpc/%s/%dKiB", mode.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				cpu := startCPU(b)
				for b.Loop() {
					resp := exchangeContext(b, ctx, c, "POST", "/v1/chat/completions", nil, body)
					if common(resp).GetBodyMutation() == nil {
						b.Fatalf("no body mutation: %v", resp)
					}
				}
				cpu.report(b)
			})
			msgs := []*extprocv3.ProcessingRequest{
				{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
					Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
						{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
					}}}}},
				{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
			}
			b.Run(fmt.Sprintf("inproc/%s/%dKiB", mode.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				stream := &procStream{ctx: incoming, msgs: msgs}
				for b.Loop() {
					stream.next = 0
					if err := srv.Process(stream); err != nil {
						b.Fatal(err)
					}
					if common(stream.last).GetBodyMutation() == nil {
						b.Fatalf("no body mutation: %v", stream.last)
					}
				}
			})
		}
	}
}
