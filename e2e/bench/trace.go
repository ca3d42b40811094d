package bench

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// TraceRecord is one request of a trace in the Mooncake format (also read
// by Dynamo's and SGLang's benchmarks): one JSON object per line.
type TraceRecord struct {
	// Timestamp is the arrival, in milliseconds from the trace's start.
	Timestamp int64 `json:"timestamp"`
	// InputLength and OutputLength are the prompt and output tokens.
	InputLength  int `json:"input_length"`
	OutputLength int `json:"output_length"`
	// HashIDs are the prompt's blocks (512 tokens each in Mooncake's
	// traces): an equal id at the same position is the same prefix block.
	HashIDs []int64 `json:"hash_ids"`
}

// maxTraceLine bounds one line of a trace (a 1M-token prompt's 2,000 ids
// fit in well under 64 KiB).
const maxTraceLine = 16 << 20

// LoadTrace reads the trace at path (see ReadTrace).
func LoadTrace(path string) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	recs, err := ReadTrace(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return recs, nil
}

// ReadTrace reads a trace, gzip-compressed or plain JSON lines, and returns
// its records sorted by timestamp (stably). Blank lines are skipped.
func ReadTrace(r io.Reader) ([]TraceRecord, error) {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	var out []TraceRecord
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if rec.InputLength < 1 || rec.OutputLength < 0 || rec.Timestamp < 0 {
			return nil, fmt.Errorf("line %d: input_length must be positive, output_length and timestamp not negative", line)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("no records")
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out, nil
}

// TraceOptions shape a replay.
type TraceOptions struct {
	// BlockTokens is the tokens one hash id stands for (default 512,
	// Mooncake's).
	BlockTokens int
	// Speedup compresses time: arrivals are divided by it (default 1).
	Speedup float64
	// Offset starts the replay this far into the trace (trace time).
	Offset time.Duration
	// Window is the model-time arrival window after compression; 0 takes
	// the rest of the trace.
	Window time.Duration
	// MaxPromptTokens caps a prompt's length, keeping its leading blocks
	// (0: no cap).
	MaxPromptTokens int
	// Wrap continues from the trace's start when the window runs past its
	// end (arrivals keep increasing by the trace's duration).
	Wrap bool
}

// traceTextSeed seeds the text of each hash id.
const traceTextSeed = 0x6d6f6f6e63616b65 // "mooncake"

// TraceWorkload turns trace records into a workload: each record is a
// one-turn session whose prompt is the text of its hash ids, each id a
// fixed block of BlockTokens tokens generated from the id alone, so that
// equal ids give byte-equal prompt prefixes to duet and to the engines. The
// last block is cut (or, past the ids, padded with text of the record's
// own) to input_length tokens. Every session streams.
func TraceWorkload(name string, recs []TraceRecord, o TraceOptions) (Workload, error) {
	if o.BlockTokens <= 0 {
		o.BlockTokens = 512
	}
	if o.Speedup == 0 {
		o.Speedup = 1
	}
	if !(o.Speedup > 0) || math.IsInf(o.Speedup, 0) || o.Offset < 0 || o.Window < 0 || o.MaxPromptTokens < 0 {
		return Workload{}, fmt.Errorf("trace %s: speedup must be positive, offset, window and prompt cap not negative", name)
	}
	if len(recs) == 0 {
		return Workload{}, fmt.Errorf("trace %s: no records", name)
	}
	first := recs[0].Timestamp
	span := time.Duration(recs[len(recs)-1].Timestamp-first+1) * time.Millisecond
	type pick struct {
		rec *TraceRecord
		at  time.Duration
		idx int
	}
	var picks []pick
	for lap := 0; ; lap++ {
		added := false
		for i := range recs {
			t := time.Duration(recs[i].Timestamp-first)*time.Millisecond + time.Duration(lap)*span - o.Offset
			if t < 0 {
				continue
			}
			at := time.Duration(float64(t) / o.Speedup)
			if o.Window > 0 && at >= o.Window {
				break
			}
			picks = append(picks, pick{&recs[i], at, lap*len(recs) + i})
			added = true
		}
		if !o.Wrap || o.Window == 0 || (!added && lap > 0) || lap > 1000 {
			break
		}
		if last := time.Duration(float64(time.Duration(lap+1)*span-o.Offset) / o.Speedup); last >= o.Window {
			break
		}
	}
	window := o.Window
	if window == 0 && len(picks) > 0 {
		window = picks[len(picks)-1].at + time.Millisecond
	}
	w := Workload{Name: name, Window: window, StreamFraction: 1}
	if window > 0 {
		w.Rate = float64(len(picks)) / window.Seconds()
	}
	blocks := map[int64]string{}
	blockText := func(id int64) string {
		if t, ok := blocks[id]; ok {
			return t
		}
		t := Text(rand.New(rand.NewPCG(uint64(id), traceTextSeed)), o.BlockTokens)
		blocks[id] = t
		return t
	}
	for i, p := range picks {
		tokens := p.rec.InputLength
		if o.MaxPromptTokens > 0 {
			tokens = min(tokens, o.MaxPromptTokens)
		}
		var b strings.Builder
		b.Grow(tokens * charsPerToken)
		left := tokens
		for _, id := range p.rec.HashIDs {
			if left <= 0 {
				break
			}
			t := blockText(id)
			n := min(left, o.BlockTokens)
			b.WriteString(t[:n*charsPerToken])
			left -= n
		}
		if left > 0 {
			b.WriteString(Text(rand.New(rand.NewPCG(uint64(p.idx), traceTextSeed^1)), left))
		}
		w.Sessions = append(w.Sessions, Session{ID: i, Start: p.at, Stream: true, Turns: []Turn{{
			User: b.String(), PromptTokens: tokens, OutputTokens: max(p.rec.OutputLength, 1),
		}}})
	}
	return w, nil
}

// TraceSummary describes a trace.
type TraceSummary struct {
	// Requests is the number of records; Duration spans their arrivals.
	Requests int
	Duration time.Duration
	// Rate is Requests over Duration, per second.
	Rate float64
	// PromptP50, PromptP90, OutputP50 and OutputP90 are token percentiles.
	PromptP50, PromptP90, OutputP50, OutputP90 int
	// HitBound is the share of prompt blocks whose whole chain of ids up
	// to them appeared in an earlier prompt: what a cache holding every
	// earlier prompt forever would hit.
	HitBound float64
}

// TraceStats summarizes recs.
func TraceStats(recs []TraceRecord) TraceSummary {
	s := TraceSummary{Requests: len(recs)}
	if len(recs) == 0 {
		return s
	}
	s.Duration = time.Duration(recs[len(recs)-1].Timestamp-recs[0].Timestamp) * time.Millisecond
	if s.Duration > 0 {
		s.Rate = float64(len(recs)) / s.Duration.Seconds()
	}
	in := make([]int, len(recs))
	out := make([]int, len(recs))
	type chainKey struct{ parent, id int64 }
	chains := map[chainKey]int64{} // (parent chain, id) -> chain id
	var blocks, hits int
	for i, r := range recs {
		in[i], out[i] = r.InputLength, r.OutputLength
		parent, known := int64(-1), true
		for _, id := range r.HashIDs {
			k := chainKey{parent, id}
			c, ok := chains[k]
			if !ok {
				c = int64(len(chains))
				chains[k] = c
			}
			blocks++
			if ok && known {
				hits++
			} else {
				known = false
			}
			parent = c
		}
	}
	slices.Sort(in)
	slices.Sort(out)
	pct := func(v []int, q float64) int { return v[min(len(v)-1, int(q*float64(len(v))))] }
	s.PromptP50, s.PromptP90 = pct(in, 0.5), pct(in, 0.9)
	s.OutputP50, s.OutputP90 = pct(out, 0.5), pct(out, 0.9)
	if blocks > 0 {
		s.HitBound = float64(hits) / float64(blocks)
	}
	return s
}

// ProductionParams shape GenerateProductionTrace's conversations. Zero
// fields take the defaults, which reproduce the published statistics of a
// production conversation trace: one shared first block, prompts p50 ≈ 7k
// and p90 ≈ 27k tokens, and a median of about two minutes before a
// conversation's prefix is reused.
type ProductionParams struct {
	// BlockTokens is the tokens per hash id (default 512).
	BlockTokens int
	// ContextMedian and ContextSigma shape the lognormal first-turn
	// context (defaults 5,000 tokens and 1.25), clamped to [600, 100,000].
	ContextMedian float64
	ContextSigma  float64
	// MeanTurns is the mean number of turns per conversation, geometric
	// (default 3).
	MeanTurns float64
	// GapMedian and GapSigma shape the lognormal time between a
	// conversation's turns (defaults 120s and 0.8).
	GapMedian time.Duration
	GapSigma  float64
	// UserMedian is the median of the lognormal new user message of each
	// later turn, in tokens (default 300).
	UserMedian float64
	// OutputMedian and OutputSigma shape the lognormal outputs (defaults
	// 200 tokens and 1.08: p90 ≈ 800), clamped to [16, 4096].
	OutputMedian float64
	OutputSigma  float64
}

func (p ProductionParams) withDefaults() ProductionParams {
	if p.BlockTokens <= 0 {
		p.BlockTokens = 512
	}
	if p.ContextMedian <= 0 {
		p.ContextMedian = 5000
	}
	if p.ContextSigma <= 0 {
		p.ContextSigma = 1.25
	}
	if p.MeanTurns < 1 {
		p.MeanTurns = 3
	}
	if p.GapMedian <= 0 {
		p.GapMedian = 120 * time.Second
	}
	if p.GapSigma <= 0 {
		p.GapSigma = 0.8
	}
	if p.UserMedian <= 0 {
		p.UserMedian = 300
	}
	if p.OutputMedian <= 0 {
		p.OutputMedian = 200
	}
	if p.OutputSigma <= 0 {
		p.OutputSigma = 1.08
	}
	return p
}

// GenerateProductionTrace returns a production-shaped conversation trace
// of about rate requests per second over window, from seed. Every prompt
// starts with one shared block (hash id 0). Conversations arrive as a
// Poisson process that starts one window before the trace, so that the
// trace is in steady state from its start (turns before it are dropped,
// and their blocks count as unseen); each later turn carries the previous prompt, its output
// and a new user message, so its leading ids repeat every full block of the
// previous prompt. Equal arguments give equal traces.
func GenerateProductionTrace(rate float64, window time.Duration, seed uint64, p ProductionParams) []TraceRecord {
	p = p.withDefaults()
	rng := rand.New(rand.NewPCG(seed, stringSeed("production")))
	lognormal := func(median, sigma float64) float64 { return median * math.Exp(sigma*rng.NormFloat64()) }
	next := int64(1) // id 0 is the shared block
	var out []TraceRecord
	bt := p.BlockTokens
	for _, start := range PoissonArrivals(rng, rate/p.MeanTurns, 2*window) {
		start -= window
		turns := 1
		for rng.Float64() > 1/p.MeanTurns {
			turns++
		}
		length := bt + int(min(max(lognormal(p.ContextMedian, p.ContextSigma), 600), 100000))
		ids := []int64{0}
		at := start
		prevLen := 0
		for k := range turns {
			if k > 0 {
				at += time.Duration(lognormal(float64(p.GapMedian), p.GapSigma))
				length += int(max(lognormal(p.UserMedian, 0.8), 16))
			}
			if at >= window {
				break
			}
			if at < 0 {
				// Before the trace: the turn is not sent, the context grows.
				ids = ids[:min(len(ids), length/bt)]
				for len(ids)*bt < length {
					ids = append(ids, next)
					next++
				}
				length += int(min(max(lognormal(p.OutputMedian, p.OutputSigma), 16), 4096))
				prevLen = length
				continue
			}
			// Keep the full blocks of the previous prompt; new ids after.
			if k > 0 {
				ids = ids[:min(len(ids), prevLen/bt)]
			}
			for len(ids)*bt < length {
				ids = append(ids, next)
				next++
			}
			output := int(min(max(lognormal(p.OutputMedian, p.OutputSigma), 16), 4096))
			out = append(out, TraceRecord{Timestamp: at.Milliseconds(), InputLength: length, OutputLength: output, HashIDs: slices.Clone(ids)})
			prevLen = length
			length += output
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out
}
