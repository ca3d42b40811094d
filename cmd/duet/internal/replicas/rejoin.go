package replicas

import (
	"time"

	"go.uber.org/zap"
)

// rejoin is what a replica keeps from losing NATS until it sends what it
// kept meanwhile (guarded by Replicas.mu).
//
// Core NATS delivers a message only to the subscriptions the server has
// when the message arrives, and after a server restart the replicas
// reconnect one after the other (each on its own reconnect wait). An event
// a replica sent as soon as it was back was lost for every peer still
// reconnecting: a route or a pick kept in another replica's outbox later
// reached that peer, the leg that ends its holds never did, and the holds
// stayed until the reservation TTL. So a replica keeps every event in its
// outbox from the outage until rejoinDelay heartbeats after it reconnected
// (time for every replica to reconnect, peers it never heard of included)
// and each peer that was live before the outage has been heard from again
// (a peer's message shows the server has its subscription again), or at
// most peerTimeout heartbeats after the reconnection, after which a silent
// peer counts as gone anyway.
type rejoin struct {
	// holding: events go to the outbox, connected or not.
	holding bool
	// awaited are the peers live when NATS went away; heard those heard
	// from since back, when NATS returned (zero while it is away).
	awaited, heard map[string]struct{}
	back           time.Time
	// flushing: the outbox is being sent (by one goroutine at a time).
	flushing bool
}

// lost records that NATS went away: events are kept from now on, and the
// peers live until now are awaited when it returns.
func (r *Replicas) lost() {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.rejoin.holding {
		r.rejoin.holding = true
		r.rejoin.awaited = r.livePeers(now)
	}
	r.rejoin.back, r.rejoin.heard = time.Time{}, nil
}

// livePeers returns the names of the peers heard from within peerTimeout
// heartbeats of now. Caller holds mu.
func (r *Replicas) livePeers(now time.Time) map[string]struct{} {
	cutoff := now.Add(-peerTimeout * r.opts.Heartbeat)
	live := map[string]struct{}{}
	for name, p := range r.peers {
		if !p.LastSeen.Before(cutoff) {
			live[name] = struct{}{}
		}
	}
	return live
}

// rejoinDelay is how many heartbeats a replica keeps its events after it
// reconnected at least: every replica reconnects within a reconnect wait
// of the server's return.
const rejoinDelay = 2

// rejoined records that NATS returned, tells the peers at once (they wait
// for this replica's word before sending what they kept), and sends the
// outbox after rejoinDelay heartbeats if every awaited peer was heard from
// by then.
func (r *Replicas) rejoined() {
	now := r.now()
	r.mu.Lock()
	if r.rejoin.holding {
		r.rejoin.back, r.rejoin.heard = now, map[string]struct{}{}
	}
	r.mu.Unlock()
	r.publish(r.hello())
	time.AfterFunc(rejoinDelay*r.opts.Heartbeat, r.flushIfReady)
}

// heardFrom records a message from peer, and reports whether peer was
// awaited and not heard from before. Caller holds mu.
func (r *Replicas) heardFrom(peer string) bool {
	j := &r.rejoin
	if !j.holding || j.back.IsZero() {
		return false
	}
	if _, ok := j.awaited[peer]; !ok {
		return false
	}
	if _, ok := j.heard[peer]; ok {
		return false
	}
	j.heard[peer] = struct{}{}
	return true
}

// readyLocked reports whether the kept events can be sent at now: NATS
// has been back for rejoinDelay heartbeats, and every awaited peer was
// heard from since or peerTimeout heartbeats passed. Caller holds mu.
func (r *Replicas) readyLocked(now time.Time) bool {
	j := &r.rejoin
	if !j.holding || j.flushing || j.back.IsZero() || !r.nc.IsConnected() {
		return false
	}
	since := now.Sub(j.back)
	if since < rejoinDelay*r.opts.Heartbeat {
		return false
	}
	return len(j.heard) == len(j.awaited) || since >= peerTimeout*r.opts.Heartbeat
}

// flushIfReady sends the events kept since NATS went away, in order, once
// readyLocked; events published meanwhile join the outbox's tail, and
// publishing goes straight to NATS again only once the outbox is empty.
func (r *Replicas) flushIfReady() {
	r.mu.Lock()
	if !r.readyLocked(r.now()) {
		r.mu.Unlock()
		return
	}
	r.rejoin.flushing = true
	sent := 0
	for len(r.outbox) > 0 {
		out := r.outbox
		r.outbox = nil
		r.mu.Unlock()
		sent += r.sendKept(out)
		r.mu.Lock()
	}
	if r.rejoin.back.IsZero() {
		r.rejoin.flushing = false // NATS went away again meanwhile: keep holding
	} else {
		r.rejoin = rejoin{}
	}
	r.mu.Unlock()
	if sent > 0 {
		r.m.events.WithLabelValues("outbox", "sent").Add(float64(sent))
		r.log.Info("sent the events kept while NATS was away", zap.Int("events", sent))
	}
}

// sendKept publishes kept events and returns how many were sent; each
// failure is counted.
func (r *Replicas) sendKept(out [][]byte) int {
	sent := 0
	for _, data := range out {
		if err := r.nc.Publish(r.opts.Subject, data); err != nil {
			r.m.dropped.WithLabelValues("unknown", "publish").Inc()
			continue
		}
		sent++
	}
	return sent
}
