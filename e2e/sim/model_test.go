package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// words returns n tokens of distinct text (4 characters per token).
func words(seed, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%c%c%c ", 'a'+(seed+i)%26, 'a'+(seed/26+i/26)%26, 'a'+(i/676)%26)
	}
	return b.String()
}

// chatBody is a chat request with the given messages content and options.
func chatBody(system, user string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model": "sim-model",
		"messages": []any{
			map[string]string{"role": "system", "content": system},
			map[string]string{"role": "user", "content": user},
		},
		"max_tokens":     maxTokens,
		"stream":         stream,
		"stream_options": map[string]bool{"include_usage": true},
	})
	return string(b)
}

// streamed is a finished streaming exchange with event arrival times.
type streamed struct {
	status int
	sent   time.Time       // when the request was sent
	times  []time.Duration // since the request was sent, per data event
	events []string
}

// tokenTimes returns the arrival times of the events carrying content.
func (s streamed) tokenTimes() []time.Duration {
	var out []time.Duration
	for i, ev := range s.events {
		if strings.Contains(ev, `"content":"`) && !strings.Contains(ev, `"content":""`) {
			out = append(out, s.times[i])
		}
	}
	return out
}

// streamPost sends body and timestamps every SSE data event.
func streamPost(ctx context.Context, t *testing.T, url, body string, headers ...string) streamed {
	t.Helper()
	req := newPost(ctx, t, url, body, headers...)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return streamed{}
		}
		t.Errorf("POST %s: %v", url, err)
		return streamed{}
	}
	defer resp.Body.Close()
	out := streamed{status: resp.StatusCode, sent: start}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out.times = append(out.times, time.Since(start))
			out.events = append(out.events, data)
		}
	}
	return out
}

// loadsOf fetches /v1/loads.
func loadsOf(t *testing.T, ts *testServer) loadsBody {
	t.Helper()
	var b loadsBody
	get(t, ts.api.URL+"/v1/loads").json(t, &b)
	return b
}

func TestTimeScaleDividesLatency(t *testing.T) {
	simple := func(scale float64) time.Duration {
		ts := startTest(t, Config{DecodePerToken: 20 * time.Millisecond, TimeScale: scale})
		start := time.Now()
		if r := post(t, ts.api.URL+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":10}}`); r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
		return time.Since(start)
	}
	// 10 tokens × 20 ms = 200 ms of model time.
	if d := simple(1); d < 200*time.Millisecond {
		t.Fatalf("scale 1 took %v, want >= 200ms", d)
	}
	if d := simple(20); d > 100*time.Millisecond {
		t.Fatalf("scale 20 took %v, want about 10ms", d)
	}

	// Engine model: a cold 4096-token prompt has a model TTFT of ≈ 237 ms.
	model := func(scale float64) time.Duration {
		ts := startTest(t, Config{Profile: "dense-8b-h100", TimeScale: scale})
		start := time.Now()
		if r := post(t, ts.api.URL+"/v1/completions", `{"prompt":"`+words(1, 4096)+`","max_tokens":1}`); r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
		return time.Since(start)
	}
	if d := model(1); d < 236*time.Millisecond {
		t.Fatalf("model at scale 1 took %v, want >= 236ms", d)
	}
	if d := model(10); d > 150*time.Millisecond || d < 23*time.Millisecond {
		t.Fatalf("model at scale 10 took %v, want about 24ms", d)
	}
}

func TestModelStreamsOneTokenPerStep(t *testing.T) {
	const scale = 5
	ts := startTest(t, Config{Profile: "dense-8b-h100", TimeScale: scale})
	s := streamPost(context.Background(), t, ts.api.URL+"/v1/chat/completions", chatBody("", words(3, 4096), 50, true))
	tok := s.tokenTimes()
	if s.status != 200 || len(tok) != 50 {
		t.Fatalf("status %d, %d token events", s.status, len(tok))
	}
	// Model TTFT ≈ 237 ms (prefill formula), TPOT ≈ 7.35 ms (decode
	// formula at batch 1 and ~4.1k context). Wall × scale is model time
	// plus unscaled overheads, so only the order of magnitude is checked.
	ttft := tok[0] * scale
	tpot := (tok[len(tok)-1] - tok[0]) * scale / time.Duration(len(tok)-1)
	t.Logf("model TTFT %v, TPOT %v", ttft, tpot)
	if ttft < 230*time.Millisecond || ttft > 800*time.Millisecond {
		t.Fatalf("model TTFT %v, want ≈ 237ms", ttft)
	}
	if tpot < 6*time.Millisecond || tpot > 30*time.Millisecond {
		t.Fatalf("model TPOT %v, want ≈ 7.4ms", tpot)
	}
	var usage usageBody
	if err := json.Unmarshal([]byte(s.events[len(s.events)-2]), &usage); err != nil || usage.Usage.Prompt != 4096 {
		t.Fatalf("usage frame %s: %v", s.events[len(s.events)-2], err)
	}
}

func TestModelQueueingShowsInTTFT(t *testing.T) {
	// One request slot per rank: six simultaneous requests queue, and the
	// later ones wait for the earlier ones to finish (each holds the slot
	// for ≈ 115 ms of prefill + 39 × 7.2 ms of decode ≈ 0.4 s).
	const scale = 5
	ts := startTest(t, Config{Profile: "dense-8b-h100", TimeScale: scale, MaxRunningRequests: 1})
	var wg sync.WaitGroup
	ttfts := make([]time.Duration, 6)
	for i := range ttfts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := streamPost(context.Background(), t, ts.api.URL+"/v1/chat/completions", chatBody("", words(i*1000, 2000), 40, true))
			if tok := s.tokenTimes(); s.status == 200 && len(tok) == 40 {
				ttfts[i] = tok[0] * scale
			}
		}()
	}
	wg.Wait()
	slices.Sort(ttfts)
	t.Logf("model TTFTs %v", ttfts)
	if ttfts[0] == 0 || ttfts[5] < 3*ttfts[0] {
		t.Fatalf("model TTFTs %v: queueing should make the last much slower than the first", ttfts)
	}
}

func TestModelPrefixCacheHTTP(t *testing.T) {
	ts := startTest(t, Config{Profile: "dense-8b-h100", DPSize: 2, TimeScale: 20})
	system := words(5, 3000)
	cached := func(rank, user string) int {
		r := post(t, ts.api.URL+"/v1/chat/completions", chatBody(system, user, 2, false), "X-Data-Parallel-Rank", rank)
		var b usageBody
		r.json(t, &b)
		if r.status != 200 || b.Usage.Prompt < 3000 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return b.Usage.Details.Cached
	}
	if c := cached("1", "first question"); c != 0 {
		t.Fatalf("cold request cached %d", c)
	}
	// Same system prompt, another question: the system prompt's whole
	// blocks hit (3000 tokens = 187 blocks of 16 = 2992 tokens).
	if c := cached("1", "second question"); c != 2992 {
		t.Fatalf("warm request cached %d, want 2992", c)
	}
	if c := cached("0", "third question"); c != 0 {
		t.Fatalf("other rank cached %d: the cache is per rank", c)
	}
	l := loadsOf(t, ts)
	if hr := l.Loads[1]["cache_hit_rate"].(float64); hr < 0.99 {
		t.Fatalf("rank 1 cache_hit_rate %v", hr)
	}
	if hr := l.Loads[0]["cache_hit_rate"].(float64); hr != 0 {
		t.Fatalf("rank 0 cache_hit_rate %v", hr)
	}
	fams := scrape(t, ts)
	for _, smp := range fams["sglang:cache_hit_rate"].samples {
		if smp.Metric["dp_rank"] == "1" && smp.Value < 0.99 {
			t.Fatalf("metric %v", smp)
		}
	}
	// /generate reports it in meta_info.
	r := post(t, ts.api.URL+"/generate", `{"text":"`+words(9, 100)+`","routed_dp_rank":0,"sampling_params":{"max_new_tokens":1}}`)
	r2 := post(t, ts.api.URL+"/generate", `{"text":"`+words(9, 100)+`","routed_dp_rank":0,"sampling_params":{"max_new_tokens":1}}`)
	if !strings.Contains(string(r.body), `"cached_tokens":0`) || !strings.Contains(string(r2.body), `"cached_tokens":96`) {
		t.Fatalf("generate meta_info: %s / %s", r.body, r2.body)
	}
}

func TestModelKVBudgetAndAbortHTTP(t *testing.T) {
	// 3000 KV tokens; each request needs 1000 prompt + 1500 output.
	ts := startTest(t, Config{Profile: "dense-8b-h100", TimeScale: 10, MaxTotalTokens: 3000})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			streamPost(ctx, t, ts.api.URL+"/v1/chat/completions", chatBody("", words(i*77, 1000), 1500, true))
		}()
	}
	var l loadsBody
	eventually(t, "one running, one waiting", func() bool {
		l = loadsOf(t, ts)
		return l.Loads[0]["num_running_reqs"] == 1.0 && l.Loads[0]["num_waiting_reqs"] == 1.0
	})
	used := l.Loads[0]["num_used_tokens"].(float64)
	if used < 1000 || l.Loads[0]["num_total_tokens"].(float64) != used+1000 || l.Aggregate["total_waiting_reqs"] != 1.0 {
		t.Fatalf("loads %v aggregate %v", l.Loads[0], l.Aggregate)
	}
	if q := l.Loads[0]["queues"].(map[string]any)["waiting"]; q != 1.0 {
		t.Fatalf("queues %v", q)
	}
	fams := scrape(t, ts)
	if v := fams["sglang:num_queue_reqs"].samples[0].Value; v != 1 {
		t.Fatalf("num_queue_reqs %v", v)
	}
	// Clients disconnect: both requests are aborted and free their KV.
	cancel()
	wg.Wait()
	eventually(t, "KV freed", func() bool {
		l = loadsOf(t, ts)
		return l.Loads[0]["num_running_reqs"] == 0.0 && l.Loads[0]["num_waiting_reqs"] == 0.0 && l.Loads[0]["num_used_tokens"] == 0.0
	})
	eventually(t, "aborts recorded", func() bool {
		recs := ts.sim.Records()
		return len(recs) == 2 && recs[0].Status == statusClientClosed && recs[1].Status == statusClientClosed
	})
}

func TestModelPDAndFailureModes(t *testing.T) {
	const scale = 10
	prefill := startTest(t, Config{Mode: ModePrefill, Profile: "dsv3-dp8-h100-node", DPSize: 2, TimeScale: scale})
	host, port := prefill.bootHostPort(t)
	decode := startTest(t, Config{Mode: ModeDecode, Profile: "dsv3-dp8-h100-node", DPSize: 2, TimeScale: scale,
		BootstrapPort: port, KVTimeout: 3 * time.Second})
	if info := get(t, prefill.api.URL+"/server_info"); !strings.Contains(string(info.body), `"enable_dp_attention":true`) ||
		!strings.Contains(string(info.body), `"sim_profile":"dsv3-dp8-h100-node"`) {
		t.Fatalf("server_info %s", info.body)
	}
	body := func(room int64, maxTokens int, extra string) string {
		b := `{"text":"` + words(int(room), 3000) + `","sampling_params":{"max_new_tokens":` + fmt.Sprint(maxTokens) + `},` +
			`"stream":true,"bootstrap_host":"` + host + `","bootstrap_port":` + fmt.Sprint(port) + `,"bootstrap_room":` + fmt.Sprint(room)
		if extra != "" {
			b += "," + extra
		}
		return b + "}"
	}

	// A full PD request: both legs at once, decode first.
	var wg sync.WaitGroup
	var d streamed
	wg.Add(1)
	go func() {
		defer wg.Done()
		d = streamPost(context.Background(), t, decode.api.URL+"/generate", body(41, 8, ""))
	}()
	time.Sleep(5 * time.Millisecond)
	prefillSent := time.Now()
	p := post(t, prefill.api.URL+"/generate", strings.Replace(body(41, 8, ""), `"stream":true`, `"stream":false`, 1))
	wg.Wait()
	if p.status != 200 || !strings.Contains(string(p.body), `"completion_tokens":1`) {
		t.Fatalf("prefill leg %d %s", p.status, p.body)
	}
	if d.status != 200 || len(d.events) != 9 || !strings.Contains(d.events[7], `"completion_tokens":8`) {
		t.Fatalf("decode leg %d %v", d.status, d.events)
	}
	// The decode's first token comes after the prefill's compute (3000
	// tokens in chunks of 1024 on dsv3 ≈ 0.58 s) and the transfer, counted
	// from when the prefill leg was sent: the decode leg's own send time
	// can fall after it when its goroutine starts late on a busy machine.
	t.Logf("PD decode model TTFT %v", d.times[0]*scale)
	if first := d.sent.Add(d.times[0]).Sub(prefillSent) * scale; first < 580*time.Millisecond {
		t.Fatalf("decode first token %v (model) after the prefill leg was sent, want after the prefill's compute", first)
	}
	var pl loadsBody
	get(t, prefill.api.URL+"/v1/loads").json(t, &pl)
	disagg := pl.Loads[1]["disaggregation"].(map[string]any)
	if disagg["kv_transfer_latency_ms"].(float64) <= 1 || disagg["kv_transfer_speed_gb_s"].(float64) <= 0 {
		t.Fatalf("prefill rank 1 (room 41 %% 2) disaggregation %v", disagg)
	}

	tests := []struct {
		name     string
		srv      *testServer
		body     string
		headers  []string
		wantCode int
		wantMsg  string
	}{
		{name: "missing room", srv: prefill, body: `{"text":"hi","sampling_params":{"max_new_tokens":1}}`,
			wantCode: 400, wantMsg: missingRoomMsg},
		{name: "rank out of range", srv: decode, body: strings.Replace(body(50, 2, `"routed_dp_rank":5`), `"stream":true`, `"stream":false`, 1),
			wantCode: 400, wantMsg: "routed_dp_rank=5 out of range [0, 2)"},
		{name: "follow_bootstrap_room conflict", srv: prefill, body: strings.Replace(body(51, 1, `"routed_dp_rank":0`), `"stream":true`, `"stream":false`, 1),
			wantCode: 500, wantMsg: "follow_bootstrap_room conflict"},
		{name: "decode waits in vain (model-time message)", srv: decode, body: strings.Replace(body(52, 2, ""), `"stream":true`, `"stream":false`, 1),
			wantCode: 500, wantMsg: "Request 52 timed out after 3."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, tc.srv.api.URL+"/generate", tc.body, tc.headers...)
			if r.status != tc.wantCode || !strings.Contains(string(r.body), tc.wantMsg) {
				t.Fatalf("got %d %s, want %d with %q", r.status, r.body, tc.wantCode, tc.wantMsg)
			}
		})
	}
	// Nothing is left behind on either server.
	eventually(t, "engines idle", func() bool {
		for _, ts := range []*testServer{prefill, decode} {
			for _, l := range loadsOf(t, ts).Loads {
				if l["num_used_tokens"] != 0.0 || l["num_running_reqs"] != 0.0 {
					return false
				}
			}
		}
		return true
	})
}

// usageBody is the usage part of an OpenAI response, with cached tokens.
type usageBody struct {
	Usage struct {
		Prompt  int `json:"prompt_tokens"`
		Details struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}
