package clustersim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// Admission queues requests in duet while the pool is saturated, as duet's
// admission does in production (package scheduler/admit, one queue per
// pool and replica). A request arriving to an empty queue and a pool that
// is not saturated (scheduler.Saturated) is picked at once; otherwise it is
// queued (admit.Queue.Push), or refused there. Whenever the pool may have
// room again (a leg's feedback, a load scrape) queued requests are let
// through one at a time, each picked before the next is judged, while the
// pool is not saturated; a request still queued at its class's wait limit
// is refused.
type Admission struct {
	// Queue configures each replica's queue: the classes, the bounds and
	// the tenants' weights.
	Queue admit.Config
	// DefaultClass names the class of a request whose session names no
	// class of Queue; "" is Queue's first class (as admit.Rules).
	DefaultClass string
	// Saturation says when a target is saturated; every replica's
	// scheduler gets it (scheduler.Config.Saturation).
	Saturation scheduler.SaturationConfig
	// EnginePriority runs every engine with SGLang's priority scheduling
	// (sim.Config.EnablePriorityScheduling) and gives each request its
	// class's priority, as duet writes it (admission.engine_priority).
	EnginePriority bool
}

// The headers a simulated client sends its session's class and tenant in
// (bench.Session.Class and Tenant), read by duet's classification rules
// (admit.Rules) as a gateway's headers are in production.
const (
	ClassHeader  = "x-duet-priority"
	TenantHeader = "x-duet-tenant"
)

// refusedPrefix starts the Err of a request admission refused.
const refusedPrefix = "refused: "

// admission is the run's admission state.
type admission struct {
	cfg        Admission
	classifier *admit.Classifier
	// queues are the replicas' queues, by replica.
	queues []*admit.Queue
	// entries maps each queued entry to its request.
	entries map[*admit.Entry]*request
	// turn is the replica that lets a request through first next time.
	turn int
}

// newAdmission builds the admission of a run with replicas replicas.
func newAdmission(cfg Config, replicas int) (*admission, error) {
	if cfg.Admission == nil {
		return nil, nil
	}
	if cfg.Oracle != OracleNone || cfg.Bypass > 0 {
		return nil, errors.New("clustersim: admission needs duet's scheduler on every request (no oracle, no bypass)")
	}
	a := &admission{cfg: *cfg.Admission, entries: map[*admit.Entry]*request{}}
	names := make([]string, len(a.cfg.Queue.Classes))
	for i, c := range a.cfg.Queue.Classes {
		names[i] = c.Name
	}
	cl, err := admit.Rules{Classes: names, Default: a.cfg.DefaultClass, ClassHeader: ClassHeader, TenantHeader: TenantHeader}.Compile()
	if err != nil {
		return nil, fmt.Errorf("clustersim: admission rules: %w", err)
	}
	a.classifier = cl
	for range replicas {
		q, err := admit.NewQueue(a.cfg.Queue)
		if err != nil {
			return nil, fmt.Errorf("clustersim: %w", err)
		}
		a.queues = append(a.queues, q)
	}
	return a, nil
}

// classify gives q its class (an index of the queue's classes) and tenant
// from its session's headers, and records both on q.
func (a *admission) classify(q *request) int {
	header := func(name string) string {
		switch name {
		case ClassHeader:
			return q.class
		case TenantHeader:
			return q.tenant
		}
		return ""
	}
	class, tenant := a.classifier.Classify(header, q.turnInfo.req.Model, "")
	q.class, q.tenant = a.cfg.Queue.Classes[class].Name, tenant
	return class
}

// take removes e's request from the queued ones and returns it.
func (a *admission) take(e *admit.Entry) *request {
	q := a.entries[e]
	delete(a.entries, e)
	return q
}

// nextDeadline is the earliest wait limit of any queued request.
func (a *admission) nextDeadline() (at time.Duration, ok bool) {
	if a == nil {
		return 0, false
	}
	for _, q := range a.queues {
		if t, found := q.NextDeadline(); found && (!ok || t.Sub(epoch) < at) {
			at, ok = t.Sub(epoch), true
		}
	}
	return at, ok
}

// admitArrival handles q's arrival with admission: picked at once when
// its replica's queue is empty, no other replica holds a request of its
// class's priority or higher queued, and the pool is not saturated at its
// class's share of the thresholds; else queued or refused.
func (r *run) admitArrival(ctx context.Context, q *request) {
	a := r.adm
	class := a.classify(q)
	sched, queue := r.scheds[q.replica], a.queues[q.replica]
	cost := sched.Cost(r.schedRequest(q))
	cl := a.cfg.Queue.Classes[class]
	share := cl.Share
	if share == 0 {
		share = 1
	}
	if queue.Len() == 0 && !a.peerAhead(q.replica, cl.Priority, true) && !sched.SaturatedAt(share) {
		r.send(ctx, q)
		return
	}
	e, shed, err := queue.Push(admit.Request{Class: class, Tenant: q.tenant, Tokens: cost}, epoch.Add(r.now))
	for _, v := range shed {
		r.refuse(a.take(v), admit.ErrShed)
	}
	if err != nil {
		r.refuse(q, err)
		return
	}
	q.queued = true
	a.entries[e] = q
}

// admitQueued lets each replica's queue head through while no other
// replica holds a more important request queued and the pool is not
// saturated at the head's class's share of the thresholds, each picked
// before the next is judged; then it refuses those whose wait limit has
// come. Replicas take turns, one request each,
// from a turn that moves on every call: concurrent replicas race for the
// room that frees up, and none may always win it.
func (r *run) admitQueued(ctx context.Context) {
	a := r.adm
	if a == nil {
		return
	}
	now := epoch.Add(r.now)
	n := len(a.queues)
	for open := true; open; {
		open = false
		for k := range n {
			i := (a.turn + k) % n
			head := a.queues[i].Peek()
			if head == nil || a.peerAhead(i, a.cfg.Queue.Classes[head.Request.Class].Priority, false) || r.scheds[i].SaturatedAt(a.queues[i].Share(head)) {
				continue
			}
			q := a.take(a.queues[i].Pop(now))
			q.wait = r.now - q.arrival
			r.send(ctx, q)
			r.settle()
			open = true
		}
	}
	a.turn = (a.turn + 1) % n
	for _, queue := range a.queues {
		for _, e := range queue.Expire(now, nil) {
			r.refuse(a.take(e), admit.ErrWaitLimit)
		}
	}
}

// refuse ends q unserved: admission said no (a 429, or a 503). duet
// routed nothing, so no feedback follows.
func (r *run) refuse(q *request, reason error) {
	q.finished = true
	r.active--
	q.refused = admit.Outcome(reason)
	q.err = refusedPrefix + q.refused
	q.doneAt = r.now
	if q.queued {
		q.wait = r.now - q.arrival
	}
}

// schedRequest is q's request to the scheduler, built once: admission
// prices it (scheduler.Cost) at arrival and the pick reuses what that
// prepared.
func (r *run) schedRequest(q *request) *scheduler.Request {
	if q.sreq == nil {
		req := q.turnInfo.req
		req.ID = q.id
		req.Blocks = nil
		if r.cfg.Cache != CacheEstimate {
			req.TokenIDs = q.turnInfo.prompt.TokenIDs
		}
		q.sreq = &req
	}
	return q.sreq
}

// peerAhead reports whether a replica other than self has a request
// queued of priority p or higher (orEqual), or strictly higher: the queue
// heads replicas share over NATS in production (admit.Admitter.ShareWith).
func (a *admission) peerAhead(self, p int, orEqual bool) bool {
	for i, q := range a.queues {
		if i == self {
			continue
		}
		if top, ok := q.Top(); ok && (top > p || orEqual && top == p) {
			return true
		}
	}
	return false
}
