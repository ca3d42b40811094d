package admit

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Class is a priority class.
type Class struct {
	// Name names the class in configuration, headers and metrics.
	Name string
	// Priority orders the classes: a queued request of a higher class is
	// always let through before any of a lower one, and a full queue sheds
	// lower classes first.
	Priority int
	// WaitLimit is the longest a request of the class waits: one that
	// cannot start within it is refused (at once where the queue's drain
	// rate tells so). Positive.
	WaitLimit time.Duration
	// Share scales the saturation thresholds for the class (0 < Share ≤
	// 1; 0 means 1): a class below 1 stops going through while the
	// engines still have room for a higher one, so that its requests
	// leave the engines' own queues short for the classes above it.
	Share float64
}

// share is c's Share, 1 when unset.
func (c Class) share() float64 {
	if c.Share == 0 {
		return 1
	}
	return c.Share
}

// Config configures a Queue.
type Config struct {
	// Classes are the priority classes, at least one, names unique.
	Classes []Class
	// MaxRequests bounds the requests queued, all classes together.
	MaxRequests int
	// MaxTokens bounds the tokens queued, all classes together.
	MaxTokens int64
	// Weights are the tenants' shares inside a class; a tenant not listed
	// weighs 1.
	Weights map[string]float64
}

// Validate reports the first thing wrong with c.
func (c Config) Validate() error {
	if len(c.Classes) == 0 {
		return errors.New("admit: at least one class is required")
	}
	seen := map[string]bool{}
	for _, cl := range c.Classes {
		if cl.Name == "" {
			return errors.New("admit: a class has no name")
		}
		if seen[cl.Name] {
			return fmt.Errorf("admit: class %q is defined twice", cl.Name)
		}
		seen[cl.Name] = true
		if cl.WaitLimit <= 0 {
			return fmt.Errorf("admit: class %q: wait limit must be positive", cl.Name)
		}
		if !(cl.Share >= 0 && cl.Share <= 1) {
			return fmt.Errorf("admit: class %q: share %v is not in (0, 1]", cl.Name, cl.Share)
		}
	}
	if c.MaxRequests <= 0 {
		return errors.New("admit: the queue's request bound must be positive")
	}
	if c.MaxTokens <= 0 {
		return errors.New("admit: the queue's token bound must be positive")
	}
	for t, w := range c.Weights {
		if !(w > 0) || math.IsInf(w, 0) {
			return fmt.Errorf("admit: tenant %q: weight must be positive", t)
		}
	}
	return nil
}

// Request is what the queue knows of one request.
type Request struct {
	// Class is the request's class: its index in Config.Classes.
	Class int
	// Tenant is who sent it; "" is a tenant like any other.
	Tenant string
	// Tokens is its cost: the tokens it will occupy the engines with.
	// Fairness between tenants is in these.
	Tokens int64
	// MaxWait, when positive, caps the class's wait limit for this
	// request: the longest its caller can hold it (Envoy waits no longer
	// for duet's answer). 0 leaves the class's limit.
	MaxWait time.Duration
}

// WaitLimit is how long r may wait in a queue whose classes are classes:
// its class's wait limit, or r.MaxWait where that is shorter.
func (r Request) WaitLimit(classes []Class) time.Duration {
	limit := classes[r.Class].WaitLimit
	if r.MaxWait > 0 && r.MaxWait < limit {
		return r.MaxWait
	}
	return limit
}

// Reasons a request is refused.
var (
	// ErrQueueFull: the queue was full and held nothing of a lower class.
	ErrQueueFull = errors.New("the queue is full")
	// ErrWaitLimit: the request could not start within its class's wait
	// limit (foreseen at arrival, or reached in the queue).
	ErrWaitLimit = errors.New("the request cannot start within its class's wait limit")
	// ErrShed: the request was queued, and a request of a higher class
	// took its place in the full queue.
	ErrShed = errors.New("shed for a request of a higher class")
	// ErrClosed: duet is shutting down.
	ErrClosed = errors.New("duet is shutting down")
	// ErrProxyTimeout: the request was queued, and the proxy holding its
	// answer (Envoy, at its ext_proc message timeout) stopped waiting
	// before duet answered. The Admitter reports it when the context it
	// was given is cancelled with this cause (context.WithCancelCause).
	ErrProxyTimeout = errors.New("the proxy stopped waiting for duet's answer")
)

// Entry is one queued request.
type Entry struct {
	// Request is what was queued.
	Request Request
	// Arrived is when it was queued, Deadline when its wait limit ends.
	Arrived, Deadline time.Time

	seq           uint64
	start, finish float64 // start-time fair queuing tags, in weighted tokens
	index         int     // in its class's heap; -1 once out of the queue
	// ready, for the Admitter: where the outcome goes.
	ready chan error
}

// Queued reports whether e is still in its queue.
func (e *Entry) Queued() bool { return e.index >= 0 }

// classQueue is one class's requests.
type classQueue struct {
	byStart entryHeap
	// arrivals is in arrival order (so in deadline order: one wait limit
	// per class); entries that left are skipped lazily.
	arrivals []*Entry
	// vtime is the class's virtual time: the start tag of the request let
	// through last.
	vtime float64
	// last is each tenant's latest finish tag, while the tenant has
	// requests queued or the class's virtual time has not passed it.
	last   map[string]float64
	tokens int64
}

// Queue is the bookkeeping of queued requests: strict priority between
// classes, start-time fair queuing between the tenants of a class, bounds,
// shedding, and the rate it drains at. It is not safe for concurrent use,
// and takes the time from its caller.
type Queue struct {
	cfg     Config
	classes []classQueue
	// byPriority lists class indexes from the highest priority down.
	byPriority []int
	n          int
	tokens     int64
	seq        uint64
	drain      drainRate
}

// NewQueue returns an empty queue.
func NewQueue(cfg Config) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	q := &Queue{cfg: cfg, classes: make([]classQueue, len(cfg.Classes))}
	for i := range q.classes {
		q.classes[i].last = map[string]float64{}
		q.byPriority = append(q.byPriority, i)
	}
	slices.SortStableFunc(q.byPriority, func(a, b int) int { return cfg.Classes[b].Priority - cfg.Classes[a].Priority })
	return q, nil
}

// Config returns the queue's configuration.
func (q *Queue) Config() Config { return q.cfg }

// Len is the number of requests queued.
func (q *Queue) Len() int { return q.n }

// Tokens is the tokens queued.
func (q *Queue) Tokens() int64 { return q.tokens }

// ClassLen is the number of requests of class c queued.
func (q *Queue) ClassLen(c int) int { return q.classes[c].byStart.Len() }

// Top is the priority of the highest class that has a request queued;
// false when the queue is empty.
func (q *Queue) Top() (priority int, ok bool) {
	for _, k := range q.byPriority {
		if q.classes[k].byStart.Len() > 0 {
			return q.cfg.Classes[k].Priority, true
		}
	}
	return 0, false
}

// DrainRate is the rate, in tokens per second, at which requests left the
// queue to be picked while it held some, over the last few seconds; 0
// while it is unknown.
func (q *Queue) DrainRate() float64 { return q.drain.rate() }

// Push queues r at now. It refuses r (ErrQueueFull, ErrWaitLimit) and
// returns a nil entry, or queues it and returns its entry with the
// entries shed to make room (each left the queue; tell them ErrShed).
func (q *Queue) Push(r Request, now time.Time) (e *Entry, shed []*Entry, err error) {
	if r.Class < 0 || r.Class >= len(q.classes) {
		return nil, nil, fmt.Errorf("admit: class %d of %d", r.Class, len(q.classes))
	}
	r.Tokens = max(r.Tokens, 1)
	cq := &q.classes[r.Class]
	limit := r.WaitLimit(q.cfg.Classes)
	e = &Entry{Request: r, Arrived: now, Deadline: now.Add(limit), seq: q.seq}
	e.start = max(cq.vtime, cq.last[r.Tenant])
	e.finish = e.start + float64(r.Tokens)/q.weight(r.Tenant)
	if rate := q.drain.rate(); rate > 0 {
		ahead := q.tokensAhead(e)
		if time.Duration(float64(ahead)/rate*float64(time.Second)) > limit {
			return nil, nil, ErrWaitLimit
		}
	}
	for q.n+1 > q.cfg.MaxRequests || q.tokens+r.Tokens > q.cfg.MaxTokens {
		victim := q.lowestBelow(r.Class)
		if victim == nil {
			return nil, nil, ErrQueueFull
		}
		q.Remove(victim)
		shed = append(shed, victim)
	}
	q.seq++
	cq.last[r.Tenant] = e.finish
	heap.Push(&cq.byStart, e)
	cq.arrivals = append(cq.arrivals, e)
	cq.tokens += r.Tokens
	q.n++
	q.tokens += r.Tokens
	if q.n == 1 {
		q.drain.backlogged(now)
	}
	return e, shed, nil
}

// weight is tenant's share.
func (q *Queue) weight(tenant string) float64 {
	if w, ok := q.cfg.Weights[tenant]; ok {
		return w
	}
	return 1
}

// tokensAhead is the tokens queued that would be let through before e:
// every higher class's, and its own class's requests that start earlier.
func (q *Queue) tokensAhead(e *Entry) int64 {
	var ahead int64
	p := q.cfg.Classes[e.Request.Class].Priority
	for i := range q.classes {
		cq := &q.classes[i]
		switch {
		case q.cfg.Classes[i].Priority > p:
			ahead += cq.tokens
		case i == e.Request.Class:
			for _, o := range cq.byStart {
				if o.start <= e.start {
					ahead += o.Request.Tokens
				}
			}
		}
	}
	return ahead
}

// lowestBelow is the request to shed for one of class c: of the lowest
// class below c's priority that has any, the one that would be let through
// last; nil when there is none.
func (q *Queue) lowestBelow(c int) *Entry {
	p := q.cfg.Classes[c].Priority
	for i := len(q.byPriority) - 1; i >= 0; i-- {
		k := q.byPriority[i]
		if q.cfg.Classes[k].Priority >= p {
			return nil
		}
		if h := q.classes[k].byStart; len(h) > 0 {
			var last *Entry
			for _, o := range h {
				if last == nil || o.start > last.start || o.start == last.start && o.seq > last.seq {
					last = o
				}
			}
			return last
		}
	}
	return nil
}

// Peek returns the request Pop would let through next, or nil.
func (q *Queue) Peek() *Entry {
	for _, k := range q.byPriority {
		if cq := &q.classes[k]; cq.byStart.Len() > 0 {
			return cq.byStart[0]
		}
	}
	return nil
}

// Share is the saturation share of e's class (Class.Share, 1 when unset).
func (q *Queue) Share(e *Entry) float64 { return q.cfg.Classes[e.Request.Class].share() }

// Pop lets the next request through at now: the highest class that has
// any, and in it the earliest start tag (arrival breaks ties). Nil when
// the queue is empty.
func (q *Queue) Pop(now time.Time) *Entry {
	for _, k := range q.byPriority {
		cq := &q.classes[k]
		if cq.byStart.Len() == 0 {
			continue
		}
		e := cq.byStart[0]
		cq.vtime = max(cq.vtime, e.start)
		q.Remove(e)
		q.drain.let(now, e.Request.Tokens)
		return e
	}
	return nil
}

// Remove takes e out of the queue (a client gone, a wait limit reached);
// it does nothing if e already left.
func (q *Queue) Remove(e *Entry) {
	if e.index < 0 {
		return
	}
	cq := &q.classes[e.Request.Class]
	heap.Remove(&cq.byStart, e.index)
	e.index = -1
	cq.tokens -= e.Request.Tokens
	q.n--
	q.tokens -= e.Request.Tokens
	// Forget tenants whose every request left and whose tag the class's
	// virtual time passed: the map stays as large as the queue.
	if f, ok := cq.last[e.Request.Tenant]; ok && f <= cq.vtime {
		delete(cq.last, e.Request.Tenant)
	}
	if cq.byStart.Len() == 0 {
		// An idle class starts afresh: its virtual time moves to the
		// largest tag handed out, so no tenant carries credit or debt.
		for _, f := range cq.last {
			cq.vtime = max(cq.vtime, f)
		}
		clear(cq.last)
		cq.arrivals = cq.arrivals[:0]
	}
}

// Expire takes out, and appends to out, every request whose deadline is at
// or before now.
func (q *Queue) Expire(now time.Time, out []*Entry) []*Entry {
	for i := range q.classes {
		cq := &q.classes[i]
		j := 0
		for ; j < len(cq.arrivals); j++ {
			e := cq.arrivals[j]
			if e.index < 0 {
				continue
			}
			if e.Deadline.After(now) {
				break
			}
			q.Remove(e)
			out = append(out, e)
		}
		if j > 0 && j <= len(cq.arrivals) {
			cq.arrivals = slices.Delete(cq.arrivals, 0, j)
		}
	}
	return out
}

// NextDeadline is the earliest deadline of a queued request; false when
// the queue is empty.
func (q *Queue) NextDeadline() (time.Time, bool) {
	var next time.Time
	found := false
	for i := range q.classes {
		for _, e := range q.classes[i].arrivals {
			if e.index < 0 {
				continue
			}
			if !found || e.Deadline.Before(next) {
				next, found = e.Deadline, true
			}
			break
		}
	}
	return next, found
}

// entryHeap orders a class's entries by start tag, then arrival.
type entryHeap []*Entry

func (h entryHeap) Len() int { return len(h) }
func (h entryHeap) Less(i, j int) bool {
	return h[i].start < h[j].start || h[i].start == h[j].start && h[i].seq < h[j].seq
}
func (h entryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *entryHeap) Push(x any) {
	e := x.(*Entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// drainTau is how long the drain rate remembers: older let-throughs count
// e times less per drainTau.
const drainTau = 5 * time.Second

// drainMinSpan is how long the queue must have held requests before its
// drain rate is believed: too short a span underestimates it, and a low
// rate refuses requests that would have started in time.
const drainMinSpan = time.Second

// drainRate measures the tokens per second let through while requests
// were queued: the capacity the engines freed up, and so how fast a newly
// queued request's turn comes.
type drainRate struct {
	last   time.Time // the last let-through or backlog start; zero while idle
	tokens float64   // decayed tokens let through
	span   float64   // decayed seconds spent backlogged
}

// backlogged notes that the queue started holding requests at now. The
// idle time before it ages what was measured without adding to the span:
// after a long pause the rate is unknown again rather than stale.
func (d *drainRate) backlogged(now time.Time) {
	if !d.last.IsZero() {
		decay := math.Exp(-max(now.Sub(d.last).Seconds(), 0) / drainTau.Seconds())
		d.tokens *= decay
		d.span *= decay
	}
	d.last = now
}

// let records tokens let through at now.
func (d *drainRate) let(now time.Time, tokens int64) {
	if d.last.IsZero() {
		d.last = now
	}
	dt := max(now.Sub(d.last).Seconds(), 0)
	decay := math.Exp(-dt / drainTau.Seconds())
	d.tokens = d.tokens*decay + float64(tokens)
	d.span = d.span*decay + dt
	d.last = now

}

// rate is the tokens per second, or 0 while the span is too short.
func (d *drainRate) rate() float64 {
	if d.span < drainMinSpan.Seconds() {
		return 0
	}
	return d.tokens / d.span
}
