package sim

import (
	"slices"
	"time"
)

// This file is the order of a rank's waiting queue (a decode's prealloc
// queue): first come first served, or SGLang's priority scheduling.
//
// SGLang sorts its waiting queue by (priority × sign, queue entry time)
// before it forms every prefill batch (scheduler.py
// _get_new_batch_prefill_raw → schedule_policy.py calc_priority,
// _sort_by_priority_and_fcfs) and a decode sorts its prealloc queue by
// priority × sign (disaggregation/decode.py pop_preallocated, a stable
// sort), sign being 1
// with --schedule-low-priority-values-first and -1 otherwise. Priorities
// never change, so the model keeps each queue sorted as requests arrive
// instead. It does not model SGLang's priority preemption (a running
// request retracted for a waiting one of much higher priority, on by
// default unless --disable-priority-preemption): a request, once
// admitted, keeps its slot and KV until it finishes.

// enqueue adds q to r's waiting queue: at the end, or with priority
// scheduling after every request that does not start after it (FIFO
// among equal priorities).
func (c *engineCore) enqueue(r *engineRank, q *engineRequest) {
	if !c.p.order.enabled {
		r.waiting = append(r.waiting, q)
		return
	}
	i := len(r.waiting)
	for i > 0 && c.p.order.precedes(q.priority, r.waiting[i-1].priority) {
		i--
	}
	r.waiting = slices.Insert(r.waiting, i, q)
}

// nextWaiting is the index in r's waiting queue of the request to admit
// next at t, -1 when none has arrived by t: the head, or with priority
// scheduling the first one in queue order that has arrived (one submitted
// for a later time is not in SGLang's queue yet, whatever its priority).
func (c *engineCore) nextWaiting(r *engineRank, t time.Duration) int {
	if !c.p.order.enabled {
		if len(r.waiting) > 0 && r.waiting[0].arrived <= t {
			return 0
		}
		return -1
	}
	for i, q := range r.waiting {
		if q.arrived <= t {
			return i
		}
	}
	return -1
}

// nextArrival is, on a rank that prefills, when the next waiting request
// that could be admitted before the ones already there arrives after t:
// the head's arrival, or with priority scheduling the earliest arrival of
// the requests queued ahead of the first one that has arrived.
func (c *engineCore) nextArrival(r *engineRank, t time.Duration) (time.Duration, bool) {
	if c.p.mode == ModeDecode || len(r.waiting) == 0 {
		return 0, false
	}
	if !c.p.order.enabled {
		at := r.waiting[0].arrived
		return at, at > t
	}
	at := never
	for _, q := range r.waiting {
		if q.arrived <= t {
			break
		}
		at = min(at, q.arrived)
	}
	return at, at != never
}

// dequeue removes the i-th request of a waiting queue.
func dequeue(list []*engineRequest, i int) []*engineRequest {
	if i == 0 {
		return list[1:]
	}
	return slices.Delete(list, i, i+1)
}
