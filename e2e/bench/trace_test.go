package bench

import (
	"bytes"
	"compress/gzip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// sharedTrace is the trace in the workspace's shared folder (not in the
// repository).
const sharedTrace = "../../../shared/traces/mooncake-synthetic.jsonl.gz"

func TestReadTrace(t *testing.T) {
	plain := "{\"timestamp\": 5, \"input_length\": 700, \"output_length\": 3, \"hash_ids\": [1, 2]}\n\n" +
		"{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 9, \"hash_ids\": [1, 3]}\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(plain))
	zw.Close()
	tests := []struct {
		name    string
		in      []byte
		wantErr string
		want    []int64 // timestamps, sorted
	}{
		{"plain", []byte(plain), "", []int64{0, 5}},
		{"gzip", gz.Bytes(), "", []int64{0, 5}},
		{"malformed line", []byte(plain + "{oops\n"), "line 4", nil},
		{"zero-length prompt", []byte(`{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}`), "line 1", nil},
		{"empty", nil, "no records", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := ReadTrace(bytes.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, r := range recs {
				got = append(got, r.Timestamp)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("timestamps %v, want %v", got, tt.want)
			}
		})
	}
}

// TestTraceWorkloadSharesPrefixes checks that equal leading hash ids give
// byte-equal prompt prefixes of exactly that many blocks, that lengths,
// caps, compression and offsets hold.
func TestTraceWorkloadSharesPrefixes(t *testing.T) {
	recs := []TraceRecord{
		{Timestamp: 0, InputLength: 1200, OutputLength: 7, HashIDs: []int64{10, 11, 12}},
		{Timestamp: 2000, InputLength: 1100, OutputLength: 0, HashIDs: []int64{10, 11, 13}},
		{Timestamp: 4000, InputLength: 3000, OutputLength: 5, HashIDs: []int64{10, 14}},
	}
	w, err := TraceWorkload("t", recs, TraceOptions{Speedup: 2, MaxPromptTokens: 2000})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 3 {
		t.Fatalf("%d sessions, want 3", len(w.Sessions))
	}
	p := func(i int) string { return w.Sessions[i].Turns[0].User }
	for i, want := range []int{1200, 1100, 2000} {
		if got := len(p(i)); got != want*charsPerToken || w.Sessions[i].Turns[0].PromptTokens != want {
			t.Errorf("prompt %d: %d bytes, %d tokens; want %d tokens", i, got, w.Sessions[i].Turns[0].PromptTokens, want)
		}
	}
	common := func(a, b string) int {
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		return n
	}
	// Two shared blocks (512 tokens each), then different text (a random
	// three-letter word can match for a few bytes by chance).
	if n := common(p(0), p(1)); n < 1024*charsPerToken || n > 1024*charsPerToken+8 {
		t.Errorf("prompts 0 and 1 share %d bytes, want 2 blocks (%d)", n, 1024*charsPerToken)
	}
	if n := common(p(0), p(2)); n < 512*charsPerToken || n > 512*charsPerToken+8 {
		t.Errorf("prompts 0 and 2 share %d bytes, want 1 block", n)
	}
	if got := w.Sessions[2].Start; got != 2*time.Second {
		t.Errorf("third arrival at %v, want 2s (4s compressed 2x)", got)
	}
	if w.Sessions[1].Turns[0].OutputTokens != 1 {
		t.Errorf("zero output not raised to 1")
	}
	// An offset past the first record, wrapping over a window longer than
	// the rest of the trace.
	w, err = TraceWorkload("t", recs, TraceOptions{Offset: 3 * time.Second, Window: 6 * time.Second, Wrap: true})
	if err != nil {
		t.Fatal(err)
	}
	var starts []time.Duration
	for _, s := range w.Sessions {
		starts = append(starts, s.Start)
	}
	// The trace spans 4.001 s: the last record at 1 s, then the next lap
	// from 1.001 s, and the third lap's first record at 5.002 s.
	ms := time.Millisecond
	want := []time.Duration{1000 * ms, 1001 * ms, 3001 * ms, 5001 * ms, 5002 * ms}
	if !slices.Equal(starts, want) {
		t.Errorf("wrapped starts %v, want %v", starts, want)
	}
}

// TestProductionTraceShape checks the generated trace against the
// published production statistics it is built to match, and determinism.
func TestProductionTraceShape(t *testing.T) {
	recs := GenerateProductionTrace(3, 30*time.Minute, 1, ProductionParams{})
	s := TraceStats(recs)
	if s.PromptP50 < 6300 || s.PromptP50 > 7700 || s.PromptP90 < 24000 || s.PromptP90 > 30000 {
		t.Errorf("prompt p50 %d, p90 %d; want about 7k and 27k", s.PromptP50, s.PromptP90)
	}
	if s.Rate < 2.5 || s.Rate > 3.5 {
		t.Errorf("rate %.2f/s, want about 3", s.Rate)
	}
	for _, r := range recs {
		if len(r.HashIDs) == 0 || r.HashIDs[0] != 0 {
			t.Fatalf("a prompt does not start with the shared block: %v", r.HashIDs[:min(3, len(r.HashIDs))])
		}
	}
	// Reuse gaps: the time from a prompt to the next one extending its
	// second block (its conversation's next turn).
	last := map[int64]int64{}
	var gaps []int64
	for _, r := range recs {
		if len(r.HashIDs) < 2 {
			continue
		}
		if at, ok := last[r.HashIDs[1]]; ok {
			gaps = append(gaps, r.Timestamp-at)
		}
		last[r.HashIDs[1]] = r.Timestamp
	}
	slices.Sort(gaps)
	if len(gaps) == 0 {
		t.Fatal("no conversation reuses its prefix")
	}
	if med := time.Duration(gaps[len(gaps)/2]) * time.Millisecond; med < 100*time.Second || med > 140*time.Second {
		t.Errorf("median reuse gap %v, want about 2m", med)
	}
	if again := GenerateProductionTrace(3, 30*time.Minute, 1, ProductionParams{}); !slices.EqualFunc(recs, again, func(a, b TraceRecord) bool {
		return a.Timestamp == b.Timestamp && a.InputLength == b.InputLength && slices.Equal(a.HashIDs, b.HashIDs)
	}) {
		t.Error("equal arguments gave different traces")
	}
}

// TestSharedTrace reads the shared Mooncake trace when the workspace has
// it, and checks the figures its README states.
func TestSharedTrace(t *testing.T) {
	if _, err := os.Stat(sharedTrace); err != nil {
		t.Skipf("shared trace not present (%v): it lives beside the repository, not in it", err)
	}
	recs, err := LoadTrace(sharedTrace)
	if err != nil {
		t.Fatal(err)
	}
	s := TraceStats(recs)
	if s.Requests != 3993 || s.PromptP50 < 11000 || s.PromptP50 > 12000 || s.HitBound < 0.63 || s.HitBound > 0.65 {
		t.Errorf("stats %+v; want 3,993 requests, prompt p50 11.6k, hit bound 64%%", s)
	}
}
