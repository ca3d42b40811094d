package sim

import "time"

// This file is a PD prefill's bootstrap queue (SGLang's
// PrefillBootstrapQueue, disaggregation/prefill.py). A prefill request
// first waits there for its bootstrap: its decode handshakes, preallocates
// the KV once it has room (its prealloc queue) and sends the prefill the
// transfer metadata, the destination KV indices and, with the decode
// radix cache, decode_prefix_len. Only then does the request enter the
// waiting queue (pop_bootstrapped), so a decode short of KV holds its
// prefills back: backpressure. The time spent is the prefill_bootstrap
// stage. A request whose decode never preallocates fails after the
// bootstrap timeout; the HTTP server times that (the model has no clock).

// bootstrapped tells prefill request q, at t, that its decode has
// preallocated the KV and holds tokens of its prompt already
// (decode_prefix_len, 0 without the decode radix cache). A request in the
// bootstrap queue records the prefix, observes prefill_bootstrap and
// joins the waiting queue, behind the requests already there (SGLang
// extends the waiting queue with the bootstrapped requests). A request
// past its bootstrap only records the prefix (setDecodePrefix).
func (c *engineCore) bootstrapped(q *engineRequest, tokens int, t time.Duration) {
	c.setDecodePrefix(q, tokens)
	if q.state != stBootstrap {
		return
	}
	r := c.ranks[q.rank]
	r.bootstrap = remove(r.bootstrap, q)
	c.observeStage(q, latPrefillBootstrap, t-q.arrived)
	// The waiting queue's entry time (SGLang's set_wait_queue_entry_time):
	// prefill_waiting and the queue order start here.
	q.arrived = t
	q.state = stWaiting
	c.enqueue(r, q)
	q.signal()
	c.unstall(r.group, t)
}
