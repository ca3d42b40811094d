package sim

import (
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
)

// stageRecord is one observed stage latency.
type stageRecord struct {
	rank  int
	stage latencyStage
	d     time.Duration
}

// recordStages makes c report its stage latencies into the returned list.
func recordStages(c *engineCore) *[]stageRecord {
	var out []stageRecord
	c.stages = func(rank int, stage latencyStage, d time.Duration) {
		out = append(out, stageRecord{rank, stage, d})
	}
	return &out
}

// The engine model observes each stage once per request, at the model
// times its state changes.
func TestEngineStageLatencies(t *testing.T) {
	prof, err := LookupProfile("dense-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	fwd := prof.prefillStepTime([]prefillChunk{{tokens: 4000}})
	xfer := prof.transferTime(4000, prof.KVTransferGBps)
	tests := []struct {
		name string
		run  func(t *testing.T) []stageRecord
		want []stageRecord
	}{
		{
			name: "aggregated: the second request waits for the first's prefill",
			run: func(t *testing.T) []stageRecord {
				c := testCore(t, "dense-8b-h100", ModeNull, 1, false, func(p *engineParams) { p.chunk = 4000 })
				got := recordStages(c)
				mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 4000, maxNew: 2}, 0)
				mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 4000, maxNew: 2, blocks: seqBlocks(1, 250)}, time.Millisecond)
				c.runUntilIdle()
				return *got
			},
			want: []stageRecord{
				{0, latPrefillWaiting, 0}, {0, latPrefillForward, fwd},
				{0, latPrefillWaiting, fwd - time.Millisecond}, {0, latPrefillForward, fwd},
			},
		},
		{
			name: "PD prefill on rank 1: waiting, forward, transfer",
			run: func(t *testing.T) []stageRecord {
				c := testCore(t, "dense-8b-h100", ModePrefill, 2, false, nil)
				got := recordStages(c)
				mustSubmit(t, c, requestSpec{kind: kindPrefill, rank: 1, prompt: 4000, maxNew: 50}, 0)
				c.runUntilIdle()
				return *got
			},
			want: []stageRecord{{1, latPrefillWaiting, 0}, {1, latPrefillForward, fwd}, {1, latPrefillTransfer, xfer}},
		},
		{
			name: "PD decode: the second waits in the prealloc queue for the first to finish",
			run: func(t *testing.T) []stageRecord {
				c := testCore(t, "dense-8b-h100", ModeDecode, 1, false, func(p *engineParams) { p.capacity = 5000 })
				got := recordStages(c)
				a := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: 3000, maxNew: 1}, 0)
				b := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: 3000, maxNew: 1}, 0)
				c.advance(100 * time.Millisecond)
				c.kvArrived(a, 100*time.Millisecond)
				c.runUntilIdle()
				c.advance(300 * time.Millisecond)
				c.kvArrived(b, 300*time.Millisecond)
				c.runUntilIdle()
				return *got
			},
			want: []stageRecord{
				{0, latDecodeBootstrap, 0}, {0, latDecodeTransferred, 100 * time.Millisecond}, {0, latDecodeWaiting, 0},
				{0, latDecodeBootstrap, 100 * time.Millisecond}, {0, latDecodeTransferred, 200 * time.Millisecond},
				{0, latDecodeWaiting, 0},
			},
		},
		{
			name: "an aborted request observes only the stages it finished",
			run: func(t *testing.T) []stageRecord {
				c := testCore(t, "dense-8b-h100", ModePrefill, 1, false, nil)
				got := recordStages(c)
				q := mustSubmit(t, c, requestSpec{kind: kindPrefill, prompt: 4000, maxNew: 1}, 0)
				c.advance(fwd / 2)
				c.abort(q, fwd/2)
				c.runUntilIdle()
				return *got
			},
			want: []stageRecord{{0, latPrefillWaiting, 0}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.run(t)
			if len(got) != len(tc.want) {
				t.Fatalf("stages %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i].rank != tc.want[i].rank || got[i].stage != tc.want[i].stage || !near(got[i].d, tc.want[i].d) {
					t.Fatalf("stage %d: %v, want %v (all: %v)", i, got[i], tc.want[i], got)
				}
			}
		})
	}
}

// stageSeries is one engine's per-stage histogram, by stage.
type stageSeries map[string]struct {
	count, sum float64
	labels     model.Metric
}

// scrapeStages reads sglang:per_stage_req_latency_seconds from ts.
func scrapeStages(t *testing.T, ts *testServer) stageSeries {
	t.Helper()
	out := stageSeries{}
	fams := scrape(t, ts)
	for _, suffix := range []string{"_count", "_sum"} {
		for _, smp := range fams["sglang:per_stage_req_latency_seconds"].samples {
			name := string(smp.Metric[model.MetricNameLabel])
			if !strings.HasSuffix(name, suffix) {
				continue
			}
			stage := string(smp.Metric["stage"])
			e := out[stage]
			if suffix == "_count" {
				e.count = float64(smp.Value)
			} else {
				e.sum = float64(smp.Value)
			}
			e.labels = smp.Metric
			out[stage] = e
		}
	}
	return out
}

// A PD request through a prefill and a decode on the engine model: each
// server exports one observation per stage it models, in model seconds,
// labelled as its other scheduler metrics; each server's stages add up to
// no more than the request's TTFT in model time.
func TestPerStageHistogramOverHTTP(t *testing.T) {
	const scale = 20
	p := startTest(t, Config{Mode: ModePrefill, Profile: "dense-8b-h100", TimeScale: scale, DPSize: 2, Model: "m-x"})
	host, port := p.bootHostPort(t)
	d := startTest(t, Config{Mode: ModeDecode, Profile: "dense-8b-h100", TimeScale: scale, BootstrapPort: port, KVTimeout: 100 * time.Second})
	if got := scrapeStages(t, p); len(got) != 0 {
		t.Fatalf("stages before any request: %v", got)
	}
	prompt := strings.Repeat("a prompt long enough to take a while to prefill ", 400)
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":4,"stream":true,`+
		`"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":7}`, prompt, host, port)
	start := time.Now()
	done := make(chan response, 1)
	go func() { done <- post(t, p.api.URL+"/v1/chat/completions", body) }()
	req := newPost(t.Context(), t, d.api.URL+"/v1/chat/completions", body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 1)); err != nil {
		t.Fatalf("first byte: %v", err)
	}
	ttft := time.Since(start) * scale
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("read the stream: %v", err)
	}
	if r := <-done; r.status != 200 {
		t.Fatalf("prefill %d: %s", r.status, r.body)
	}

	tests := []struct {
		name   string
		ts     *testServer
		stages []string
		labels model.Metric
	}{
		{name: "prefill", ts: p, stages: []string{"prefill_bootstrap", "prefill_forward", "prefill_transfer_kv_cache", "prefill_waiting"},
			labels: model.Metric{"engine_type": "prefill", "model_name": "m-x", "dp_rank": "1", "tp_rank": "0", "pp_rank": "0"}},
		{name: "decode", ts: d, stages: []string{"decode_bootstrap", "decode_transferred", "decode_waiting"},
			labels: model.Metric{"engine_type": "decode", "model_name": "sim-model", "tp_rank": "0", "pp_rank": "0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got stageSeries
			eventually(t, "every stage observed", func() bool {
				got = scrapeStages(t, tc.ts)
				return len(got) == len(tc.stages)
			})
			total := 0.0
			for _, stage := range slices.Sorted(maps.Keys(got)) {
				if !slices.Contains(tc.stages, stage) {
					t.Fatalf("stage %q observed; want only %v", stage, tc.stages)
				}
				e := got[stage]
				if e.count != 1 || e.sum < 0 || math.IsNaN(e.sum) {
					t.Fatalf("%s: count %v sum %v, want one observation", stage, e.count, e.sum)
				}
				for k, v := range tc.labels {
					if e.labels[k] != v {
						t.Fatalf("%s: labels %v, want %v", stage, e.labels, tc.labels)
					}
				}
				if _, ok := e.labels["dp_rank"]; ok != (tc.labels["dp_rank"] != "") {
					t.Fatalf("%s: labels %v, dp_rank only with dp > 1", stage, e.labels)
				}
				total += e.sum
			}
			if fwd := got["prefill_forward"].sum; tc.name == "prefill" && fwd < 0.1 {
				t.Fatalf("prefill_forward %.3fs: a ~4.8k-token prompt takes > 0.1 model seconds", fwd)
			}
			t.Logf("%s stages add up to %.3fs; TTFT %.3fs (model)", tc.name, total, ttft.Seconds())
			if total <= 0 || total > ttft.Seconds() {
				t.Fatalf("stages add up to %.3fs, want (0, TTFT %.3fs]", total, ttft.Seconds())
			}
		})
	}
}
