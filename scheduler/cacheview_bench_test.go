package scheduler

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/duet-router/duet/scheduler/kvevents"
)

// BenchmarkPickCacheView is one token-id request's prefill pick with
// least_cost over n prefill endpoints of dp ranks, with the prefix
// estimate alone ("estimate") and with every rank's KV event view live
// ("events": kvevents.Tracker, each view holding a quarter of the 16
// rotating prompts): the precise match's share of a request.
func BenchmarkPickCacheView(b *testing.B) {
	for _, view := range []string{"estimate", "events"} {
		for _, n := range []int{2, 16} {
			for _, tokens := range []int{1 << 10, 8 << 10, 32 << 10} {
				b.Run(fmt.Sprintf("view=%s/endpoints=%d/ranks=8/tokens=%d", view, n, tokens), func(b *testing.B) {
					benchPickCacheView(b, view == "events", n, 8, tokens)
				})
			}
		}
	}
}

func benchPickCacheView(b *testing.B, events bool, n, dp, tokens int) {
	prefill := make([]EndpointSpec, n)
	for i := range prefill {
		prefill[i] = EndpointSpec{URL: "http://10.0.0." + strconv.Itoa(i+1) + ":30000"}
	}
	cfg := Config{Prefill: prefill, Decode: []EndpointSpec{{URL: "http://10.1.0.1:30000"}},
		PrefillPolicy: PolicySpec{Name: "least_cost"}, DecodePolicy: PolicySpec{Name: "least_cost"}}
	var tracker *kvevents.Tracker[TargetKey]
	if events {
		tracker = kvevents.NewTracker[TargetKey](kvevents.TrackerConfig{BlockTokens: 16}, nil)
		cfg.CacheView = tracker
	}
	s, err := New(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	s.discoverMu.Lock()
	for _, m := range s.members {
		m.cur.Ready, m.cur.DPSize, m.cur.Source = true, dp, sourceConfig
		m.cur.KVEvents = KVEvents{Port: 5557}
	}
	s.publish()
	s.discoverMu.Unlock()

	rng := rand.New(rand.NewPCG(3, 4))
	prompts := make([][]int64, 16)
	for i := range prompts {
		p := make([]int64, tokens)
		for j := range p {
			p[j] = int64(rng.IntN(150000))
		}
		prompts[i] = p
	}
	if events {
		// Each rank's view holds four of the prompts, stored as an
		// engine with 16-token pages reports them.
		for i, t := range s.snap.Load().prefill.targets {
			var evs []kvevents.Event
			for k := range 4 {
				p := prompts[(i+k)%len(prompts)]
				ev := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16, TokenIDs: p[:len(p)/16*16]}
				for j := range len(p) / 16 {
					ev.BlockHashes = append(ev.BlockHashes, uint64(i)<<40|uint64((i+k)%len(prompts))<<32|uint64(j))
					if j > 0 {
						ev.ParentHash, ev.HasParent = 0, false
					}
				}
				evs = append(evs, ev)
			}
			tracker.Handler(t.Key()).Apply(0, kvevents.Batch{Events: evs})
		}
	}
	ctx := b.Context()
	req := &Request{}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		*req = Request{ID: "r", TokenIDs: prompts[i%len(prompts)], Blocks: req.Blocks[:0]}
		if _, err := s.Pick(ctx, req); err != nil {
			b.Fatal(err)
		}
		s.Complete(Feedback{RequestID: "r"})
	}
}
