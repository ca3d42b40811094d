package sim

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A PD prefill request waits in its rank's bootstrap queue until its
// decode preallocated the KV: it is not schedulable before, it joins the
// waiting queue in the order requests bootstrap, it observes
// prefill_bootstrap, and the decode_prefix_len it is told on the way is
// what its transfer skips.
func TestEngineBootstrapQueue(t *testing.T) {
	prof, err := LookupProfile("dense-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	fwd := prof.prefillStepTime([]prefillChunk{{tokens: 4000}})
	xfer := prof.transferTime(4000, prof.KVTransferGBps)
	spec := requestSpec{kind: kindPrefill, prompt: 4000, maxNew: 8, bootstrap: true}
	tests := []struct {
		name string
		// run drives the model and returns its requests.
		run  func(t *testing.T, c *engineCore) []*engineRequest
		want []stageRecord
		// wantAdmitted and wantSent are per request.
		wantAdmitted []time.Duration
		wantSent     []int
	}{
		{
			name: "nothing runs until the decode preallocated",
			run: func(t *testing.T, c *engineCore) []*engineRequest {
				q := mustSubmit(t, c, spec, 0)
				c.advance(50 * time.Millisecond)
				snap := c.snapshot(50 * time.Millisecond)[0]
				if q.state != stBootstrap || snap.bootstrap != 1 || snap.waiting != 0 || snap.running != 0 || snap.totalTokens != 4000 {
					t.Fatalf("before the bootstrap: state %v, snapshot %+v; want the bootstrap queue only, its prompt in the total tokens",
						q.state, snap)
				}
				if _, ok := c.nextEvent(); ok {
					t.Fatal("the model has work before the bootstrap")
				}
				c.bootstrapped(q, 0, 50*time.Millisecond)
				c.runUntilIdle()
				return []*engineRequest{q}
			},
			want: []stageRecord{
				{0, latPrefillBootstrap, 50 * time.Millisecond}, {0, latPrefillWaiting, 0},
				{0, latPrefillForward, fwd}, {0, latPrefillTransfer, xfer},
			},
			wantAdmitted: []time.Duration{50 * time.Millisecond},
			wantSent:     []int{4000},
		},
		{
			name: "the decode's prefix is known before the prefill starts",
			run: func(t *testing.T, c *engineCore) []*engineRequest {
				q := mustSubmit(t, c, spec, 0)
				c.bootstrapped(q, 1600, 0)
				c.runUntilIdle()
				return []*engineRequest{q}
			},
			want: []stageRecord{
				{0, latPrefillBootstrap, 0}, {0, latPrefillWaiting, 0},
				{0, latPrefillForward, fwd}, {0, latPrefillTransfer, prof.transferTime(2400, prof.KVTransferGBps)},
			},
			wantAdmitted: []time.Duration{0},
			wantSent:     []int{2400},
		},
		{
			name: "requests queue in the order they bootstrap",
			run: func(t *testing.T, c *engineCore) []*engineRequest {
				a := mustSubmit(t, c, spec, 0)
				b := mustSubmit(t, c, spec, 0)
				c.advance(10 * time.Millisecond)
				c.bootstrapped(b, 0, 10*time.Millisecond)
				c.advance(20 * time.Millisecond)
				c.bootstrapped(a, 0, 20*time.Millisecond)
				c.runUntilIdle()
				return []*engineRequest{a, b}
			},
			want: []stageRecord{
				{0, latPrefillBootstrap, 10 * time.Millisecond}, {0, latPrefillWaiting, 0},
				{0, latPrefillBootstrap, 20 * time.Millisecond},
				{0, latPrefillForward, fwd}, {0, latPrefillWaiting, fwd - 10*time.Millisecond},
				{0, latPrefillTransfer, xfer}, {0, latPrefillForward, fwd}, {0, latPrefillTransfer, xfer},
			},
			wantAdmitted: []time.Duration{10*time.Millisecond + fwd, 10 * time.Millisecond},
			wantSent:     []int{4000, 4000},
		},
		{
			name: "an abort in the bootstrap queue frees it without a stage",
			run: func(t *testing.T, c *engineCore) []*engineRequest {
				q := mustSubmit(t, c, spec, 0)
				c.advance(5 * time.Millisecond)
				c.abort(q, 5*time.Millisecond)
				c.bootstrapped(q, 0, 6*time.Millisecond) // too late: ignored
				c.runUntilIdle()
				if snap := c.snapshot(6 * time.Millisecond)[0]; q.state != stDone || !q.aborted || snap.bootstrap != 0 || snap.totalTokens != 0 {
					t.Fatalf("after the abort: state %v aborted %v, snapshot %+v", q.state, q.aborted, snap)
				}
				return []*engineRequest{q}
			},
			wantAdmitted: []time.Duration{0},
			wantSent:     []int{0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := testCore(t, "dense-8b-h100", ModePrefill, 1, false, nil)
			got := recordStages(c)
			reqs := tc.run(t, c)
			if len(*got) != len(tc.want) {
				t.Fatalf("stages %v, want %v", *got, tc.want)
			}
			for i, g := range *got {
				if g.rank != tc.want[i].rank || g.stage != tc.want[i].stage || !near(g.d, tc.want[i].d) {
					t.Fatalf("stage %d: %v, want %v (all: %v)", i, g, tc.want[i], *got)
				}
			}
			for i, q := range reqs {
				if !near(q.admittedAt, tc.wantAdmitted[i]) || q.sent != tc.wantSent[i] {
					t.Fatalf("request %d: admitted at %v, sent %d; want %v and %d", i, q.admittedAt, q.sent, tc.wantAdmitted[i], tc.wantSent[i])
				}
			}
		})
	}
}

// The Model API: SubmitBootstrap holds a prefill item in ItemBootstrap
// until Bootstrapped; Submit queues it at once.
func TestModelSubmitBootstrap(t *testing.T) {
	m, err := NewModel(Config{Mode: ModePrefill, Profile: "dense-8b-h100"})
	if err != nil {
		t.Fatal(err)
	}
	prompt := Prompt{Tokens: 2000, Blocks: seqBlocks(7, 125)}
	held, err := m.SubmitBootstrap(0, 0, prompt, 4)
	if err != nil {
		t.Fatal(err)
	}
	m.Advance(time.Second)
	if st := m.Ranks(time.Second)[0]; held.State() != ItemBootstrap || st.Bootstrapping != 1 || st.Waiting != 0 || st.Running != 0 {
		t.Fatalf("held item %v, rank %+v; want it in the bootstrap queue alone", held.State(), st)
	}
	m.Bootstrapped(time.Second, held, 400)
	at, ok := m.NextEvent()
	if !ok {
		t.Fatal("nothing to do after the bootstrap")
	}
	m.Advance(at + 10*time.Second)
	if held.State() != ItemDone || held.AdmittedAt() != time.Second || held.TransferredTokens() != 1600 {
		t.Fatalf("bootstrapped item %v admitted at %v sent %d; want done, admitted at 1s, 1600 tokens sent",
			held.State(), held.AdmittedAt(), held.TransferredTokens())
	}
}

// Over HTTP a PD prefill request waits for its decode's preallocation: it
// is reported in the prefill bootstrap queue (SGLang 0.5.23's
// prefill_bootstrap_queue_reqs and sglang:num_prefill_bootstrap_queue_reqs),
// not in the waiting queue, while its decode leg is in the decode's prealloc
// queue, and fails as SGLang's
// prefill does when no decode preallocates before the bootstrap timeout
// or when it is aborted there.
func TestPrefillBootstrapOverHTTP(t *testing.T) {
	const scale = 10
	tests := []struct {
		name             string
		bootstrapTimeout time.Duration // model time
		// blocker holds the decode's KV with a request whose prefill never
		// comes, so the decode cannot preallocate the request under test.
		blocker bool
		// decodeLeg sends the request's decode leg (after its prefill leg).
		decodeLeg bool
		// release ends the wait: "blocker" aborts the blocker (the decode
		// then preallocates), "prefill" aborts the prefill item, "" waits
		// for the bootstrap timeout.
		release     string
		wantStatus  int
		wantMsg     string
		wantRoomErr string
	}{
		{name: "decode KV full: the prefill starts once the decode preallocated", bootstrapTimeout: 100 * time.Second,
			blocker: true, decodeLeg: true, release: "blocker", wantStatus: 200, wantMsg: `"completion_tokens":1`},
		{name: "no decode: fails after the bootstrap timeout", bootstrapTimeout: 10 * time.Second, wantStatus: 500,
			wantMsg: "Prefill bootstrap failed for request rank=0 bootstrap_room=2 with exception " +
				"KVTransferError(bootstrap_room=2): Request 2 timed out after 10.",
			wantRoomErr: "KVTransferError(bootstrap_room=2): Request 2 timed out after 10."},
		{name: "aborted in the bootstrap queue", bootstrapTimeout: 100 * time.Second, release: "prefill", wantStatus: 500,
			wantMsg:     "Prefill bootstrap failed for request rank=0 bootstrap_room=2 with exception Aborted by AbortReq.",
			wantRoomErr: abortReqMsg},
	}
	body := func(host string, port int, room int64, rid string, words, maxTokens int) string {
		b, _ := json.Marshal(map[string]any{
			"messages":       []any{map[string]string{"role": "user", "content": strings.Repeat("word ", words)}},
			"max_tokens":     maxTokens,
			"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room, "rid": rid,
		})
		return string(b)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startTest(t, Config{Mode: ModePrefill, Profile: "dense-8b-h100", TimeScale: scale, BootstrapTimeout: tc.bootstrapTimeout})
			host, port := p.bootHostPort(t)
			d := startTest(t, Config{Mode: ModeDecode, Profile: "dense-8b-h100", TimeScale: scale, BootstrapPort: port,
				KVTimeout: 100 * time.Second, MaxTotalTokens: 1000})
			var bch <-chan response
			if tc.blocker {
				// ~600 prompt tokens + 100 output of the decode's 1000.
				bch = background(t, d.api.URL+"/v1/chat/completions", body(host, port, 1, "blocker", 480, 100))
				eventually(t, "the blocker preallocated", func() bool { return d.sim.snapshot()[0].transfer == 1 })
			}
			const url = "/v1/chat/completions"
			pch := background(t, p.api.URL+url, body(host, port, 2, "req", 480, 8))
			var dch <-chan response
			if tc.decodeLeg {
				dch = background(t, d.api.URL+url, body(host, port, 2, "req-d", 480, 8))
				eventually(t, "the decode leg in the prealloc queue", func() bool { return d.sim.snapshot()[0].waiting == 1 })
			}
			eventually(t, "the prefill item in the bootstrap queue", func() bool { return p.sim.snapshot()[0].bootstrap == 1 })
			var loads loadsBody
			get(t, p.api.URL+"/v1/loads").json(t, &loads)
			l := loads.Loads[0]
			disagg := l["disaggregation"].(map[string]any)
			if l["num_waiting_reqs"] != 0.0 || l["num_running_reqs"] != 0.0 || disagg["prefill_bootstrap_queue_reqs"] != 1.0 ||
				l["num_total_tokens"].(float64) < 480 {
				t.Fatalf("prefill loads while bootstrapping: %v", l)
			}
			fams := scrape(t, p)
			if v := fams["sglang:num_prefill_bootstrap_queue_reqs"].samples; len(v) != 1 || v[0].Value != 1 {
				t.Fatalf("sglang:num_prefill_bootstrap_queue_reqs %v, want 1", v)
			}
			if tc.blocker && tc.decodeLeg {
				checkDecodeQueues(t, d, 1, 1)
			}
			if v := fams["sglang:num_queue_reqs"].samples; len(v) != 1 || v[0].Value != 0 {
				t.Fatalf("sglang:num_queue_reqs %v, want 0: the bootstrap queue is not the waiting queue", v)
			}
			if st := scrapeStages(t, p); len(st) != 0 {
				t.Fatalf("stages observed before the bootstrap: %v", st)
			}
			if tc.release != "" {
				time.Sleep(100 * time.Millisecond) // at least 1 model second in the bootstrap queue
			}
			switch tc.release {
			case "blocker":
				abortRID(t, d, `{"rid":"blocker"}`)
			case "prefill":
				abortRID(t, p, `{"rid":"req"}`)
			}
			r := await(t, pch)
			if r.status != tc.wantStatus || !strings.Contains(string(r.body), tc.wantMsg) {
				t.Fatalf("prefill %d %s, want %d with %q", r.status, r.body, tc.wantStatus, tc.wantMsg)
			}
			if dch != nil {
				if dr := await(t, dch); dr.status != 200 {
					t.Fatalf("decode leg %d %s", dr.status, dr.body)
				}
			}
			stages := scrapeStages(t, p)
			failed := scrape(t, p)["sglang:num_bootstrap_failed_reqs_total"].samples
			if len(failed) != 1 {
				t.Fatalf("sglang:num_bootstrap_failed_reqs_total %v", failed)
			}
			if tc.wantStatus == 200 {
				bs := stages["prefill_bootstrap"]
				if bs.count != 1 || bs.sum < 1 || stages["prefill_waiting"].count != 1 || failed[0].Value != 0 {
					t.Fatalf("stages %v, failed %v; want one prefill_bootstrap of at least 1 model second, no failure", stages, failed)
				}
			} else {
				if _, ok := stages["prefill_bootstrap"]; ok || failed[0].Value != 1 {
					t.Fatalf("stages %v, failed %v; want no prefill_bootstrap and one bootstrap failure", stages, failed)
				}
				var st RoomStatus
				get(t, p.boot.URL+"/sim/kv?room=2").json(t, &st)
				if st.State != RoomFailed || !strings.HasPrefix(st.Error, tc.wantRoomErr) {
					t.Fatalf("room %+v, want failed with %q", st, tc.wantRoomErr)
				}
			}
			if bch != nil {
				if tc.release != "blocker" {
					abortRID(t, d, `{"rid":"blocker"}`)
				}
				await(t, bch)
			}
			idle(t, p.sim)
			idle(t, d.sim)
		})
	}
}

// A decode tells its prefill that it preallocated even without the
// decode radix cache (decode_prefix_len 0), on both models; a fake
// bootstrap host (health checks) skips the bootstrap queue.
func TestDecodeSendsBootstrap(t *testing.T) {
	tests := []struct {
		name    string
		profile string
	}{
		{name: "simple model"},
		{name: "engine model", profile: "dense-8b-h100"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startTest(t, Config{Mode: ModePrefill, Profile: tc.profile, AwaitTransfer: true, BootstrapTimeout: 5 * time.Second})
			host, port := p.bootHostPort(t)
			d := startTest(t, Config{Mode: ModeDecode, Profile: tc.profile, BootstrapPort: port, KVTimeout: 5 * time.Second})
			const url = "/v1/chat/completions"
			pch := background(t, p.api.URL+url, pdBody(host, port, 9, ""))
			eventually(t, "the prefill item in flight", func() bool { return len(p.sim.Stats().InFlight) == 1 })
			time.Sleep(50 * time.Millisecond)
			var st RoomStatus
			get(t, p.boot.URL+"/sim/kv?room=9").json(t, &st)
			if l := p.sim.snapshot()[0]; st.State != RoomPending || l.running != 0 || l.waiting != 0 {
				t.Fatalf("before its decode came: room %+v, load %+v; want pending and nothing scheduled", st, l)
			}
			dr := post(t, d.api.URL+url, pdBody(host, port, 9, ""))
			if pr := await(t, pch); pr.status != 200 || dr.status != 200 {
				t.Fatalf("prefill %d %s, decode %d %s", pr.status, pr.body, dr.status, dr.body)
			}
			fake := fmt.Sprintf(`{"text":"hi","sampling_params":{"max_new_tokens":1},"bootstrap_host":%q,"bootstrap_room":0}`, fakeBootstrapHost)
			if r := post(t, p.api.URL+"/generate", fake); r.status != 200 {
				t.Fatalf("fake bootstrap host: %d %s", r.status, r.body)
			}
		})
	}
}

// checkDecodeQueues fails t unless decode d reports prealloc requests in its
// prealloc queue and transfer in its transfer queue, in /v1/loads and in
// /metrics, under SGLang 0.5.23's names.
func checkDecodeQueues(t *testing.T, d *testServer, prealloc, transfer float64) {
	t.Helper()
	var loads loadsBody
	get(t, d.api.URL+"/v1/loads").json(t, &loads)
	disagg := loads.Loads[0]["disaggregation"].(map[string]any)
	if disagg["decode_prealloc_queue_reqs"] != prealloc || disagg["decode_transfer_queue_reqs"] != transfer {
		t.Fatalf("decode disaggregation %v, want %v in the prealloc queue and %v in the transfer queue", disagg, prealloc, transfer)
	}
	fams := scrape(t, d)
	for name, want := range map[string]float64{
		"sglang:num_decode_prealloc_queue_reqs": prealloc, "sglang:num_decode_transfer_queue_reqs": transfer,
	} {
		if v := fams[name].samples; len(v) != 1 || float64(v[0].Value) != want {
			t.Fatalf("%s %v, want %v", name, v, want)
		}
	}
}
