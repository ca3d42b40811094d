package sim

import (
	"sync"
	"time"
)

// throughputWindow is the window over which gen_throughput is averaged.
const throughputWindow = 5

// phase is where an in-flight item sits on its rank.
type phase int

const (
	// phaseTransfer: decode item with KV preallocated, waiting for the
	// prefill's transfer (SGLang's decode transfer queue).
	phaseTransfer phase = iota
	// phaseRunning: the item is being computed (prefill forward or decode).
	phaseRunning
)

// rankLoad is the live load of one DP rank.
type rankLoad struct {
	running     int
	transfer    int
	usedTokens  int
	buckets     [throughputWindow + 1]tokenBucket
	promptTotal int64
	genTotal    int64
}

// tokenBucket counts tokens generated during one wall-clock second.
type tokenBucket struct {
	sec int64
	n   int
}

// rankSnapshot is a point-in-time copy of one rank's load, from the
// simple model's loadTracker or from the engine model.
type rankSnapshot struct {
	dpRank  int
	running int
	// waiting is the waiting queue (decode: the prealloc queue); always 0
	// in the simple model.
	waiting int
	// bootstrap is, on a PD prefill of the engine model, the bootstrap
	// queue (SGLang's prefill bootstrap queue): requests whose decode has
	// not preallocated yet.
	bootstrap int
	// transfer is, on decode, the requests waiting for their KV; on a
	// prefill (engine model only), the requests sending their KV.
	transfer   int
	usedTokens int
	// totalTokens is usedTokens plus the prompts of waiting requests.
	totalTokens   int
	genThroughput float64 // tokens per (model) second
	cacheHitRate  float64
	// Cumulative counters: prompt tokens looked up in the prefix cache and
	// found there, prompt tokens received, tokens generated.
	prefixQueries int64
	prefixHits    int64
	promptTotal   int64
	genTotal      int64
	// Last KV transfer of a prefill (engine model only).
	xferMS   float64
	xferGBps float64
}

// loadTracker keeps the per-rank load of the requests in flight.
type loadTracker struct {
	mu    sync.Mutex
	ranks []rankLoad
	now   func() time.Time
}

// newLoadTracker returns a tracker for dpSize ranks.
func newLoadTracker(dpSize int) *loadTracker {
	return &loadTracker{ranks: make([]rankLoad, dpSize), now: time.Now}
}

// loadHandle is one item's claim on a rank. Its methods are safe to call in
// any order; release is idempotent.
type loadHandle struct {
	t        *loadTracker
	rank     int
	phase    phase
	tokens   int
	released bool
}

// admit claims promptTokens of KV on rank in phase p.
func (t *loadTracker) admit(rank, promptTokens int, p phase) *loadHandle {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &t.ranks[rank]
	r.usedTokens += promptTokens
	r.promptTotal += int64(promptTokens)
	if p == phaseRunning {
		r.running++
	} else {
		r.transfer++
	}
	return &loadHandle{t: t, rank: rank, phase: p, tokens: promptTokens}
}

// run moves the item from the transfer queue to running.
func (h *loadHandle) run() {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	if h.released || h.phase == phaseRunning {
		return
	}
	r := &h.t.ranks[h.rank]
	r.transfer--
	r.running++
	h.phase = phaseRunning
}

// addToken accounts one generated token.
func (h *loadHandle) addToken() {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	if h.released {
		return
	}
	r := &h.t.ranks[h.rank]
	r.usedTokens++
	r.genTotal++
	h.tokens++
	sec := h.t.now().Unix()
	b := &r.buckets[sec%int64(len(r.buckets))]
	if b.sec != sec {
		*b = tokenBucket{sec: sec}
	}
	b.n++
}

// release frees the item's KV and request slot.
func (h *loadHandle) release() {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	if h.released {
		return
	}
	h.released = true
	r := &h.t.ranks[h.rank]
	r.usedTokens -= h.tokens
	if h.phase == phaseRunning {
		r.running--
	} else {
		r.transfer--
	}
}

// snapshot returns the current load of every rank.
func (t *loadTracker) snapshot() []rankSnapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now().Unix()
	out := make([]rankSnapshot, len(t.ranks))
	for i := range t.ranks {
		r := &t.ranks[i]
		n := 0
		for _, b := range r.buckets {
			// Count only complete seconds inside the window.
			if b.sec < now && b.sec >= now-throughputWindow {
				n += b.n
			}
		}
		out[i] = rankSnapshot{
			dpRank:        i,
			running:       r.running,
			transfer:      r.transfer,
			usedTokens:    r.usedTokens,
			totalTokens:   r.usedTokens,
			genThroughput: float64(n) / throughputWindow,
			prefixQueries: r.promptTotal,
			promptTotal:   r.promptTotal,
			genTotal:      r.genTotal,
		}
	}
	return out
}
