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
	// traces): an equal id at the same position, after equal ids, is the
	// same prefix block.
	HashIDs []int64 `json:"hash_ids"`
}

// DefaultTraceBlockTokens is the tokens one hash id stands for in
// Mooncake's traces.
const DefaultTraceBlockTokens = 512

// maxTraceLine bounds one line of a trace (a 1M-token prompt's 2,000 ids
// fit in well under 64 KiB).
const maxTraceLine = 16 << 20

// LoadTrace reads the trace file at path (see ReadTrace).
func LoadTrace(path string) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load trace: %w", err)
	}
	defer f.Close()
	recs, err := ReadTrace(f)
	if err != nil {
		return nil, fmt.Errorf("load trace %s: %w", path, err)
	}
	return recs, nil
}

// ReadTrace reads a trace of JSON lines, gzip-compressed (recognized by
// its magic bytes) or plain, and returns its records sorted by timestamp,
// stably (records of one millisecond keep the file's order). Blank lines
// are skipped; a malformed line, a prompt of no tokens, a negative output
// length or timestamp, or a trace of no records is an error naming the
// line.
func ReadTrace(r io.Reader) ([]TraceRecord, error) {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("trace: gzip: %w", err)
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	var out []TraceRecord
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		switch {
		case rec.InputLength < 1:
			return nil, fmt.Errorf("trace line %d: input_length %d, want at least 1", line, rec.InputLength)
		case rec.OutputLength < 0:
			return nil, fmt.Errorf("trace line %d: negative output_length %d", line, rec.OutputLength)
		case rec.Timestamp < 0:
			return nil, fmt.Errorf("trace line %d: negative timestamp %d", line, rec.Timestamp)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace line %d: %w", line+1, err)
	}
	if len(out) == 0 {
		return nil, errors.New("trace: no records")
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out, nil
}

// TraceOptions shape a replay (see TraceWorkload). Zero fields take the
// defaults documented on each.
type TraceOptions struct {
	// BlockTokens is the tokens one hash id stands for (default 512,
	// Mooncake's).
	BlockTokens int
	// Speedup compresses time: arrivals are divided by it (default 1).
	Speedup float64
	// Offset starts the replay this far into the trace, in trace time
	// (before compression).
	Offset time.Duration
	// Window is the model-time arrival window, after compression; 0 takes
	// the rest of the trace.
	Window time.Duration
	// MaxPromptTokens caps a prompt's length: a longer prompt is cut to
	// it, keeping its leading blocks (0: no cap).
	MaxPromptTokens int
	// MinOutputTokens is the floor on a request's output tokens (default
	// 1: traces hold zero-length outputs, which no engine serves).
	MinOutputTokens int
	// Wrap continues from the trace's start when the window runs past its
	// end; the arrivals of each lap are those of the previous one plus the
	// trace's duration (last arrival less first, plus 1 ms so that the two
	// laps' ends do not coincide). Without Wrap the replay ends with the
	// trace.
	Wrap bool
}

// traceTextSeed seeds the text of each hash id; traceTextSeed^1 seeds the
// padding of prompts longer than their ids.
const traceTextSeed = 0x6d6f6f6e63616b65 // "mooncake"

// maxTraceLaps bounds a wrapped replay, against a window far longer than
// its trace.
const maxTraceLaps = 10000

// TraceWorkload turns trace records into a workload. Each record arriving
// in the window is a one-turn session without system prompt, starting at
// (timestamp − first timestamp − Offset) / Speedup, so a trace whose first
// record is not at 0 starts at once. Its prompt is the text of its hash
// ids: each id is a fixed block of BlockTokens tokens generated from the id
// alone, so equal leading ids give byte-equal prompt prefixes to duet and
// to the engines. The last block is cut, or past the ids padded with text
// of the record's own, to exactly input_length tokens (after the cap). The
// sessions are sorted by start and numbered from 0; every one streams, and
// Rate is their number over the window's seconds.
func TraceWorkload(name string, recs []TraceRecord, o TraceOptions) (Workload, error) {
	if o.BlockTokens <= 0 {
		o.BlockTokens = DefaultTraceBlockTokens
	}
	if o.Speedup == 0 {
		o.Speedup = 1
	}
	if o.MinOutputTokens <= 0 {
		o.MinOutputTokens = 1
	}
	if !(o.Speedup > 0) || math.IsInf(o.Speedup, 0) || o.Offset < 0 || o.Window < 0 || o.MaxPromptTokens < 0 {
		return Workload{}, fmt.Errorf("trace %s: speedup must be positive and finite, offset, window and prompt cap not negative", name)
	}
	if len(recs) == 0 {
		return Workload{}, fmt.Errorf("trace %s: no records", name)
	}
	// Records may come unsorted from a caller: order them by arrival.
	order := make([]int, len(recs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return recs[order[a]].Timestamp < recs[order[b]].Timestamp })
	first := recs[order[0]].Timestamp
	span := time.Duration(recs[order[len(order)-1]].Timestamp-first+1) * time.Millisecond
	compress := func(t time.Duration) time.Duration { return time.Duration(float64(t) / o.Speedup) }

	type pick struct {
		rec *TraceRecord
		at  time.Duration
		idx int // unique over laps: seeds the padding
	}
	var picks []pick
	lap, laps := 0, 1
	if o.Wrap && o.Window > 0 {
		lap = int(o.Offset / span)
		laps = maxTraceLaps
	}
	for end := lap + laps; lap < end; lap++ {
		base := time.Duration(lap)*span - o.Offset
		if o.Window > 0 && base > 0 && compress(base) >= o.Window {
			break
		}
		for _, i := range order {
			t := time.Duration(recs[i].Timestamp-first)*time.Millisecond + base
			if t < 0 {
				continue
			}
			at := compress(t)
			if o.Window > 0 && at >= o.Window {
				break
			}
			picks = append(picks, pick{&recs[i], at, lap*len(recs) + i})
		}
	}
	if len(picks) == 0 {
		return Workload{}, fmt.Errorf("trace %s: no record arrives in the window (offset %v, trace %v long)", name, o.Offset, span)
	}
	window := o.Window
	if window == 0 {
		window = picks[len(picks)-1].at + time.Millisecond
	}
	w := Workload{Name: name, Window: window, Rate: float64(len(picks)) / window.Seconds(),
		StreamFraction: 1, Sessions: make([]Session, 0, len(picks))}
	blocks := map[int64]string{}
	blockText := func(id int64) string {
		t, ok := blocks[id]
		if !ok {
			t = Text(rand.New(rand.NewPCG(uint64(id), traceTextSeed)), o.BlockTokens)
			blocks[id] = t
		}
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
			n := min(left, o.BlockTokens)
			b.WriteString(blockText(id)[:n*charsPerToken])
			left -= n
		}
		if left > 0 {
			b.WriteString(Text(rand.New(rand.NewPCG(uint64(p.idx), traceTextSeed^1)), left))
		}
		w.Sessions = append(w.Sessions, Session{ID: i, Start: p.at, Stream: true, Turns: []Turn{{
			User: b.String(), PromptTokens: tokens, OutputTokens: max(p.rec.OutputLength, o.MinOutputTokens),
		}}})
	}
	return w, nil
}

// TraceSummary describes a trace, for reports and documentation.
type TraceSummary struct {
	// Requests is the number of records; Duration spans their arrivals
	// (last less first).
	Requests int
	Duration time.Duration
	// Rate is Requests over Duration, per second (0 for a zero duration).
	Rate float64
	// PromptP50, PromptP90, OutputP50 and OutputP90 are token percentiles
	// (interpolated, as Percentile).
	PromptP50, PromptP90, OutputP50, OutputP90 int
	// HitBound is the share of prompt blocks whose whole chain of ids up
	// to and including them appeared in an earlier prompt: what a cache
	// holding every earlier prompt's blocks forever would hit. A prompt's
	// blocks are its input_length in blocks (rounded up); blocks past its
	// ids are its own and miss.
	HitBound float64
	// TokenHitBound is the same bound in prompt tokens: a prompt's last
	// block counts for the tokens it holds.
	TokenHitBound float64
}

// TraceStats summarizes recs, whose hash ids stand for blockTokens tokens
// each (0 takes 512). Records need not be sorted, but the hit bound takes
// them in the given order.
func TraceStats(recs []TraceRecord, blockTokens int) TraceSummary {
	if blockTokens <= 0 {
		blockTokens = DefaultTraceBlockTokens
	}
	s := TraceSummary{Requests: len(recs)}
	if len(recs) == 0 {
		return s
	}
	in := make([]float64, len(recs))
	out := make([]float64, len(recs))
	lo, hi := recs[0].Timestamp, recs[0].Timestamp
	// Chains are numbered as they first appear: (parent chain, id) names
	// the chain of the ids up to a block (-1 is the empty chain).
	type chainKey struct{ parent, id int64 }
	chains := map[chainKey]int64{}
	var blocks, hits, tokens, hitTokens int
	for i, r := range recs {
		lo, hi = min(lo, r.Timestamp), max(hi, r.Timestamp)
		in[i], out[i] = float64(r.InputLength), float64(r.OutputLength)
		n := (r.InputLength + blockTokens - 1) / blockTokens
		blocks += n
		tokens += r.InputLength
		parent, seen := int64(-1), true
		for k, id := range r.HashIDs[:min(n, len(r.HashIDs))] {
			key := chainKey{parent, id}
			c, ok := chains[key]
			if !ok {
				c = int64(len(chains))
				chains[key] = c
				seen = false
			}
			if seen {
				hits++
				hitTokens += min(blockTokens, r.InputLength-k*blockTokens)
			}
			parent = c
		}
	}
	s.Duration = time.Duration(hi-lo) * time.Millisecond
	if s.Duration > 0 {
		s.Rate = float64(len(recs)) / s.Duration.Seconds()
	}
	slices.Sort(in)
	slices.Sort(out)
	pct := func(v []float64, p float64) int { return int(math.Round(Percentile(v, p))) }
	s.PromptP50, s.PromptP90 = pct(in, 50), pct(in, 90)
	s.OutputP50, s.OutputP90 = pct(out, 50), pct(out, 90)
	if blocks > 0 {
		s.HitBound = float64(hits) / float64(blocks)
		s.TokenHitBound = float64(hitTokens) / float64(tokens)
	}
	return s
}

// ProductionParams shape GenerateProductionTrace's conversations. Zero
// fields take the defaults, which reproduce the published statistics of a
// production conversation trace: one shared first block, prompts p50 ≈ 7k
// and p90 ≈ 27k tokens, and a median of about two minutes before a
// conversation's prefix is reused.
type ProductionParams struct {
	// BlockTokens is the tokens per hash id (default 512), and the shared
	// first block's length.
	BlockTokens int
	// ContextMedian and ContextSigma shape the lognormal context of a
	// conversation's first turn after the shared block (defaults 5,000
	// tokens and 1.25), cut to whole tokens and clamped to Context.
	ContextMedian float64
	ContextSigma  float64
	// Context clamps the first turn's context (default 600-100,000
	// tokens).
	Context IntRange
	// MeanTurns is the mean number of turns per conversation, geometric
	// from 1 (default 3).
	MeanTurns float64
	// GapMedian and GapSigma shape the lognormal time from one turn of a
	// conversation to the next (defaults 120s and 0.8).
	GapMedian time.Duration
	GapSigma  float64
	// UserMedian and UserSigma shape the lognormal new user message of
	// each later turn (defaults 300 tokens and 0.8), at least 16 tokens.
	UserMedian float64
	UserSigma  float64
	// OutputMedian and OutputSigma shape the lognormal outputs (defaults
	// 200 tokens and 1.08: p90 ≈ 800), cut to whole tokens and clamped to
	// Output.
	OutputMedian float64
	OutputSigma  float64
	// Output clamps the outputs (default 16-4096 tokens).
	Output IntRange
	// WarmUp is how long before the trace conversations start to arrive
	// (default 1 hour), so that the conversations of the trace's start are
	// as far along as later ones. At the other defaults one turn in 2,000
	// comes more than an hour after its conversation's start; a shorter
	// warm-up drops such turns and lowers the rate (one of five with 10
	// minutes).
	WarmUp time.Duration
}

// withDefaults fills zero fields.
func (p ProductionParams) withDefaults() ProductionParams {
	if p.BlockTokens <= 0 {
		p.BlockTokens = DefaultTraceBlockTokens
	}
	if p.ContextMedian <= 0 {
		p.ContextMedian = 5000
	}
	if p.ContextSigma <= 0 {
		p.ContextSigma = 1.25
	}
	if p.Context == (IntRange{}) {
		p.Context = IntRange{600, 100000}
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
	if p.UserSigma <= 0 {
		p.UserSigma = 0.8
	}
	if p.OutputMedian <= 0 {
		p.OutputMedian = 200
	}
	if p.OutputSigma <= 0 {
		p.OutputSigma = 1.08
	}
	if p.Output == (IntRange{}) {
		p.Output = IntRange{16, 4096}
	}
	if p.WarmUp <= 0 {
		p.WarmUp = time.Hour
	}
	return p
}

// minUserTokens is the floor on a later turn's new user message.
const minUserTokens = 16

// GenerateProductionTrace returns a production-shaped conversation trace
// of about rate requests per second over window, from seed; equal
// arguments give equal traces. Every prompt starts with one shared block
// (hash id 0, a system prompt). Conversations arrive as a Poisson process
// at rate/MeanTurns per second; each draws its number of turns and its
// first context. Each later turn, a lognormal gap after the previous one,
// appends the previous turn's output and a new user message, so its
// leading ids repeat every full block of the previous prompt and the rest
// are fresh (ids are numbered by one counter, so a new block content never
// reuses an id). Turns from the window's end on are dropped. Conversations
// start from WarmUp before the trace, whose earlier turns are drawn but not
// emitted, so that the trace starts in steady state (rate and context
// lengths as later on); their blocks are new to the trace.
func GenerateProductionTrace(rate float64, window time.Duration, seed uint64, p ProductionParams) []TraceRecord {
	p = p.withDefaults()
	if !(rate > 0) || window <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, stringSeed("production")))
	lognormal := func(median, sigma float64) float64 { return median * math.Exp(sigma*rng.NormFloat64()) }
	clamp := func(x float64, r IntRange) int { return int(min(max(x, float64(r.Min)), float64(max(r.Max, r.Min)))) }
	bt := p.BlockTokens
	next := int64(1) // id 0 is the shared block
	var out []TraceRecord
	for _, start := range PoissonArrivals(rng, rate/p.MeanTurns, p.WarmUp+window) {
		at := start - p.WarmUp
		turns := 1
		for rng.Float64() > 1/p.MeanTurns {
			turns++
		}
		length := bt + clamp(lognormal(p.ContextMedian, p.ContextSigma), p.Context)
		ids := []int64{0}
		prevLen := 0 // the previous turn's prompt tokens
		for k := range turns {
			if k > 0 {
				at += time.Duration(lognormal(float64(p.GapMedian), p.GapSigma))
				length += int(max(lognormal(p.UserMedian, p.UserSigma), minUserTokens))
				// Keep the full blocks of the previous prompt; its last
				// block, if partial, now holds more and takes a fresh id.
				ids = ids[:prevLen/bt]
			}
			if at >= window {
				break
			}
			for len(ids)*bt < length {
				ids = append(ids, next)
				next++
			}
			output := clamp(lognormal(p.OutputMedian, p.OutputSigma), p.Output)
			if at >= 0 {
				out = append(out, TraceRecord{Timestamp: at.Milliseconds(), InputLength: length,
					OutputLength: output, HashIDs: slices.Clone(ids)})
			}
			prevLen = length
			length += output
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out
}
