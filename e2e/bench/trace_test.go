package bench

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// sharedTrace is the trace in the workspace's shared folder (not in the
// repository).
const sharedTrace = "../../../shared/traces/mooncake-synthetic.jsonl.gz"

// gzipped compresses s.
func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestReadTrace(t *testing.T) {
	plain := "{\"timestamp\": 5, \"input_length\": 700, \"output_length\": 3, \"hash_ids\": [1, 2]}\n\n" +
		"{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 9, \"hash_ids\": [1, 3]}\n"
	// Three records of one millisecond, in file order 3, 1, 2 (by input
	// length), after a later one.
	ties := `{"timestamp": 9, "input_length": 9, "output_length": 1, "hash_ids": [9]}
{"timestamp": 4, "input_length": 3, "output_length": 1, "hash_ids": [3]}
{"timestamp": 4, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 4, "input_length": 2, "output_length": 1, "hash_ids": [2], "extra": "ignored"}` + "\r\n"
	gz := gzipped(t, plain)
	tests := []struct {
		name    string
		in      []byte
		wantErr string
		want    []int64 // timestamps, sorted
		inputs  []int   // input lengths in the returned order (when set)
	}{
		{"plain", []byte(plain), "", []int64{0, 5}, []int{600, 700}},
		{"gzip", gz, "", []int64{0, 5}, []int{600, 700}},
		{"stable ties, CRLF, unknown field", []byte(ties), "", []int64{4, 4, 4, 9}, []int{3, 1, 2, 9}},
		{"stable ties gzipped", gzipped(t, ties), "", []int64{4, 4, 4, 9}, []int{3, 1, 2, 9}},
		{"malformed line", []byte(plain + "{oops\n"), "trace line 4", nil, nil},
		{"malformed gzipped line", gzipped(t, plain+"\n[1, 2]\n"), "trace line 5", nil, nil},
		{"zero-length prompt", []byte(`{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}`), "trace line 1: input_length 0", nil, nil},
		{"negative output", []byte(plain + `{"timestamp": 1, "input_length": 5, "output_length": -1}`), "trace line 4: negative output_length", nil, nil},
		{"negative timestamp", []byte(`{"timestamp": -1, "input_length": 5, "output_length": 1}`), "trace line 1: negative timestamp", nil, nil},
		{"wrong field type", []byte(`{"timestamp": "0", "input_length": 5, "output_length": 1}`), "trace line 1", nil, nil},
		{"truncated gzip", gz[:len(gz)-12], "trace line", nil, nil},
		{"empty", nil, "no records", nil, nil},
		{"blank lines only", []byte("\n  \n\n"), "no records", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := ReadTrace(bytes.NewReader(tt.in))
			if !succeeded(t, err, tt.wantErr) {
				return
			}
			var got []int64
			var inputs []int
			for _, r := range recs {
				got = append(got, r.Timestamp)
				inputs = append(inputs, r.InputLength)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("timestamps %v, want %v", got, tt.want)
			}
			if tt.inputs != nil && !slices.Equal(inputs, tt.inputs) {
				t.Errorf("input lengths %v, want %v (a stable sort keeps ties in file order)", inputs, tt.inputs)
			}
		})
	}
}

func TestLoadTrace(t *testing.T) {
	dir := t.TempDir()
	line := `{"timestamp": 3, "input_length": 1024, "output_length": 2, "hash_ids": [7, 8]}` + "\n"
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		path    string
		wantErr string
	}{
		// The gzip magic, not the file name, decides.
		{"plain named .gz", write("plain.jsonl.gz", []byte(line)), ""},
		{"gzip named .jsonl", write("packed.jsonl", gzipped(t, line)), ""},
		{"missing", filepath.Join(dir, "none.jsonl"), "none.jsonl"},
		{"malformed", write("bad.jsonl", []byte(line+"nope\n")), "bad.jsonl: trace line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := LoadTrace(tt.path)
			if !succeeded(t, err, tt.wantErr) {
				return
			}
			if len(recs) != 1 || recs[0].InputLength != 1024 || !slices.Equal(recs[0].HashIDs, []int64{7, 8}) {
				t.Errorf("records %+v, want the one written", recs)
			}
		})
	}
}

// commonWords returns how many leading 4-character words (tokens) a and b
// share.
func commonWords(a, b string) int {
	n := 0
	for n+charsPerToken <= len(a) && n+charsPerToken <= len(b) && a[n:n+charsPerToken] == b[n:n+charsPerToken] {
		n += charsPerToken
	}
	return n / charsPerToken
}

// TestTraceWorkloadSharesPrefixes checks that two prompts whose leading
// hash ids are equal share exactly those blocks of text (or the shorter
// prompt, if that ends first), and that the text is a function of the ids
// alone.
func TestTraceWorkloadSharesPrefixes(t *testing.T) {
	tests := []struct {
		name       string
		a, b       TraceRecord
		block      int // BlockTokens (0: 512)
		wantShared int // tokens
	}{
		{"two blocks", TraceRecord{InputLength: 1200, HashIDs: []int64{10, 11, 12}},
			TraceRecord{InputLength: 1100, HashIDs: []int64{10, 11, 13}}, 0, 1024},
		{"one block", TraceRecord{InputLength: 1200, HashIDs: []int64{10, 11, 12}},
			TraceRecord{InputLength: 3000, HashIDs: []int64{10, 14}}, 0, 512},
		{"none", TraceRecord{InputLength: 900, HashIDs: []int64{1, 2}},
			TraceRecord{InputLength: 900, HashIDs: []int64{2, 1}}, 0, 0},
		// A partial last block is the leading part of the full block.
		{"partial block is a prefix", TraceRecord{InputLength: 700, HashIDs: []int64{5, 6}},
			TraceRecord{InputLength: 1500, HashIDs: []int64{5, 6, 7}}, 0, 700},
		// Equal ids, one prompt padded past them: the ids' blocks only.
		{"padding is the record's own", TraceRecord{InputLength: 1500, HashIDs: []int64{5, 6}},
			TraceRecord{InputLength: 1600, HashIDs: []int64{5, 6}}, 0, 1024},
		{"small blocks", TraceRecord{InputLength: 40, HashIDs: []int64{1, 2, 3, 4, 5}},
			TraceRecord{InputLength: 40, HashIDs: []int64{1, 2, 3, 9, 5}}, 8, 24},
		// Equal ids at other positions are equal text, but not a prefix.
		{"same id elsewhere", TraceRecord{InputLength: 1024, HashIDs: []int64{1, 2}},
			TraceRecord{InputLength: 1024, HashIDs: []int64{3, 2}}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.b.Timestamp = 1
			w, err := TraceWorkload("t", []TraceRecord{tt.a, tt.b}, TraceOptions{BlockTokens: tt.block})
			if err != nil {
				t.Fatal(err)
			}
			pa, pb := w.Sessions[0].Turns[0].User, w.Sessions[1].Turns[0].User
			if len(pa) != tt.a.InputLength*charsPerToken || len(pb) != tt.b.InputLength*charsPerToken {
				t.Fatalf("prompts of %d and %d bytes, want %d and %d tokens", len(pa), len(pb), tt.a.InputLength, tt.b.InputLength)
			}
			if got := commonWords(pa, pb); got != tt.wantShared {
				t.Errorf("prompts share %d leading tokens, want exactly %d", got, tt.wantShared)
			}
			// The second record alone, in another call: the same text, unless
			// padded (the padding is seeded by the record's place).
			again, err := TraceWorkload("u", []TraceRecord{tt.b}, TraceOptions{BlockTokens: tt.block, Speedup: 3})
			if err != nil {
				t.Fatal(err)
			}
			bt := tt.block
			if bt == 0 {
				bt = 512
			}
			if padded := tt.b.InputLength > len(tt.b.HashIDs)*bt; !padded && again.Sessions[0].Turns[0].User != pb {
				t.Error("a record's prompt depends on the other records")
			}
		})
	}
}

// TestTraceWorkload checks arrivals, lengths and the options.
func TestTraceWorkload(t *testing.T) {
	ms := time.Millisecond
	recs := []TraceRecord{
		{Timestamp: 0, InputLength: 1200, OutputLength: 7, HashIDs: []int64{10, 11, 12}},
		{Timestamp: 2000, InputLength: 1100, OutputLength: 0, HashIDs: []int64{10, 11, 13}},
		{Timestamp: 4000, InputLength: 3000, OutputLength: 5, HashIDs: []int64{10, 14}},
	}
	// The same trace shifted to start at 10 s, given out of order.
	shifted := []TraceRecord{recs[2], recs[0], recs[1]}
	for i := range shifted {
		shifted[i].Timestamp += 10000
	}
	tests := []struct {
		name       string
		recs       []TraceRecord
		o          TraceOptions
		wantErr    string
		starts     []time.Duration
		prompts    []int
		outputs    []int
		wantWindow time.Duration
	}{
		{name: "plain", recs: recs, o: TraceOptions{},
			starts: []time.Duration{0, 2000 * ms, 4000 * ms}, prompts: []int{1200, 1100, 3000}, outputs: []int{7, 1, 5},
			wantWindow: 4001 * ms},
		{name: "speedup and cap", recs: recs, o: TraceOptions{Speedup: 2, MaxPromptTokens: 2000},
			starts: []time.Duration{0, 1000 * ms, 2000 * ms}, prompts: []int{1200, 1100, 2000}, outputs: []int{7, 1, 5},
			wantWindow: 2001 * ms},
		{name: "output floor", recs: recs, o: TraceOptions{MinOutputTokens: 6},
			starts: []time.Duration{0, 2000 * ms, 4000 * ms}, prompts: []int{1200, 1100, 3000}, outputs: []int{7, 6, 6},
			wantWindow: 4001 * ms},
		{name: "window", recs: recs, o: TraceOptions{Window: 4 * time.Second},
			starts: []time.Duration{0, 2000 * ms}, prompts: []int{1200, 1100}, outputs: []int{7, 1},
			wantWindow: 4 * time.Second},
		{name: "offset", recs: recs, o: TraceOptions{Offset: time.Second, Speedup: 0.5},
			starts: []time.Duration{2000 * ms, 6000 * ms}, prompts: []int{1100, 3000}, outputs: []int{1, 5},
			wantWindow: 6001 * ms},
		{name: "shifted and unsorted", recs: shifted, o: TraceOptions{},
			starts: []time.Duration{0, 2000 * ms, 4000 * ms}, prompts: []int{1200, 1100, 3000}, outputs: []int{7, 1, 5},
			wantWindow: 4001 * ms},
		// The trace spans 4.001 s: from 3 s in, the last record at 1 s,
		// then the next lap from 1.001 s, the third lap's first at 5.002 s.
		{name: "offset and wrap", recs: recs, o: TraceOptions{Offset: 3 * time.Second, Window: 6 * time.Second, Wrap: true},
			starts:  []time.Duration{1000 * ms, 1001 * ms, 3001 * ms, 5001 * ms, 5002 * ms},
			prompts: []int{3000, 1200, 1100, 3000, 1200}, outputs: []int{5, 7, 1, 5, 7}, wantWindow: 6 * time.Second},
		// An offset past the whole trace wraps round it.
		{name: "offset laps ahead", recs: recs, o: TraceOptions{Offset: 3*4001*ms + 3*time.Second, Window: 2 * time.Second, Wrap: true},
			starts: []time.Duration{1000 * ms, 1001 * ms}, prompts: []int{3000, 1200}, outputs: []int{5, 7},
			wantWindow: 2 * time.Second},
		{name: "wrap compressed", recs: recs, o: TraceOptions{Speedup: 4001, Window: 3 * ms, Wrap: true},
			starts:  []time.Duration{0, 499875, 999750, 1 * ms, 1499875, 1999750, 2 * ms, 2499875, 2999750},
			prompts: []int{1200, 1100, 3000, 1200, 1100, 3000, 1200, 1100, 3000}, outputs: []int{7, 1, 5, 7, 1, 5, 7, 1, 5},
			wantWindow: 3 * ms},
		{name: "offset past the end", recs: recs, o: TraceOptions{Offset: time.Minute}, wantErr: "no record arrives"},
		{name: "no records", recs: nil, wantErr: "no records"},
		{name: "negative speedup", recs: recs, o: TraceOptions{Speedup: -1}, wantErr: "speedup"},
		{name: "negative cap", recs: recs, o: TraceOptions{MaxPromptTokens: -1}, wantErr: "prompt cap"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := TraceWorkload("t", tt.recs, tt.o)
			if !succeeded(t, err, tt.wantErr) {
				return
			}
			var starts []time.Duration
			var prompts, outputs []int
			for i, s := range w.Sessions {
				if s.ID != i || !s.Stream || s.System != "" || len(s.Turns) != 1 || s.Turns[0].Think != 0 || s.Turns[0].Assistant != "" {
					t.Fatalf("session %d: %+v; want ID %d, streaming, one turn without system prompt, answer or think time", i, s, i)
				}
				tu := s.Turns[0]
				if len(tu.User) != tu.PromptTokens*charsPerToken {
					t.Errorf("session %d: %d bytes for %d tokens", i, len(tu.User), tu.PromptTokens)
				}
				starts = append(starts, s.Start)
				prompts = append(prompts, tu.PromptTokens)
				outputs = append(outputs, tu.OutputTokens)
			}
			if !slices.Equal(starts, tt.starts) || !slices.Equal(prompts, tt.prompts) || !slices.Equal(outputs, tt.outputs) {
				t.Errorf("starts %v, prompts %v, outputs %v; want %v, %v, %v", starts, prompts, outputs, tt.starts, tt.prompts, tt.outputs)
			}
			if w.Window != tt.wantWindow || w.StreamFraction != 1 || w.Name != "t" {
				t.Errorf("window %v, stream fraction %v, name %q; want %v, 1, t", w.Window, w.StreamFraction, w.Name, tt.wantWindow)
			}
			if want := float64(len(tt.starts)) / tt.wantWindow.Seconds(); w.Rate != want {
				t.Errorf("rate %v, want %v", w.Rate, want)
			}
		})
	}
}

func TestTraceStats(t *testing.T) {
	tests := []struct {
		name  string
		recs  []TraceRecord
		block int
		want  TraceSummary
	}{
		{"empty", nil, 0, TraceSummary{}},
		{
			// Blocks: 3 misses; 2 hits and a miss; 2 misses (11 follows
			// 12, not 10); 2 hits (10 11), then the tokens past the ids.
			"chained hits", []TraceRecord{
				{Timestamp: 1000, InputLength: 1536, OutputLength: 10, HashIDs: []int64{10, 11, 12}},
				{Timestamp: 2000, InputLength: 1200, OutputLength: 20, HashIDs: []int64{10, 11, 13}},
				{Timestamp: 3000, InputLength: 1024, OutputLength: 30, HashIDs: []int64{12, 11}},
				{Timestamp: 5000, InputLength: 1100, OutputLength: 40, HashIDs: []int64{10, 11}},
			}, 512, TraceSummary{Requests: 4, Duration: 4 * time.Second, Rate: 1,
				PromptP50: 1150, PromptP90: 1435, OutputP50: 25, OutputP90: 37,
				HitBound: 4.0 / 11, TokenHitBound: 2048.0 / 4860},
		},
		{
			// Ids past the prompt's length are not part of it; a hit
			// partial block counts for its tokens.
			"ids past the prompt", []TraceRecord{
				{Timestamp: 0, InputLength: 10, OutputLength: 1, HashIDs: []int64{1, 2, 3}},
				{Timestamp: 0, InputLength: 6, OutputLength: 1, HashIDs: []int64{1, 2, 3}},
			}, 4, TraceSummary{Requests: 2, PromptP50: 8, PromptP90: 10, OutputP50: 1, OutputP90: 1,
				HitBound: 2.0 / 5, TokenHitBound: 6.0 / 16},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := TraceStats(tt.recs, tt.block)
			near := func(a, b float64) bool { return a-b < 1e-12 && b-a < 1e-12 }
			if got.Requests != tt.want.Requests || got.Duration != tt.want.Duration || !near(got.Rate, tt.want.Rate) ||
				got.PromptP50 != tt.want.PromptP50 || got.PromptP90 != tt.want.PromptP90 ||
				got.OutputP50 != tt.want.OutputP50 || got.OutputP90 != tt.want.OutputP90 ||
				!near(got.HitBound, tt.want.HitBound) || !near(got.TokenHitBound, tt.want.TokenHitBound) {
				t.Errorf("stats %+v,\nwant  %+v", got, tt.want)
			}
		})
	}
}

// TestProductionTraceShape checks the generated trace against the
// published production statistics it is built to match, the structure of
// its hash ids, and determinism.
func TestProductionTraceShape(t *testing.T) {
	const window = 30 * time.Minute
	recs := GenerateProductionTrace(3, window, 1, ProductionParams{})
	s := TraceStats(recs, 512)
	t.Logf("3/s over %v: %+v", window, s)
	if s.PromptP50 < 6300 || s.PromptP50 > 7700 || s.PromptP90 < 24000 || s.PromptP90 > 30000 {
		t.Errorf("prompt p50 %d, p90 %d; want about 7k and 27k", s.PromptP50, s.PromptP90)
	}
	if rate := float64(len(recs)) / window.Seconds(); rate < 2.8 || rate > 3.2 {
		t.Errorf("rate %.2f/s over the window, want about 3", rate)
	}
	if s.OutputP50 < 170 || s.OutputP50 > 230 || s.OutputP90 < 650 || s.OutputP90 > 950 {
		t.Errorf("output p50 %d, p90 %d; want about 200 and 800", s.OutputP50, s.OutputP90)
	}
	// Every id stands for one block content: always at one position after
	// one predecessor.
	type place struct {
		pos  int
		prev int64
	}
	seen := map[int64]place{}
	for _, r := range recs {
		if r.Timestamp < 0 || r.Timestamp >= window.Milliseconds() {
			t.Fatalf("arrival %d ms outside the window", r.Timestamp)
		}
		if len(r.HashIDs) == 0 || r.HashIDs[0] != 0 {
			t.Fatalf("a prompt does not start with the shared block: %v", r.HashIDs[:min(3, len(r.HashIDs))])
		}
		if len(r.HashIDs) != (r.InputLength+511)/512 || r.InputLength < 512+600 || r.OutputLength < 16 || r.OutputLength > 4096 {
			t.Fatalf("record %d tokens, %d ids, output %d", r.InputLength, len(r.HashIDs), r.OutputLength)
		}
		for i, id := range r.HashIDs[1:] {
			p := place{i + 1, r.HashIDs[i]}
			if q, ok := seen[id]; ok && q != p {
				t.Fatalf("id %d at %+v and at %+v", id, q, p)
			}
			seen[id] = p
		}
	}
	// A conversation's next turn (the next prompt extending its second
	// block) keeps the full blocks of the previous prompt, then fresh ids;
	// the gaps between them are the reuse gaps.
	last := map[int64]TraceRecord{}
	var gaps []int64
	for _, r := range recs {
		if prev, ok := last[r.HashIDs[1]]; ok {
			gaps = append(gaps, r.Timestamp-prev.Timestamp)
			keep := prev.InputLength / 512
			if r.InputLength < prev.InputLength+prev.OutputLength+16 ||
				!slices.Equal(r.HashIDs[:keep], prev.HashIDs[:keep]) ||
				keep < len(prev.HashIDs) && r.HashIDs[keep] == prev.HashIDs[keep] {
				t.Fatalf("turn %d tokens %v after %d+%d tokens %v: want the previous full blocks kept, then fresh ids",
					r.InputLength, r.HashIDs, prev.InputLength, prev.OutputLength, prev.HashIDs)
			}
		}
		last[r.HashIDs[1]] = r
	}
	slices.Sort(gaps)
	if len(gaps) < len(recs)/3 {
		t.Fatalf("%d of %d prompts continue a conversation, want about 2 in 3", len(gaps), len(recs))
	}
	if med := time.Duration(gaps[len(gaps)/2]) * time.Millisecond; med < 100*time.Second || med > 140*time.Second {
		t.Errorf("median reuse gap %v, want about 2m", med)
	}
	equal := func(a, b TraceRecord) bool {
		return a.Timestamp == b.Timestamp && a.InputLength == b.InputLength && a.OutputLength == b.OutputLength && slices.Equal(a.HashIDs, b.HashIDs)
	}
	if again := GenerateProductionTrace(3, window, 1, ProductionParams{}); !slices.EqualFunc(recs, again, equal) {
		t.Error("equal arguments gave different traces")
	}
	if other := GenerateProductionTrace(3, window, 2, ProductionParams{}); slices.EqualFunc(recs, other, equal) {
		t.Error("another seed gave the same trace")
	}
}

// TestProductionTraceRate checks that the trace offers its rate from the
// window's start, short windows included (conversations arrive from an
// hour before, so that the first minutes hold their later turns too).
func TestProductionTraceRate(t *testing.T) {
	tests := []struct {
		rate   float64
		window time.Duration
	}{
		{2.9, 10 * time.Minute},
		{4.5, 5 * time.Minute},
		{1, 30 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%g/s over %v", tt.rate, tt.window), func(t *testing.T) {
			// The mean of 8 seeds: one seed's count varies by about 5%
			// over 10 minutes (Poisson conversations of geometric turns).
			const seeds = 8
			n := 0
			for seed := uint64(1); seed <= seeds; seed++ {
				n += len(GenerateProductionTrace(tt.rate, tt.window, seed, ProductionParams{}))
			}
			if got := float64(n) / seeds / tt.window.Seconds(); got < 0.93*tt.rate || got > 1.07*tt.rate {
				t.Errorf("%.2f requests/s, want about %g", got, tt.rate)
			}
		})
	}
}

// TestProductionTraceParams checks that the parameters move the trace.
func TestProductionTraceParams(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		p     ProductionParams
		check func(s TraceSummary, recs []TraceRecord) string
	}{
		{"no arrivals at rate 0", 0, ProductionParams{}, func(s TraceSummary, recs []TraceRecord) string {
			if len(recs) != 0 {
				return "records at rate 0"
			}
			return ""
		}},
		{"single turns share only the first block", 2, ProductionParams{MeanTurns: 1}, func(s TraceSummary, recs []TraceRecord) string {
			blocks := 0
			for _, r := range recs {
				blocks += len(r.HashIDs)
			}
			if want := float64(len(recs)-1) / float64(blocks); s.HitBound < want-1e-9 || s.HitBound > want+1e-9 {
				return "hit bound is not the shared block alone"
			}
			return ""
		}},
		{"short contexts and outputs", 2, ProductionParams{ContextMedian: 1000, ContextSigma: 0.1, OutputMedian: 20, OutputSigma: 0.1},
			func(s TraceSummary, recs []TraceRecord) string {
				if s.PromptP50 > 2500 || s.OutputP90 > 30 {
					return "the medians did not move the lengths"
				}
				return ""
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs := GenerateProductionTrace(tt.rate, 10*time.Minute, 3, tt.p)
			if msg := tt.check(TraceStats(recs, 512), recs); msg != "" {
				t.Errorf("%s: %+v", msg, TraceStats(recs, 512))
			}
		})
	}
}

// TestSharedTrace reads the shared Mooncake trace when the workspace has
// it, checks the figures its README states, and that replayed prompts share
// exactly the blocks their records' hash ids share.
func TestSharedTrace(t *testing.T) {
	if _, err := os.Stat(sharedTrace); err != nil {
		t.Skipf("shared trace %s not present (%v): it lives beside the repository, not in it", sharedTrace, err)
	}
	recs, err := LoadTrace(sharedTrace)
	if err != nil {
		t.Fatal(err)
	}
	s := TraceStats(recs, 512)
	t.Logf("whole trace: %+v", s)
	if s.Requests != 3993 || s.PromptP50 < 11000 || s.PromptP50 > 12000 || s.HitBound < 0.63 || s.HitBound > 0.65 {
		t.Errorf("stats %+v; want 3,993 requests, prompt p50 11.6k, hit bound 64%%", s)
	}
	n := 0
	for n < len(recs) && recs[n].Timestamp < (10*time.Minute).Milliseconds() {
		n++
	}
	t.Logf("first 10 minutes: %+v", TraceStats(recs[:n], 512))

	const window = time.Minute
	w, err := TraceWorkload("trace", recs, TraceOptions{Window: window})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) < 100 {
		t.Fatalf("%d sessions in %v, want about 4 a second", len(w.Sessions), window)
	}
	// Without offset, compression or wrap, session i is record i.
	pairs := 0
	for i := range w.Sessions {
		if w.Sessions[i].Start != time.Duration(recs[i].Timestamp)*time.Millisecond {
			t.Fatalf("session %d starts at %v, record at %d ms", i, w.Sessions[i].Start, recs[i].Timestamp)
		}
		for j := i + 1; j < len(w.Sessions); j++ {
			a, b := recs[i], recs[j]
			ids := 0
			for ids < min(len(a.HashIDs), len(b.HashIDs)) && a.HashIDs[ids] == b.HashIDs[ids] {
				ids++
			}
			if ids == 0 {
				continue
			}
			pairs++
			want := min(ids*512, a.InputLength, b.InputLength)
			if got := commonWords(w.Sessions[i].Turns[0].User, w.Sessions[j].Turns[0].User); got != want {
				t.Errorf("records %d and %d share %d leading ids: prompts share %d tokens, want %d", i, j, ids, got, want)
			}
		}
	}
	if pairs < 10 {
		t.Errorf("only %d pairs of prompts share leading blocks in the first %v", pairs, window)
	}
}

// TestLimitStreaming checks that the chunk budget's share of a built
// workload streams, spread over its sessions, and that non-streaming
// sessions stay so.
func TestLimitStreaming(t *testing.T) {
	tests := []struct {
		name      string
		sessions  int
		frac      float64
		wantKept  int
		wantFirst bool
	}{
		{"all", 10, 1, 10, true},
		{"none", 10, 0, 0, false},
		{"half, every other", 10, 0.5, 5, false},
		{"a quarter", 8, 0.25, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := Workload{}
			for i := range tt.sessions {
				w.Sessions = append(w.Sessions, Session{ID: i, Stream: true})
			}
			w.Sessions = append(w.Sessions, Session{ID: tt.sessions, Stream: false})
			w.LimitStreaming(tt.frac)
			kept := 0
			for _, s := range w.Sessions {
				if s.Stream {
					kept++
				}
			}
			if kept != tt.wantKept || w.Sessions[0].Stream != tt.wantFirst || w.Sessions[tt.sessions].Stream {
				t.Errorf("kept %d (first %v), want %d (first %v), last never", kept, w.Sessions[0].Stream, tt.wantKept, tt.wantFirst)
			}
			if want := float64(tt.wantKept) / float64(tt.sessions+1); w.StreamFraction != want {
				t.Errorf("StreamFraction %v, want %v", w.StreamFraction, want)
			}
		})
	}
}

// succeeded checks err against want, the text a failure must contain ("":
// none may occur). It reports whether the call succeeded, so that the
// caller checks its results only then.
func succeeded(t *testing.T, err error, want string) bool {
	t.Helper()
	if want != "" {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("err = %v, want it to contain %q", err, want)
		}
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}
