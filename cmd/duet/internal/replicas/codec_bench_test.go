package replicas

import (
	"encoding/json"
	"testing"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/routed"
	"github.com/duet-router/duet/scheduler"
)

// requestEvents are the events one routed PD request of a 32 KiB prompt
// makes (64 prefix blocks): its pick, its route, and its three entries.
func requestEvents() []*envelope {
	blocks := make([]uint64, 64)
	for i := range blocks {
		blocks[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	key := func(u string, r int) scheduler.TargetKey { return scheduler.TargetKey{URL: u, Rank: r} }
	p := scheduler.Picked{RequestID: "6f1c2a34-1c2b-4d5e-8f90-123456789abc", Model: "deepseek-v3", PromptBytes: 32768,
		Holds: []scheduler.PickedHold{
			{Role: scheduler.RolePrefill, Target: key("http://10.0.0.11:30000", 3), Tokens: 8192, Work: 6000},
			{Role: scheduler.RoleDecode, Target: key("http://10.0.0.21:30000", 5), Tokens: 9216, Work: 9216},
		},
		Blocks: blocks, Indexed: []scheduler.TargetKey{key("http://10.0.0.11:30000", 3)}}
	r := routedEvent{ID: p.RequestID, Route: routed.Route{Decode: "10.0.0.21:30000", DecodeFallback: "10.0.0.22:30000", DecodeRank: 5, Prefill: "10.0.0.11:30000", PrefillRank: 3}}
	leg := func(l accesslog.Leg) *accesslog.Completion {
		return &accesslog.Completion{RequestID: p.RequestID, ClientRequestID: "client-1", Leg: l, Cluster: "duet_decode", Upstream: "10.0.0.21:30000",
			Status: 200, DPRank: 5, PromptTokens: 8000, CompletionTokens: 200, DecodeTarget: "10.0.0.21:30000/dp5", PrefillTarget: "10.0.0.11:30000/dp3"}
	}
	return []*envelope{{From: "duet-0", At: 1, Picked: wirePicked(p)}, {From: "duet-0", At: 1, Routed: &r},
		{From: "duet-0", At: 1, Leg: leg(accesslog.LegPrefill)}, {From: "duet-0", At: 1, Leg: leg(accesslog.LegDecode)}, {From: "duet-0", At: 1, Leg: leg(accesslog.LegRequest)}}
}

// BenchmarkEncodeRequest is a replica's cost to publish one request's
// events; BenchmarkDecodeRequest each peer's cost to read them.
func BenchmarkEncodeRequest(b *testing.B) {
	evs := requestEvents()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for _, e := range evs {
			data, err := json.Marshal(e)
			if err != nil {
				b.Fatal(err)
			}
			n += len(data)
		}
	}
	b.ReportMetric(float64(n)/float64(b.N), "bytes/req")
}

func BenchmarkDecodeRequest(b *testing.B) {
	var msgs [][]byte
	for _, e := range requestEvents() {
		data, err := json.Marshal(e)
		if err != nil {
			b.Fatal(err)
		}
		msgs = append(msgs, data)
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range msgs {
			var e envelope
			if err := json.Unmarshal(m, &e); err != nil {
				b.Fatal(err)
			}
			if e.Picked != nil {
				if _, ok := e.Picked.picked(); !ok {
					b.Fatal("malformed blocks")
				}
			}
		}
	}
}
