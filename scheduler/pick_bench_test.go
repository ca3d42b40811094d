package scheduler

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

// benchScheduler returns a scheduler with n ready decode endpoints of dp
// ranks each, built without discovery.
func benchScheduler(b *testing.B, n, dp int, policy string) *Scheduler {
	b.Helper()
	specs := make([]EndpointSpec, n)
	for i := range specs {
		specs[i] = EndpointSpec{URL: "http://10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1) + ":30000"}
	}
	s, err := New(Config{Decode: specs, DecodePolicy: PolicySpec{Name: policy}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	s.discoverMu.Lock()
	for _, m := range s.members {
		m.cur.Ready, m.cur.DPSize, m.cur.Source = true, dp, sourceConfig
	}
	s.publish()
	s.discoverMu.Unlock()
	return s
}

// BenchmarkPick measures one request's scheduling: token estimate, prefix
// hashing and matching, the policy over every (endpoint, rank) target,
// reservation, prefix insertion, and the completion that releases it.
// Sixteen distinct prompts rotate, so the prefix index holds real matches.
func BenchmarkPick(b *testing.B) {
	for _, policy := range []string{"least_tokens", "cache_aware"} {
		for _, n := range []int{8, 64, 512} {
			for _, dp := range []int{1, 8, 16} {
				for _, size := range []int{1 << 10, 32 << 10, 256 << 10} {
					name := fmt.Sprintf("%s/endpoints=%d/ranks=%d/prompt=%dKiB", policy, n, dp, size>>10)
					b.Run(name, func(b *testing.B) {
						s := benchScheduler(b, n, dp, policy)
						rng := rand.New(rand.NewPCG(1, 2))
						prompts := make([][]byte, 16)
						for i := range prompts {
							p := make([]byte, size)
							for j := range p {
								p[j] = byte('a' + rng.IntN(26))
							}
							prompts[i] = p
						}
						ctx := b.Context()
						req := &Request{}
						b.SetBytes(int64(size))
						b.ReportAllocs()
						b.ResetTimer()
						for i := 0; b.Loop(); i++ {
							*req = Request{ID: "r", Prompt: prompts[i%len(prompts)], Blocks: req.Blocks[:0]}
							if _, err := s.Pick(ctx, req); err != nil {
								b.Fatal(err)
							}
							s.Complete(Feedback{RequestID: "r"})
						}
					})
				}
			}
		}
	}
}

// BenchmarkPickEjected is BenchmarkPick's least_tokens case with one
// target ejected, so that every pick filters the candidates.
func BenchmarkPickEjected(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("endpoints=%d/ranks=8", n), func(b *testing.B) {
			s := benchScheduler(b, n, 8, "least_tokens")
			p := s.snap.Load().decode
			s.health.cfg.FailuresToEject = 1
			s.health.fail(p.states[len(p.states)-1].health, sigFailures, s.now(), nil)
			if s.health.count.Load() != 1 {
				b.Fatal("no target ejected")
			}
			ctx := b.Context()
			req := &Request{}
			prompt := make([]byte, 1<<10)
			b.ReportAllocs()
			for b.Loop() {
				*req = Request{ID: "r", Prompt: prompt, Blocks: req.Blocks[:0]}
				d, err := s.Pick(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if d.Decode.Key() == p.targets[len(p.targets)-1].Key() {
					b.Fatal("picked the ejected target")
				}
				s.Complete(Feedback{RequestID: "r"})
			}
		})
	}
}
