package replicas

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/routed"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// startNATS runs an embedded NATS server on a free loopback port, or on
// port when it is not 0.
func startNATS(t *testing.T, port int) *server.Server {
	t.Helper()
	if port == 0 {
		port = server.RANDOM_PORT
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("NATS did not start")
	}
	return s
}

// recorder is an Applier that records what it is given and believes the
// entries of the requests it was told about.
type recorder struct {
	mu     sync.Mutex
	picked []scheduler.Picked
	routes map[string]routed.Route
	legs   []accesslog.Completion
}

func (r *recorder) ApplyPicked(p scheduler.Picked) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.picked = append(r.picked, p)
}

func (r *recorder) Record(id string, route routed.Route) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.routes == nil {
		r.routes = map[string]routed.Route{}
	}
	r.routes[id] = route
}

func (r *recorder) Admit(c *accesslog.Completion) (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.routes[c.RequestID]
	return ok, ""
}

func (r *recorder) Complete(_ context.Context, c accesslog.Completion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.legs = append(r.legs, c)
}

// counts returns how many picks, routes and believed legs r holds.
func (r *recorder) counts() (picked, routes, legs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.picked), len(r.routes), len(r.legs)
}

func start(t *testing.T, url, name string, a Applier, reg prometheus.Registerer) *Replicas {
	t.Helper()
	r, err := Start(Options{URL: url, Subject: "duet.test", Name: name, Apply: a, Heartbeat: 50 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// eventually polls cond until it holds or fails the test after 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// One replica's picks, routes and access-log entries reach the other,
// which believes the entries of routed requests only; neither hears
// itself; each knows the other as a live peer.
func TestShare(t *testing.T) {
	ns := startNATS(t, 0)
	defer ns.Shutdown()
	var a, b recorder
	regB := prometheus.NewRegistry()
	ra := start(t, ns.ClientURL(), "a", &a, nil)
	rb := start(t, ns.ClientURL(), "b", &b, regB)
	eventually(t, "the replicas to see each other", func() bool {
		return len(ra.Peers()) == 1 && len(rb.Peers()) == 1
	})

	ra.Picked(scheduler.Picked{RequestID: "r1", Pool: "qwen", Holds: []scheduler.PickedHold{{Role: scheduler.RoleDecode, Target: scheduler.TargetKey{URL: "http://e:1", Rank: 1}, Tokens: 10, Work: 10}},
		Blocks: []uint64{1, 1 << 63, 0xdeadbeefcafe}, Indexed: []scheduler.TargetKey{{URL: "http://e:1", Rank: 1}}})
	ra.Record("r1", routed.Route{Pool: "qwen", Decode: "10.0.0.1:1", DecodeRank: 1, PrefillRank: routed.NoRank})
	ra.Complete(context.Background(), accesslog.Completion{RequestID: "r1", Leg: accesslog.LegDecode, Upstream: "10.0.0.1:1", DPRank: 1})
	ra.Complete(context.Background(), accesslog.Completion{RequestID: "forged", Leg: accesslog.LegDecode, Failed: true})
	ra.Complete(context.Background(), accesslog.Completion{Leg: accesslog.LegRequest, Status: 400}) // no id: not shared
	eventually(t, "b to apply a's pick, route and leg", func() bool {
		p, r, l := b.counts()
		return p == 1 && r == 1 && l == 1
	})
	time.Sleep(100 * time.Millisecond) // anything further would have arrived
	if p, r, l := b.counts(); p != 1 || r != 1 || l != 1 {
		t.Errorf("b applied %d picks, %d routes, %d legs; want 1, 1, 1 (the forged leg not believed)", p, r, l)
	}
	if p, r, l := a.counts(); p+r+l != 0 {
		t.Errorf("a heard its own events: %d, %d, %d", p, r, l)
	}
	b.mu.Lock()
	got := b.picked[0]
	b.mu.Unlock()
	// The pool travels with the pick (each peer applies it to that pool).
	if got.RequestID != "r1" || got.Pool != "qwen" || len(got.Holds) != 1 || got.Holds[0].Target.Rank != 1 || got.Holds[0].Tokens != 10 ||
		fmt.Sprint(got.Blocks) != fmt.Sprint([]uint64{1, 1 << 63, 0xdeadbeefcafe}) || len(got.Indexed) != 1 {
		t.Errorf("b got pick %+v", got)
	}
	// The pick travelled with its route, in one message.
	if n := testutil.ToFloat64(ra.m.events.WithLabelValues(kindPicked, "sent")); n != 0 {
		t.Errorf("a sent %v picks alone; a pick goes with its route", n)
	}
	if n := testutil.ToFloat64(rb.m.events.WithLabelValues(kindLeg, "received")); n != 2 {
		t.Errorf("b received %v legs, want 2 (one believed)", n)
	}
	if n := testutil.ToFloat64(rb.m.connected); n != 1 {
		t.Errorf("duet_sync_connected = %v", n)
	}
}

// With NATS away, a replica routes on (publishing never blocks) and its
// events are buffered; when NATS returns, both reconnect and the buffered
// events arrive, so the views converge again.
func TestNATSOutage(t *testing.T) {
	ns := startNATS(t, 0)
	port := ns.Addr().(*net.TCPAddr).Port
	var a, b recorder
	ra := start(t, ns.ClientURL(), "a", &a, nil)
	rb := start(t, ns.ClientURL(), "b", &b, nil)
	eventually(t, "both connected", func() bool { return ra.Connected() && rb.Connected() })
	ns.Shutdown()
	eventually(t, "a to notice the outage", func() bool { return !ra.Connected() })

	began := time.Now()
	for i := range 100 {
		ra.Record(fmt.Sprint("r", i), routed.Route{Decode: "10.0.0.1:1"})
	}
	if took := time.Since(began); took > 100*time.Millisecond {
		t.Errorf("100 publishes during the outage took %v: publishing must not wait for NATS", took)
	}

	ns2 := startNATS(t, port)
	defer ns2.Shutdown()
	eventually(t, "b to get every event a kept during the outage", func() bool {
		_, r, _ := b.counts()
		return r == 100
	})
	if !ra.Connected() || !rb.Connected() {
		t.Error("a replica did not reconnect")
	}
}

// A replica's admission queue heads reach its peers at once and on every
// heartbeat; a peer that goes silent stops counting.
func TestQueueHeads(t *testing.T) {
	ns := startNATS(t, 0)
	defer ns.Shutdown()
	var a, b, c recorder
	ra := start(t, ns.ClientURL(), "a", &a, nil)
	rb := start(t, ns.ClientURL(), "b", &b, nil)
	rc := start(t, ns.ClientURL(), "c", &c, nil)
	eventually(t, "the replicas to see each other", func() bool {
		return len(ra.Peers()) == 2 && len(rb.Peers()) == 2 && len(rc.Peers()) == 2
	})
	ra.PublishQueue("qwen", admit.Head{Priority: 0, Queued: true})
	rb.PublishQueue("qwen", admit.Head{Priority: 10, Queued: true})
	eventually(t, "c to hear b's head, the highest", func() bool {
		p, q := rc.PeerQueue("qwen")
		return q && p == 10
	})
	if _, q := rc.PeerQueue("llama"); q {
		t.Error("a pool nobody queues shows a queue")
	}
	rb.PublishQueue("qwen", admit.Head{})
	eventually(t, "c to hear b's queue emptied", func() bool {
		p, q := rc.PeerQueue("qwen")
		return q && p == 0
	})
	if p, q := ra.PeerQueue("qwen"); q {
		t.Errorf("a hears its own head: %d", p)
	}
	ra.Close()
	eventually(t, "a's head to stop counting once a is silent", func() bool {
		_, q := rc.PeerQueue("qwen")
		return !q
	})
}

// gatedDialer refuses every connection while closed is set: a replica whose
// reconnection to NATS is slower than its peers'.
type gatedDialer struct {
	closed atomic.Bool
	d      net.Dialer
}

func (g *gatedDialer) Dial(network, address string) (net.Conn, error) {
	if g.closed.Load() {
		return nil, errors.New("gated")
	}
	return g.d.Dial(network, address)
}

// received reports whether r was given request id's route and a leg.
func (r *recorder) received(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.routes[id]; !ok {
		return false
	}
	for _, c := range r.legs {
		if c.RequestID == id {
			return true
		}
	}
	return false
}

// Issue 27: after a NATS restart the replicas reconnect one after the
// other. Core NATS delivers a message only to the subscriptions the server
// has when it arrives, so what a replica published between its own
// reconnection and a slower peer's was lost for that peer: a pick sent
// from the outbox later reached it, the leg that ends it never did, and
// the hold stayed until the reservation TTL (the soak's reserved tokens on
// one survivor). A replica now keeps its events, from the outage until
// rejoinDelay heartbeats after it reconnected and every peer that was live
// before the outage is heard from again, or at most peerTimeout heartbeats;
// a peer that never returns holds nothing up for longer.
func TestEventsAfterReconnectReachSlowerPeer(t *testing.T) {
	for _, tc := range []struct {
		name string
		// returns: the slow peer reconnects once a has published.
		returns bool
	}{
		{name: "the slow peer returns", returns: true},
		{name: "the slow peer never returns", returns: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := startNATS(t, 0)
			port := ns.Addr().(*net.TCPAddr).Port
			var a, b, c recorder
			slow := &gatedDialer{}
			// A heartbeat long enough that peerTimeout of them outlasts a
			// reconnection (ReconnectWait and its jitter).
			const beat = time.Second
			ra := startWith(t, ns.ClientURL(), "a", &a, beat)
			rb := startWith(t, ns.ClientURL(), "b", &b, beat)
			rc := startWith(t, ns.ClientURL(), "c", &c, beat, nats.SetCustomDialer(slow))
			eventually(t, "the replicas to see each other", func() bool {
				return len(ra.Peers()) == 2 && len(rb.Peers()) == 2 && len(rc.Peers()) == 2
			})

			slow.closed.Store(true)
			ns.Shutdown()
			eventually(t, "the replicas to notice the outage", func() bool {
				return !ra.Connected() && !rb.Connected() && !rc.Connected()
			})
			ns2 := startNATS(t, port)
			defer ns2.Shutdown()
			eventually(t, "a and b to reconnect", func() bool { return ra.Connected() && rb.Connected() })

			ra.Picked(scheduler.Picked{RequestID: "r1", Holds: []scheduler.PickedHold{{Role: scheduler.RolePrefill,
				Target: scheduler.TargetKey{URL: "http://p:1", Rank: 0}, Tokens: 14, Work: 14}}})
			ra.Record("r1", routed.Route{Decode: "10.0.0.1:1", Prefill: "10.0.0.2:1", DecodeRank: routed.NoRank})
			ra.Complete(context.Background(), accesslog.Completion{RequestID: "r1", Leg: accesslog.LegPrefill, Upstream: "10.0.0.2:1"})
			if tc.returns {
				slow.closed.Store(false)
				waitFor(t, 10*time.Second, "c to get a's route and leg", func() bool { return c.received("r1") })
			}
			waitFor(t, 10*time.Second, "b to get a's route and leg", func() bool { return b.received("r1") })
		})
	}
}

// startWith starts a replica with heartbeat beat and extra NATS options.
func startWith(t *testing.T, url, name string, a Applier, beat time.Duration, opts ...nats.Option) *Replicas {
	t.Helper()
	r, err := Start(Options{URL: url, Subject: "duet.test", Name: name, Apply: a, Heartbeat: beat, NATS: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// waitFor polls cond until it holds or fails the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
