package clustersim

import (
	"container/heap"
	"time"

	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/kvevents"
)

// CacheMode is what the scheduler knows of the engines' prefix caches.
type CacheMode int

// The cache modes.
const (
	// CacheEstimate is duet without a tokenizer: text blocks and its own
	// estimate of what each rank caches (the prefix index).
	CacheEstimate CacheMode = iota
	// CacheTokens is duet with a tokenizer: the prompt's token ids, exact
	// token counts, token blocks, and the estimate.
	CacheTokens
	// CacheEvents is duet with a tokenizer and the engines' KV events:
	// every replica follows every rank's events (a kvevents.Tracker, the
	// production code), delivered Config.EventDelay after the engine
	// model's cache changed.
	CacheEvents
	// CacheOracle gives the scheduler, at each pick, the engine model's
	// true cache of the request's prompt on every rank: the ceiling of
	// what events can tell.
	CacheOracle
)

// String names the mode.
func (m CacheMode) String() string {
	switch m {
	case CacheTokens:
		return "tokens"
	case CacheEvents:
		return "events"
	case CacheOracle:
		return "oracle_view"
	}
	return "estimate"
}

// Token ids. The engine model gives every chat prompt stand-in token ids
// (sim.ParsePromptTokens: one per simulated token, a hash of the prompt up
// to it), and its cache blocks carry them into the KV events, so duet's
// token block hashes of a request and of an event match exactly where the
// engine's blocks do, as a tokenizer's ids would. Blocks without ids (the
// preloaded requests') get ids drawn from their hash.
const vocabulary = 150000

// blockTokenIDs appends stand-in token ids for the block whose hash is h.
func blockTokenIDs(dst []int64, h uint64, blockTokens int) []int64 {
	for j := range blockTokens {
		dst = append(dst, int64(splitmix(h+uint64(j)*0x9e3779b97f4a7c15)%vocabulary))
	}
	return dst
}

// splitmix is SplitMix64's finalizer.
func splitmix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// fedView is a kvevents.Tracker fed by the simulation instead of ZMQ
// sockets: the ranks it follows have no Source.
type fedView struct {
	*kvevents.Tracker[scheduler.TargetKey]
}

// SetTargets implements scheduler.CacheView.
func (v fedView) SetTargets(targets []kvevents.Target[scheduler.TargetKey]) {
	fed := make([]kvevents.Target[scheduler.TargetKey], len(targets))
	for i, t := range targets {
		fed[i] = kvevents.Target[scheduler.TargetKey]{Key: t.Key, Name: t.Name}
	}
	v.Tracker.SetTargets(fed)
}

// oracleView is a scheduler.CacheView that reads the engine models'
// caches for the request being routed (run.routing), plus what duet
// routed to each rank in the last oracleExpectFor that the rank may not
// have computed yet, as the events view's overlay does: without it, a
// tenant's requests routed while its first one queues would see its
// prefix nowhere.
type oracleView struct {
	r        *run
	expected map[scheduler.TargetKey]*kvevents.RankView
}

// oracleExpectFor is how long the oracle counts routed blocks (the
// events view's default ExpectFor).
const oracleExpectFor = kvevents.DefaultExpectFor

// SetTargets implements scheduler.CacheView.
func (*oracleView) SetTargets([]kvevents.Target[scheduler.TargetKey]) {}

// Routed implements scheduler.CacheView.
func (v *oracleView) Routed(key scheduler.TargetKey, blocks []uint64, now time.Time) {
	rv := v.expected[key]
	if rv == nil {
		rv = kvevents.NewRankView(v.r.cfg.Workload.blockTokens, 1)
		v.expected[key] = rv
	}
	rv.Expect(blocks, now.Add(oracleExpectFor).UnixNano(), now.UnixNano())
}

// forget drops what was routed to the engine at url.
func (v *oracleView) forget(url string) {
	for k := range v.expected {
		if k.URL == url {
			delete(v.expected, k)
		}
	}
}

// Match implements scheduler.CacheView: what the rank's cache holds of
// the prompt being routed, in blocks, at most len(blocks), or what was
// routed there, whichever is more.
func (v *oracleView) Match(key scheduler.TargetKey, blocks []uint64) (kvevents.Match, bool) {
	p := v.r.routing
	if p == nil {
		return kvevents.Match{}, false
	}
	e := v.r.engineAt(key.URL)
	bt := max(e.blockTokens, 1)
	tokens := e.model.CachedPrefix(key.Rank, *p)
	if e.role == scheduler.RoleDecode {
		tokens = max(tokens, e.model.DecodeCachedPrefix(key.Rank, *p))
	}
	n := min(tokens/bt, len(blocks))
	if rv := v.expected[key]; rv != nil {
		routed, _ := rv.Match(blocks, epoch.Add(v.r.now).UnixNano())
		n = max(n, routed)
	}
	return kvevents.Match{GPU: n, Any: n, Blocks: e.model.CacheBlocks(key.Rank)}, true
}

// delivery is one batch of KV events due at a replica's view.
type delivery struct {
	at  time.Duration
	seq uint64 // delivery order, for ties
	h   kvevents.Handler
	// bseq is the batch's sequence number on its rank's stream.
	bseq  uint64
	batch kvevents.Batch
}

// deliveryHeap orders deliveries by time, then order.
type deliveryHeap []delivery

func (h deliveryHeap) Len() int { return len(h) }
func (h deliveryHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h deliveryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *deliveryHeap) Push(x any)   { *h = append(*h, x.(delivery)) }
func (h *deliveryHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	*h = old[:len(old)-1]
	return d
}

// followEvents makes engine e report its cache changes to every replica's
// view (CacheEvents).
func (r *run) followEvents(e *engine) {
	streams := make([]uint64, e.dp) // next sequence number per rank
	e.model.OnCacheEvents(func(t time.Duration, rank int, events []kvevents.Event) {
		for i := range events {
			ev := &events[i]
			if ev.Kind == kvevents.BlockStored && ev.TokenIDs == nil {
				ids := make([]int64, 0, len(ev.BlockHashes)*e.blockTokens)
				for _, h := range ev.BlockHashes {
					ids = blockTokenIDs(ids, h, e.blockTokens)
				}
				ev.TokenIDs, ev.BlockSize = ids, e.blockTokens
			}
		}
		b := kvevents.Batch{TS: float64(epoch.Add(t).UnixNano()) / 1e9, Events: events, DPRank: rank, HasRank: true}
		seq := streams[rank]
		streams[rank]++
		key := scheduler.TargetKey{URL: e.url, Rank: rank}
		for _, v := range r.views {
			h := v.Handler(key)
			if h == nil {
				continue
			}
			if r.cfg.EventDelay <= 0 {
				h.Apply(seq, b)
				continue
			}
			r.deliverySeq++
			heap.Push(&r.deliveries, delivery{at: t + r.cfg.EventDelay, seq: r.deliverySeq, h: h, bseq: seq, batch: b})
		}
	})
}

// deliverEvents hands the views the batches due by now.
func (r *run) deliverEvents() {
	for len(r.deliveries) > 0 && r.deliveries[0].at <= r.now {
		d := heap.Pop(&r.deliveries).(delivery)
		d.h.Apply(d.bseq, d.batch)
	}
}
