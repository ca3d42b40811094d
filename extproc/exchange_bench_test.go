package extproc

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
