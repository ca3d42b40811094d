package admit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Gate tells whether a pool has room for one more request of a class
// whose saturation thresholds are scaled by share (Class.Share; 1 for the
// thresholds as configured): false while every target of one of its roles
// is saturated at them. The Admitter calls it under its own lock; it must
// not call back into the Admitter.
type Gate func(share float64) bool

// pollInterval is how often a backlogged Admitter asks its gate again
// without being kicked: engines free up between scrapes and feedback.
const pollInterval = 10 * time.Millisecond

// Refusal is the error of a request the Admitter did not let through.
type Refusal struct {
	// Reason is ErrQueueFull, ErrWaitLimit, ErrShed, ErrClosed or
	// ErrProxyTimeout.
	Reason error
	// Class is the request's class name.
	Class string
	// Waited is how long it was queued (0 when refused on arrival).
	Waited time.Duration
	// RetryAfter is when a client could try again with a chance: about how
	// long the queued tokens take to drain.
	RetryAfter time.Duration
}

// Error implements error.
func (r *Refusal) Error() string {
	if r.Waited > 0 {
		return fmt.Sprintf("class %s: %v (queued %v)", r.Class, r.Reason, r.Waited.Round(time.Millisecond))
	}
	return fmt.Sprintf("class %s: %v", r.Class, r.Reason)
}

// Unwrap returns the reason.
func (r *Refusal) Unwrap() error { return r.Reason }

// Ticket is a request the Admitter let through. Done must be called once
// its pick has reserved (or failed): while a ticket from the queue is out,
// no other queued request is let through, so that the next one is judged
// on loads that include this one.
type Ticket struct {
	a *Admitter
	// Class is the request's class name.
	Class string
	// Queued reports whether the request waited in the queue.
	Queued bool
	// Waited is how long.
	Waited time.Duration
	done   bool
}

// Done reports that the ticket's pick is over.
func (t *Ticket) Done() {
	if t == nil || t.done || !t.Queued {
		return
	}
	t.done = true
	t.a.mu.Lock()
	t.a.pending--
	t.a.mu.Unlock()
	t.a.Kick()
}

// Observer is told what an Admitter does; every method may be called
// concurrently, and must be cheap. Metrics implements it.
type Observer interface {
	// Admitted: a request of class (name) and tenant went on to its pick
	// after waiting (0: at once). How many wait is the queue's own gauge.
	Admitted(class, tenant string, waited time.Duration)
	// Refused: a request was refused for reason (see Refusal).
	Refused(class, tenant string, reason error, waited time.Duration)
	// Left: a queued request's client went away.
	Left(class, tenant string, waited time.Duration)
}

// Peers tells what other replicas' queues of the same pool hold: the
// highest priority any of them has queued, and whether any has a request
// queued at all.
type Peers func() (priority int, queued bool)

// Head is a replica's queue head as its peers hear of it: the highest
// priority queued, or queued false when the queue is empty.
type Head struct {
	Priority int
	Queued   bool
}

// Admitter lets concurrent requests through a Queue: at once while its
// gate is open and nothing waits, otherwise in the queue's order as the
// gate opens, one at a time. Among replicas (ShareWith) nothing waits
// means nothing of the request's priority or higher waits at any of them,
// and a queued request of a lower class than a peer's waits for it.
type Admitter struct {
	gate Gate
	obs  Observer
	now  func() time.Time

	peers   Peers
	publish func(Head)
	head    Head // the head last published; guarded by mu

	mu      sync.Mutex
	q       *Queue
	pending int // tickets from the queue not yet Done
	closed  bool
	running bool // the dispatch loop runs

	kick chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

// NewAdmitter returns an Admitter over a queue configured by cfg, letting
// requests through while gate is open; obs may be nil.
func NewAdmitter(cfg Config, gate Gate, obs Observer) (*Admitter, error) {
	q, err := NewQueue(cfg)
	if err != nil {
		return nil, err
	}
	if gate == nil {
		return nil, errors.New("admit: a gate is required")
	}
	return &Admitter{gate: gate, obs: obs, now: time.Now, q: q, kick: make(chan struct{}, 1), stop: make(chan struct{})}, nil
}

// ShareWith makes the Admitter defer to its peers' queues (peers) and
// tell them of its own (publish is called, outside the Admitter's lock,
// whenever its head changes). Call it before the first Admit.
func (a *Admitter) ShareWith(peers Peers, publish func(Head)) {
	a.peers, a.publish = peers, publish
}

// peerAhead reports whether a peer has a request queued of priority p or
// higher (orEqual), or strictly higher.
func (a *Admitter) peerAhead(p int, orEqual bool) bool {
	if a.peers == nil {
		return false
	}
	top, queued := a.peers()
	return queued && (top > p || orEqual && top == p)
}

// headLocked returns the head to publish when it changed since the last
// one published, or false. Caller holds a.mu.
func (a *Admitter) headLocked() (Head, bool) {
	if a.publish == nil {
		return Head{}, false
	}
	var h Head
	h.Priority, h.Queued = a.q.Top()
	if h == a.head {
		return h, false
	}
	a.head = h
	return h, true
}

// tell publishes h when changed is set.
func (a *Admitter) tell(h Head, changed bool) {
	if changed {
		a.publish(h)
	}
}

// Config returns the Admitter's queue configuration.
func (a *Admitter) Config() Config { return a.q.cfg }

// Admit returns once r may be picked, or with an error: a *Refusal, or the
// context's error when the client went away first. A context cancelled
// with the cause ErrProxyTimeout (the proxy, not the client, gave up) is a
// Refusal for that reason instead. onQueued, when not nil, is called
// (outside any lock) as soon as r is queued, with the longest it may wait
// (r.WaitLimit), so the caller can tell its peer to wait that long.
func (a *Admitter) Admit(ctx context.Context, r Request, onQueued func(limit time.Duration)) (*Ticket, error) {
	class, tenant := a.q.cfg.Classes[r.Class].Name, r.Tenant
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, a.refused(class, tenant, ErrClosed, 0, time.Second)
	}
	cl := a.q.cfg.Classes[r.Class]
	if a.q.Len() == 0 && a.pending == 0 && !a.peerAhead(cl.Priority, true) && a.gate(cl.share()) {
		a.mu.Unlock()
		if a.obs != nil {
			a.obs.Admitted(class, tenant, 0)
		}
		return &Ticket{a: a, Class: class}, nil
	}
	now := a.now()
	e, shed, err := a.q.Push(r, now)
	retry := a.retryAfterLocked()
	if err == nil {
		e.ready = make(chan error, 1)
		a.startLocked()
	}
	head, changed := a.headLocked()
	a.mu.Unlock()
	a.tell(head, changed)
	for _, v := range shed {
		v.ready <- ErrShed
	}
	if err != nil {
		return nil, a.refused(class, tenant, err, 0, retry)
	}
	a.Kick()
	if onQueued != nil {
		onQueued(e.Deadline.Sub(now))
	}
	timer := time.NewTimer(e.Deadline.Sub(now))
	defer timer.Stop()
	select {
	case err = <-e.ready:
	case <-timer.C:
		err = ErrWaitLimit
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	a.mu.Lock()
	if err != nil && e.index < 0 && len(e.ready) > 0 {
		// Let through (or shed) while the timer or the client fired: the
		// queue's word wins.
		err = <-e.ready
	}
	a.q.Remove(e)
	retry = a.retryAfterLocked()
	head, changed = a.headLocked()
	a.mu.Unlock()
	a.tell(head, changed)
	waited := a.now().Sub(e.Arrived)
	switch {
	case err == nil:
		if a.obs != nil {
			a.obs.Admitted(class, tenant, waited)
		}
		return &Ticket{a: a, Class: class, Queued: true, Waited: waited}, nil
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if a.obs != nil {
			a.obs.Left(class, tenant, waited)
		}
		return nil, err
	}
	return nil, a.refused(class, tenant, err, waited, retry)
}

// refused reports and returns a Refusal.
func (a *Admitter) refused(class, tenant string, reason error, waited, retry time.Duration) error {
	if a.obs != nil {
		a.obs.Refused(class, tenant, reason, waited)
	}
	return &Refusal{Reason: reason, Class: class, Waited: waited, RetryAfter: retry}
}

// retryAfterLocked is how long the queued tokens take to drain at the
// measured rate, at least a second; a second while the rate is unknown.
func (a *Admitter) retryAfterLocked() time.Duration {
	rate := a.q.DrainRate()
	if rate <= 0 {
		return time.Second
	}
	return max(time.Duration(float64(a.q.Tokens())/rate*float64(time.Second)).Round(time.Second), time.Second)
}

// Kick asks the Admitter to look at its gate again soon: the pool's loads
// went down. It never blocks.
func (a *Admitter) Kick() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// startLocked starts the dispatch loop if it is not running. Caller holds
// a.mu.
func (a *Admitter) startLocked() {
	if a.running || a.closed {
		return
	}
	a.running = true
	a.wg.Add(1)
	go a.loop()
}

// loop lets queued requests through as the gate opens, until the queue is
// empty or the Admitter closes.
func (a *Admitter) loop() {
	defer a.wg.Done()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-a.kick:
		case <-tick.C:
		}
		a.mu.Lock()
		if head := a.q.Peek(); a.pending == 0 && head != nil && !a.deferLocked() && a.gate(a.q.Share(head)) {
			e := a.q.Pop(a.now())
			a.pending++
			e.ready <- nil
		}
		head, changed := a.headLocked()
		empty := a.q.Len() == 0
		if empty {
			a.running = false
		}
		a.mu.Unlock()
		a.tell(head, changed)
		if empty {
			return
		}
	}
}

// deferLocked reports whether the queue's head must wait for a peer's
// more important request. Caller holds a.mu.
func (a *Admitter) deferLocked() bool {
	top, ok := a.q.Top()
	return ok && a.peerAhead(top, false)
}

// Snapshot is what an Admitter holds now.
type Snapshot struct {
	// Queued and QueuedTokens are the requests waiting and their tokens;
	// ByClass the requests waiting per class name.
	Queued       int
	QueuedTokens int64
	ByClass      map[string]int
	// DrainRate is the tokens per second let through while requests were
	// queued (0: unknown).
	DrainRate float64
	// Open is the gate now.
	Open bool
}

// Snapshot returns what the Admitter holds now.
func (a *Admitter) Snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Snapshot{Queued: a.q.Len(), QueuedTokens: a.q.Tokens(), ByClass: map[string]int{}, DrainRate: a.q.DrainRate(), Open: a.gate(1)}
	for i, c := range a.q.cfg.Classes {
		s.ByClass[c.Name] = a.q.ClassLen(i)
	}
	return s
}

// Close refuses every queued request with ErrClosed, and every later one.
func (a *Admitter) Close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	var out []*Entry
	for a.q.Len() > 0 {
		out = append(out, a.q.Pop(a.now()))
	}
	a.mu.Unlock()
	close(a.stop)
	for _, e := range out {
		e.ready <- ErrClosed
	}
	a.wg.Wait()
}
