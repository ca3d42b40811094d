package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

func TestRequestBody(t *testing.T) {
	for _, c := range []loadCase{
		{bodyBytes: 1 << 10, api: apiChat}, {bodyBytes: 32 << 10, api: apiChat, stream: true},
		{bodyBytes: 256 << 10, api: apiGenerate}, {bodyBytes: 10, api: apiGenerate, stream: true},
	} {
		b, at := requestBody(c)
		if c.bodyBytes >= 200 && len(b) != c.bodyBytes {
			t.Errorf("%v: %d bytes", c, len(b))
		}
		var req struct {
			MaxTokens      int  `json:"max_tokens"`
			Stream         bool `json:"stream"`
			SamplingParams struct {
				MaxNewTokens int `json:"max_new_tokens"`
			} `json:"sampling_params"`
			Text     string `json:"text"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(b, &req); err != nil {
			t.Fatalf("%v: not JSON: %v", c, err)
		}
		prompt := req.Text
		if c.api == apiChat {
			if req.MaxTokens != 1 || len(req.Messages) != 1 {
				t.Fatalf("%v: %+v", c, req)
			}
			prompt = req.Messages[0].Content
		} else if req.SamplingParams.MaxNewTokens != 1 {
			t.Errorf("%v: %+v", c, req)
		}
		if req.Stream != c.stream || !strings.HasPrefix(string(b[at:]), prompt[:counterDigits]) {
			t.Errorf("%v: stream %t, prompt at %d: %.20q", c, req.Stream, at, b[at:])
		}
	}
}

func TestDistinctBodies(t *testing.T) {
	c := loadCase{bodyBytes: 1 << 10, api: apiChat, rate: 1}
	body, at := requestBody(c)
	next := distinct("http://x", c, body, at)
	seen := map[string]bool{}
	for i := range 3 {
		var tgt vegeta.Target
		if err := next(&tgt); err != nil {
			t.Fatal(err)
		}
		if !json.Valid(tgt.Body) || len(tgt.Body) != len(body) || tgt.URL != "http://x/v1/chat/completions" {
			t.Fatalf("request %d: %d bytes to %s: %.80s", i, len(tgt.Body), tgt.URL, tgt.Body)
		}
		prompt := string(tgt.Body[at : at+counterDigits])
		if want := fmt.Sprintf("%012d", i+1); prompt != want || seen[prompt] {
			t.Errorf("request %d starts its prompt with %q, want %q", i, prompt, want)
		}
		seen[prompt] = true
	}
}

func TestSummarize(t *testing.T) {
	var lat []float64
	for i := 1; i <= 1000; i++ {
		lat = append(lat, float64(1001-i)) // unsorted: 1000 .. 1 ms
	}
	st := summarize(sample{latencies: lat, ok: 990, codes: map[int]int{503: 6, 0: 4},
		sendSpan: 1998 * time.Millisecond, wall: 2 * time.Second, loadBusy: 0.5, serverBusy: -1})
	near := func(got, want float64) bool { return got > want-0.01 && got < want+0.01 }
	if !near(st.P50, 500.5) || !near(st.P90, 900.1) || !near(st.P99, 990.01) || !near(st.P999, 999.001) {
		t.Errorf("percentiles %+v", st)
	}
	if st.Sent != 1000 || !near(st.Rate, 500) || st.Throughput != 495 || st.Errors != 10 || st.Codes != "err×4 503×6" ||
		st.LoadCPU != 0.5 || st.ServerCPU != -1 {
		t.Errorf("counts %+v", st)
	}
	if empty := summarize(sample{}); empty.Rate != 0 || empty.P99 != 0 || empty.Codes != "" {
		t.Errorf("empty sample: %+v", empty)
	}
}

func TestLoadCaseString(t *testing.T) {
	if got := (loadCase{bodyBytes: 32 << 10, rate: 200}).String(); got != "32 KiB, 200 rps" {
		t.Error(got)
	}
	if got := (loadCase{bodyBytes: 1 << 10, workers: 20}).String(); got != "1 KiB, concurrency 20" {
		t.Error(got)
	}
	if got := (loadCase{bodyBytes: 32 << 10, api: apiGenerate, stream: true, rate: 500}).String(); got != "32 KiB /generate streamed, 500 rps" {
		t.Error(got)
	}
}
