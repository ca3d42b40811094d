package main

import (
	"encoding/json"
	"testing"
	"time"
)

func TestChatBody(t *testing.T) {
	for _, size := range []int{1 << 10, 32 << 10, 256 << 10, 10} {
		b := chatBody(size)
		if size >= 200 && len(b) != size {
			t.Errorf("chatBody(%d) is %d bytes", size, len(b))
		}
		var req struct {
			MaxTokens int `json:"max_tokens"`
			Messages  []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(b, &req); err != nil {
			t.Fatalf("chatBody(%d) is not JSON: %v", size, err)
		}
		if req.MaxTokens != 1 || len(req.Messages) != 1 {
			t.Errorf("chatBody(%d) = %+v", size, req)
		}
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
}
