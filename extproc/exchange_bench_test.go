package extproc

import (
	"fmt"
	"strings"
	"testing"
)

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
	for _, mode := range []struct {
		name string
		pick *fakePicker
	}{
		{"pd", &fakePicker{decision: pdPick}},
		{"aggregated", &fakePicker{decision: aggPick}},
	} {
		c := client(b, mode.pick, 4<<20)
		for _, size := range []int{1 << 10, 32 << 10, 256 << 10} {
			body := chatOfSize(size)
			b.Run(fmt.Sprintf("%s/%dKiB", mode.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					resp := exchange(b, c, "POST", "/v1/chat/completions", nil, body)
					if common(resp).GetBodyMutation() == nil {
						b.Fatalf("no body mutation: %v", resp)
					}
				}
			})
		}
	}
}
