package accesslog

import (
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
)

// traceParent is a sampled W3C traceparent.
const traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// withHeader returns h with one more header.
func withHeader(h map[string]string, k, v string) map[string]string {
	h[k] = v
	return h
}

func TestCompletion(t *testing.T) {
	duetMD := map[string]any{
		"request_id": "r1", "route": "chat", "decode": "127.0.0.2:30001/dp1", "prefill": "127.0.0.1:30001/dp0",
		"prompt_tokens": float64(9), "completion_tokens": float64(8),
	}
	tests := []struct {
		name    string
		logName string
		entry   *accesslogdatav3.HTTPAccessLogEntry
		want    Completion
		ok      bool
	}{
		{"decode leg", "duet_upstream",
			entry("duet_decode", "127.0.0.2", 200, hdr("r1", "1")),
			Completion{RequestID: "r1", ClientRequestID: "client-r1", Leg: LegDecode, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 200, DPRank: 1, Duration: 25 * time.Millisecond}, true},
		{"prefill leg (the mirror's header copy, no metadata)", "duet_upstream",
			entry("duet_prefill", "127.0.0.1", 200, hdr("r1", "0")),
			Completion{RequestID: "r1", ClientRequestID: "client-r1", Leg: LegPrefill, Cluster: "duet_prefill", Upstream: "127.0.0.1:30001",
				Status: 200, DPRank: 0, Duration: 25 * time.Millisecond}, true},
		{"downstream entry with metadata and usage", "duet_downstream",
			entry("duet_decode", "127.0.0.2", 200, hdr("r1", "1"), withMetadata(duetMD)),
			Completion{RequestID: "r1", ClientRequestID: "client-r1", Leg: LegRequest, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 200, DPRank: 1, PromptTokens: 9, CompletionTokens: 8, Duration: 25 * time.Millisecond,
				DecodeTarget: "127.0.0.2:30001/dp1", PrefillTarget: "127.0.0.1:30001/dp0"}, true},
		{"usage as strings, negative and fractional values", "duet_downstream",
			entry("duet_decode", "127.0.0.2", 200, hdr("r1", ""),
				withMetadata(map[string]any{"prompt_tokens": "12", "completion_tokens": float64(-3)})),
			Completion{RequestID: "r1", ClientRequestID: "client-r1", Leg: LegRequest, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 200, DPRank: NoRank, PromptTokens: 12, Duration: 25 * time.Millisecond}, true},
		{"usage of another type is ignored", "duet_downstream",
			entry("duet_decode", "127.0.0.2", 200, hdr("r1", ""),
				withMetadata(map[string]any{"prompt_tokens": true, "completion_tokens": "x", "decode": float64(1)})),
			Completion{RequestID: "r1", ClientRequestID: "client-r1", Leg: LegRequest, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 200, DPRank: NoRank, Duration: 25 * time.Millisecond}, true},
		{"prefill connection failure: no response, UF", "duet_upstream",
			entry("duet_prefill", "127.0.0.1", 0, hdr("r2", "3"),
				withFlags(&accesslogdatav3.ResponseFlags{UpstreamConnectionFailure: true})),
			Completion{RequestID: "r2", ClientRequestID: "client-r2", Leg: LegPrefill, Cluster: "duet_prefill", Upstream: "127.0.0.1:30001",
				DPRank: 3, Failed: true, Unreachable: true, ResponseFlags: "UF", Duration: 25 * time.Millisecond}, true},
		{"reset after connecting is a failure, not unreachable", "duet_upstream",
			entry("duet_decode", "127.0.0.2", 0, hdr("r2", "1"),
				withFlags(&accesslogdatav3.ResponseFlags{UpstreamRemoteReset: true})),
			Completion{RequestID: "r2", ClientRequestID: "client-r2", Leg: LegDecode, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				DPRank: 1, Failed: true, ResponseFlags: "UR", Duration: 25 * time.Millisecond}, true},
		{"engine 500", "duet_upstream",
			entry("duet_decode", "127.0.0.2", 500, hdr("r3", "0")),
			Completion{RequestID: "r3", ClientRequestID: "client-r3", Leg: LegDecode, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 500, DPRank: 0, Failed: true, Duration: 25 * time.Millisecond}, true},
		{"client error is not a failure", "duet_downstream",
			entry("duet_decode", "", 400, hdr("r4", "")),
			Completion{RequestID: "r4", ClientRequestID: "client-r4", Leg: LegRequest, Cluster: "duet_decode", Status: 400, DPRank: NoRank,
				Duration: 25 * time.Millisecond}, true},
		{"client went away mid-stream: 200 but DC", "duet_downstream",
			entry("duet_decode", "127.0.0.2", 200, hdr("r5", "1"),
				withFlags(&accesslogdatav3.ResponseFlags{DownstreamConnectionTermination: true})),
			Completion{RequestID: "r5", ClientRequestID: "client-r5", Leg: LegRequest, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 200, DPRank: 1, Failed: true, ResponseFlags: "DC", Duration: 25 * time.Millisecond}, true},
		{"rate limited is not an engine failure", "duet_downstream",
			entry("duet_decode", "", 429, hdr("r6", ""),
				withFlags(&accesslogdatav3.ResponseFlags{RateLimited: true})),
			Completion{RequestID: "r6", ClientRequestID: "client-r6", Leg: LegRequest, Cluster: "duet_decode", Status: 429, DPRank: NoRank,
				ResponseFlags: "RL", Duration: 25 * time.Millisecond}, true},
		{"no logged headers: Envoy's request id is the client's, no duet id, no rank", "duet_upstream",
			entry("duet_decode", "127.0.0.2", 200, nil, withRequestID("envoy-id")),
			Completion{ClientRequestID: "envoy-id", Leg: LegDecode, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 200, DPRank: NoRank, Duration: 25 * time.Millisecond}, true},
		{"the logged header wins over Envoy's request id", "duet_upstream",
			entry("duet_decode", "127.0.0.2", 200, hdr("r7", "x"), withRequestID("envoy-id")),
			Completion{RequestID: "r7", ClientRequestID: "client-r7", Leg: LegDecode, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 200, DPRank: NoRank, Duration: 25 * time.Millisecond}, true},
		{"no duration: last downstream byte", "duet_downstream",
			entry("duet_decode", "127.0.0.2", 200, hdr("r8", ""), withoutDuration),
			Completion{RequestID: "r8", ClientRequestID: "client-r8", Leg: LegRequest, Cluster: "duet_decode", Upstream: "127.0.0.2:30001",
				Status: 200, DPRank: NoRank, Duration: 7 * time.Millisecond}, true},
		{"traced leg: its traceparent", "duet_upstream",
			entry("duet_prefill", "127.0.0.1", 500, withHeader(hdr("r10", "2"), "traceparent", traceParent)),
			Completion{RequestID: "r10", ClientRequestID: "client-r10", Leg: LegPrefill, Cluster: "duet_prefill", Upstream: "127.0.0.1:30001",
				Status: 500, DPRank: 2, Failed: true, Duration: 25 * time.Millisecond, TraceParent: traceParent}, true},
		{"upstream entry of another cluster", "duet_upstream",
			entry("duet_extproc", "127.0.0.9", 200, hdr("r9", "")), Completion{}, false},
		{"another log", "somebody_else", entry("duet_decode", "127.0.0.2", 200, hdr("r9", "")), Completion{}, false},
		{"no log name (identifier never sent)", "", entry("duet_decode", "127.0.0.2", 200, hdr("r9", "")), Completion{}, false},
		{"empty entry", "duet_upstream", &accesslogdatav3.HTTPAccessLogEntry{}, Completion{}, false},
		{"empty downstream entry", "duet_downstream", &accesslogdatav3.HTTPAccessLogEntry{},
			Completion{Leg: LegRequest, DPRank: NoRank, Failed: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := DefaultClusters.completion(tt.logName, tt.entry)
			if ok != tt.ok || got != tt.want {
				t.Errorf("completion() = %+v, %v\nwant          %+v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestCompletionClusterNames: with the clusters a gateway names itself (here
// as Envoy Gateway names an HTTPRoute's rule and its mirror filter), legs are
// told apart by those names, and the default names are no legs.
func TestCompletionClusterNames(t *testing.T) {
	const egDecode, egPrefill = "httproute/inference/duet/rule/0", "httproute/inference/duet/rule/0-mirror-0"
	eg := Clusters{Decode: egDecode, Prefill: egPrefill}
	tests := []struct {
		name     string
		clusters Clusters
		logName  string
		cluster  string
		leg      Leg
		ok       bool
	}{
		{"gateway decode cluster", eg, "duet_upstream", egDecode, LegDecode, true},
		{"gateway mirror cluster", eg, "duet_upstream", egPrefill, LegPrefill, true},
		{"default decode name under gateway names", eg, "duet_upstream", "duet_decode", "", false},
		{"default prefill name under gateway names", eg, "duet_upstream", "duet_prefill", "", false},
		{"downstream entry whatever the cluster", eg, "duet_downstream", egDecode, LegRequest, true},
		{"gateway name under default names", DefaultClusters, "duet_upstream", egDecode, "", false},
		{"default names", DefaultClusters, "duet_upstream", "duet_prefill", LegPrefill, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.clusters.completion(tt.logName, entry(tt.cluster, "127.0.0.2", 200, hdr("r1", "1")))
			if ok != tt.ok || got.Leg != tt.leg {
				t.Errorf("completion() leg = %q, %v; want %q, %v", got.Leg, ok, tt.leg, tt.ok)
			}
		})
	}
}
