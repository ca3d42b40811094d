package sim

import (
	"context"
	"sync"
	"time"
)

// engineLoop runs one server's engineCore in real time: one goroutine
// advances the model to the clock's current model time, sleeps (on the
// clock, so time-scaled) until the next step end, transfer end or step
// start, and is woken early by new work. Request handlers submit work and
// wait on their request's notify channel; they read its progress under the
// same mutex.
type engineLoop struct {
	mu   sync.Mutex
	core *engineCore
	clk  clock
	wake chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

// newEngineLoop builds the model and starts its loop.
func newEngineLoop(p engineParams, clk clock) *engineLoop {
	ctx, cancel := context.WithCancel(context.Background())
	e := &engineLoop{
		core:   newEngineCore(p),
		clk:    clk,
		wake:   make(chan struct{}, 1),
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go e.run(ctx)
	return e
}

// stop ends the loop and waits for it.
func (e *engineLoop) stop() {
	e.cancel()
	<-e.done
}

// poke wakes the loop.
func (e *engineLoop) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// nowLocked is the model time for a change made now: the clock, but never
// before the last processed event.
func (e *engineLoop) nowLocked() time.Duration {
	return max(e.clk.Now(), e.core.now)
}

// run is the loop.
func (e *engineLoop) run(ctx context.Context) {
	defer close(e.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.mu.Lock()
		e.core.advance(e.clk.Now())
		next, ok := e.core.nextEvent()
		e.mu.Unlock()
		var tick <-chan time.Time
		if ok {
			timer.Reset(max(e.clk.WallUntil(next), 0))
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-tick:
		}
	}
}

// submit queues a request.
func (e *engineLoop) submit(spec requestSpec) (*engineRequest, error) {
	e.mu.Lock()
	q, err := e.core.submit(spec, e.nowLocked())
	e.mu.Unlock()
	if err == nil {
		e.poke()
	}
	return q, err
}

// kvArrived reports that a decode request's KV arrived.
func (e *engineLoop) kvArrived(q *engineRequest) {
	e.mu.Lock()
	e.core.kvArrived(q, e.nowLocked())
	e.mu.Unlock()
	e.poke()
}

// abort removes a request (no-op once it is done).
func (e *engineLoop) abort(q *engineRequest) {
	e.mu.Lock()
	e.core.abort(q, e.nowLocked())
	e.mu.Unlock()
	e.poke()
}

// bootstrapped tells a prefill request that its decode preallocated the
// KV, holding tokens of its prompt already: it leaves the bootstrap queue
// for the waiting queue.
func (e *engineLoop) bootstrapped(q *engineRequest, tokens int) {
	e.mu.Lock()
	e.core.bootstrapped(q, tokens, e.nowLocked())
	e.mu.Unlock()
	e.poke()
}

// setSink makes the engine report its cache events to sink.
func (e *engineLoop) setSink(sink cacheSink) {
	e.mu.Lock()
	e.core.sink = sink
	e.mu.Unlock()
}

// setStageSink makes the engine report its requests' stage latencies to
// sink.
func (e *engineLoop) setStageSink(sink stageSink) {
	e.mu.Lock()
	e.core.stages = sink
	e.mu.Unlock()
}

// locked runs fn under the engine's lock with the current model time,
// then wakes the loop: fn may change the model.
func (e *engineLoop) locked(fn func(core *engineCore, now time.Duration)) {
	e.mu.Lock()
	now := e.nowLocked()
	e.core.advance(now)
	fn(e.core, now)
	e.mu.Unlock()
	e.poke()
}

// progress is a consistent copy of a request's state for its handler.
type progress struct {
	state     reqState
	aborted   bool
	generated int
	cached    int
	maxNew    int
	// Decode radix cache: a decode's match (hostHit of it from the host
	// tier); a prefill's decode prefix (prefixSet) and tokens sent.
	decodePrefix int
	hostHit      int
	prefixSet    bool
	sent         int
}

// progress reads q's state.
func (e *engineLoop) progress(q *engineRequest) progress {
	e.mu.Lock()
	defer e.mu.Unlock()
	return progress{state: q.state, aborted: q.aborted, generated: q.generated, cached: q.cached, maxNew: q.maxNew,
		decodePrefix: q.decodePrefix, hostHit: q.hostHit, prefixSet: q.prefixSet, sent: q.sent}
}

// snapshot returns the live per-rank load.
func (e *engineLoop) snapshot() []rankSnapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.snapshot(e.nowLocked())
}

// balanceRatio returns the mean lockstep balance ratio so far.
func (e *engineLoop) balanceRatio() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.balanceRatio()
}
