package scheduler

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

// BenchmarkPickPD is BenchmarkPick for a PD pool with the default policies
// (least_cost on both roles): the prefill role is indexed and keeps turn
// ends. Each of sixteen conversations grows by one turn per pick, so the
// turn ends are found, checked and replaced as a conversation's next turn
// does.
func BenchmarkPickPD(b *testing.B) {
	for _, n := range []int{8, 64} {
		for _, size := range []int{1 << 10, 32 << 10, 256 << 10} {
			b.Run(fmt.Sprintf("endpoints=%d/ranks=8/prompt=%dKiB", n, size>>10), func(b *testing.B) {
				spec := func(role string, i int) EndpointSpec {
					return EndpointSpec{URL: "http://10." + role + "." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1) + ":30000"}
				}
				var prefill, decode []EndpointSpec
				for i := range n {
					prefill, decode = append(prefill, spec("1", i)), append(decode, spec("2", i))
				}
				s, err := New(Config{Prefill: prefill, Decode: decode,
					PrefillPolicy: PolicySpec{Name: DefaultPrefillPolicy}, DecodePolicy: PolicySpec{Name: DefaultDecodePolicy}}, nil)
				if err != nil {
					b.Fatal(err)
				}
				s.discoverMu.Lock()
				for _, m := range s.members {
					m.cur.Ready, m.cur.DPSize, m.cur.Source = true, 8, sourceConfig
				}
				s.publish()
				s.discoverMu.Unlock()
				rng := rand.New(rand.NewPCG(1, 2))
				text := make([]byte, size+64*1024)
				for j := range text {
					text[j] = byte('a' + rng.IntN(26))
				}
				convs := make([]int, 16) // each conversation's length
				for i := range convs {
					convs[i] = size / 2
				}
				ctx := b.Context()
				req := &Request{}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					c := i % len(convs)
					convs[c] += 256
					if convs[c] > size {
						convs[c] = size / 2
					}
					// Conversation c's text starts at offset c: its own prefix.
					*req = Request{ID: "r", Prompt: text[c : c+convs[c]], Blocks: req.Blocks[:0]}
					if _, err := s.Pick(ctx, req); err != nil {
						b.Fatal(err)
					}
					s.Complete(Feedback{RequestID: "r"})
				}
			})
		}
	}
}
