// Package replicas keeps several duet replicas' views of the cluster in
// step over NATS (core publish/subscribe), so that any replica may receive
// any request's ext_proc stream or access-log entry and every replica
// still sees all the work in flight.
//
// Each replica publishes, on one subject that all replicas of a gateway
// share:
//   - every pick's holds and prefix blocks (scheduler.Picked);
//   - every routed request's route, so that every replica can check
//     feedback about it (package extproc/routed);
//   - every access-log entry Envoy sent it, believed or not: each receiver
//     checks it against its own record of routes, as it checks Envoy's own
//     entries, and applies it only if it believes it;
//   - a heartbeat, from which the others know their peers.
//
// Ejections and recoveries are not events of their own: every replica
// applies the same leg feedback, so feedback-driven ejections happen on
// every replica at once, and each replica probes and scrapes every engine
// itself. docs/replicas.md says what a replica does while it joins, what
// becomes of a dead replica's holds, and what happens while NATS is away.
package replicas

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/routed"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// Defaults of Options.
const (
	DefaultHeartbeat = time.Second
	// peerTimeout is how many heartbeats a peer may miss before it is
	// counted gone.
	peerTimeout = 3
)

// Applier is where a peer's events go: the scheduler takes picks, the
// route record takes routes (Record) and checks feedback (Admit), and
// Complete applies feedback the record believes.
type Applier interface {
	ApplyPicked(p scheduler.Picked)
	Record(id string, r routed.Route)
	Admit(c *accesslog.Completion) (ok bool, reason string)
	Complete(ctx context.Context, c accesslog.Completion)
}

// Options configure a Replicas.
type Options struct {
	// URL is the NATS server's URL (comma-separated for a cluster).
	URL string
	// Subject is the subject every replica of one gateway publishes and
	// subscribes on; replicas on different subjects share nothing.
	Subject string
	// Name identifies this replica to its peers; it must be unique among
	// them (the pod name, or host and process id).
	Name string
	// NATS are extra connection options: credentials, TLS.
	NATS []nats.Option
	// Heartbeat is the interval of this replica's heartbeat; default
	// DefaultHeartbeat.
	Heartbeat time.Duration
	// Apply receives the peers' events; required.
	Apply Applier
	// Logger; nil means none.
	Logger *zap.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
}

// Peer is another replica, as its heartbeats describe it.
type Peer struct {
	Name string `json:"name"`
	// LastSeen is when its last event arrived.
	LastSeen time.Time `json:"last_seen"`
	// Lag is the delay of its last event, from its clock to this one's.
	Lag time.Duration `json:"lag_ns"`
	// Alive reports whether it was heard from within three heartbeats.
	Alive bool `json:"alive"`
}

// Replicas is one replica's connection to its peers. Its methods are safe
// for concurrent use.
type Replicas struct {
	opts Options
	log  *zap.Logger
	nc   *nats.Conn
	sub  *nats.Subscription
	now  func() time.Time

	mu    sync.Mutex
	peers map[string]*Peer
	// heads are this replica's admission queue heads by pool, and
	// peerHeads each peer's, as last heard (guarded by mu).
	heads     map[string]admit.Head
	peerHeads map[string]map[string]admit.Head
	// outbox holds the events published while NATS was away, and after
	// it returned until the peers are back too (see rejoin).
	outbox [][]byte
	rejoin rejoin

	// pending holds each pick until its request's route is recorded, so
	// that the two travel in one message: a replica killed between them
	// would otherwise leave its peers holding a pick whose entries they
	// cannot check.
	pendingMu sync.Mutex
	pending   map[string]pendingPick

	m metrics

	stop      chan struct{}
	done      sync.WaitGroup
	closeOnce sync.Once
}

// envelope is one message on the subject: exactly one of the event fields
// is set.
type envelope struct {
	From   string                `json:"from"`
	At     int64                 `json:"at"` // Unix ns, the sender's clock
	Picked *pickedWire           `json:"picked,omitempty"`
	Routed *routedEvent          `json:"routed,omitempty"`
	Leg    *accesslog.Completion `json:"leg,omitempty"`
	Hello  bool                  `json:"hello,omitempty"`
	// Queues are the heads of the sender's admission queues, by pool: on
	// every heartbeat, and alone whenever one changes.
	Queues map[string]admit.Head `json:"queues,omitempty"`
}

// pickedWire is a pick on the wire: the prefix block hashes travel as
// little-endian bytes (base64 in JSON), which a peer decodes several times
// faster than 64 decimal numbers.
type pickedWire struct {
	scheduler.Picked
	// Blocks shadows Picked.Blocks.
	Blocks []byte `json:"blocks,omitempty"`
}

// wirePicked packs p for the wire.
func wirePicked(p scheduler.Picked) *pickedWire {
	w := &pickedWire{Picked: p}
	w.Picked.Blocks = nil
	if len(p.Blocks) > 0 {
		w.Blocks = make([]byte, 8*len(p.Blocks))
		for i, h := range p.Blocks {
			binary.LittleEndian.PutUint64(w.Blocks[8*i:], h)
		}
	}
	return w
}

// picked unpacks w; a block list of a length that is not a multiple of 8
// is malformed.
func (w *pickedWire) picked() (scheduler.Picked, bool) {
	p := w.Picked
	if len(w.Blocks)%8 != 0 {
		return p, false
	}
	p.Blocks = make([]uint64, len(w.Blocks)/8)
	for i := range p.Blocks {
		p.Blocks[i] = binary.LittleEndian.Uint64(w.Blocks[8*i:])
	}
	return p, true
}

// pendingPick is a pick waiting for its route.
type pendingPick struct {
	w  *pickedWire
	at time.Time
}

// pendingTimeout is how long a pick waits for its route before it is sent
// alone (its request was rejected after the pick).
const pendingTimeout = 10 * time.Second

// routedEvent is a routed request's route.
type routedEvent struct {
	ID    string       `json:"id"`
	Route routed.Route `json:"route"`
}

// Kinds of event, the "kind" label of the metrics.
const (
	kindPicked = "picked"
	kindRouted = "routed"
	kindLeg    = "leg"
	kindHello  = "hello"
	kindQueue  = "queue"
)

// kind names e's event (a route carries its pick too).
func (e *envelope) kind() string {
	switch {
	case e.Routed != nil:
		return kindRouted
	case e.Picked != nil:
		return kindPicked
	case e.Leg != nil:
		return kindLeg
	case !e.Hello && e.Queues != nil:
		return kindQueue
	}
	return kindHello
}

// Start connects to NATS and subscribes. It does not wait for NATS: while
// the server is unreachable the replica routes alone (events it publishes
// are buffered by the client up to its reconnect buffer, then dropped and
// counted), and it rejoins when the server returns.
func Start(opts Options) (*Replicas, error) {
	if opts.Apply == nil || opts.URL == "" || opts.Subject == "" || opts.Name == "" {
		return nil, errors.New("replicas: URL, Subject, Name and Apply are required")
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	r := &Replicas{opts: opts, log: log, now: time.Now, peers: map[string]*Peer{}, pending: map[string]pendingPick{},
		heads: map[string]admit.Head{}, peerHeads: map[string]map[string]admit.Head{},
		m: newMetrics(), stop: make(chan struct{})}
	if opts.Registerer != nil {
		r.m.register(opts.Registerer, r)
	}
	nopts := append([]nats.Option{
		nats.Name("duet " + opts.Name),
		// A replica never hears its own events.
		nats.NoEcho(),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ConnectHandler(func(*nats.Conn) { r.connected("connected") }),
		nats.ReconnectHandler(func(*nats.Conn) {
			r.connected("reconnected")
			r.rejoined()
		}),
		// Held in the outbox instead: the client's own buffer would be
		// flushed before the peers have subscribed again.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { r.disconnected(err) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { r.asyncError(err) }),
	}, opts.NATS...)
	nc, err := nats.Connect(opts.URL, nopts...)
	if err != nil {
		return nil, fmt.Errorf("replicas: connect to %s: %w", opts.URL, err)
	}
	r.nc = nc
	if nc.IsConnected() {
		r.m.connected.Set(1) // the connect handler logs it
	}
	if r.sub, err = nc.Subscribe(opts.Subject, r.receive); err != nil {
		nc.Close()
		return nil, fmt.Errorf("replicas: subscribe to %s: %w", opts.Subject, err)
	}
	// A slow replica drops events (and counts them) rather than holding
	// the server's memory: 64k messages or 64 MiB pending.
	if err := r.sub.SetPendingLimits(1<<16, 64<<20); err != nil {
		nc.Close()
		return nil, fmt.Errorf("replicas: %w", err)
	}
	r.done.Go(r.heartbeats)
	return r, nil
}

// Close stops the heartbeat and flushes what is buffered, then closes the
// connection.
func (r *Replicas) Close() {
	r.closeOnce.Do(func() {
		close(r.stop)
		r.done.Wait()
		_ = r.nc.Drain()
	})
}

// Picked keeps a pick (scheduler.Config.OnPicked) to publish with its
// request's route (Record), or alone after pendingTimeout.
func (r *Replicas) Picked(p scheduler.Picked) {
	r.pendingMu.Lock()
	r.pending[p.RequestID] = pendingPick{w: wirePicked(p), at: r.now()}
	r.pendingMu.Unlock()
}

// Record publishes a routed request's route (extproc.RouteRecorder),
// together with its pick.
func (r *Replicas) Record(id string, route routed.Route) {
	r.pendingMu.Lock()
	pp := r.pending[id]
	delete(r.pending, id)
	r.pendingMu.Unlock()
	r.publish(&envelope{Picked: pp.w, Routed: &routedEvent{ID: id, Route: route}})
}

// sendStalePicks publishes alone the picks whose route did not follow
// within pendingTimeout.
func (r *Replicas) sendStalePicks() {
	cutoff := r.now().Add(-pendingTimeout)
	var stale []*pickedWire
	r.pendingMu.Lock()
	for id, pp := range r.pending {
		if pp.at.Before(cutoff) {
			stale = append(stale, pp.w)
			delete(r.pending, id)
		}
	}
	r.pendingMu.Unlock()
	for _, w := range stale {
		r.publish(&envelope{Picked: w})
	}
}

// Complete publishes an access-log entry Envoy sent this replica
// (accesslog.Sink). Entries about requests nobody routed (duet's or
// Envoy's own replies) are not published.
func (r *Replicas) Complete(_ context.Context, c accesslog.Completion) {
	if c.RequestID == "" {
		return
	}
	r.publish(&envelope{Leg: &c})
}

// MaxOutbox bounds the events kept while NATS is away; beyond it they are
// dropped and counted.
const MaxOutbox = 1 << 16

// publish sends e, or keeps it in the outbox while NATS is away; a
// failure is counted and logged, never waited on.
func (r *Replicas) publish(e *envelope) {
	e.From, e.At = r.opts.Name, r.now().UnixNano()
	kind := e.kind()
	data, err := json.Marshal(e)
	if err != nil {
		r.m.dropped.WithLabelValues(kind, "malformed").Inc()
		return
	}
	if kind == kindHello || kind == kindQueue {
		if !r.nc.IsConnected() {
			return // state, sent again on the next heartbeat
		}
	} else if r.keep(kind, data) {
		return
	}
	if err := r.nc.Publish(r.opts.Subject, data); err != nil {
		r.m.dropped.WithLabelValues(kind, "publish").Inc()
		r.log.Debug("event not published", zap.String("kind", kind), zap.Error(err))
		return
	}
	r.m.events.WithLabelValues(kind, "sent").Inc()
}

// keep puts an event of kind in the outbox while NATS is away or the
// replica waits for its peers to return (rejoin), and reports whether it
// did; beyond MaxOutbox the event is dropped and counted.
func (r *Replicas) keep(kind string, data []byte) bool {
	r.mu.Lock()
	if !r.rejoin.holding && r.nc.IsConnected() {
		r.mu.Unlock()
		return false
	}
	full := len(r.outbox) >= MaxOutbox
	if !full {
		r.outbox = append(r.outbox, data)
	}
	r.mu.Unlock()
	if full {
		r.m.dropped.WithLabelValues(kind, "outbox_full").Inc()
	}
	return true
}

// receive applies one peer's event.
func (r *Replicas) receive(msg *nats.Msg) {
	var e envelope
	if err := json.Unmarshal(msg.Data, &e); err != nil || e.From == "" {
		r.m.dropped.WithLabelValues("unknown", "malformed").Inc()
		return
	}
	if e.From == r.opts.Name {
		return // another process under this replica's name: a misconfiguration
	}
	now := r.now()
	lag := now.Sub(time.Unix(0, e.At))
	r.mu.Lock()
	p, ok := r.peers[e.From]
	if !ok {
		p = &Peer{Name: e.From}
		r.peers[e.From] = p
		r.log.Info("a peer replica joined", zap.String("peer", e.From))
	}
	p.LastSeen, p.Lag, p.Alive = now, lag, true
	if e.Queues != nil {
		r.peerHeads[e.From] = e.Queues
	}
	back := r.heardFrom(e.From)
	r.mu.Unlock()
	if back {
		r.flushIfReady()
	}
	kind := e.kind()
	r.m.events.WithLabelValues(kind, "received").Inc()
	r.m.lag.Observe(max(lag.Seconds(), 0))
	if e.Picked != nil {
		p, ok := e.Picked.picked()
		if !ok {
			r.m.dropped.WithLabelValues(kind, "malformed").Inc()
			return
		}
		r.opts.Apply.ApplyPicked(p)
	}
	switch kind {
	case kindRouted:
		r.opts.Apply.Record(e.Routed.ID, e.Routed.Route)
	case kindLeg:
		// Believed only as Envoy's own entries are: about a request some
		// replica routed, on the host and rank chosen for that leg.
		if ok, _ := r.opts.Apply.Admit(e.Leg); ok {
			r.opts.Apply.Complete(context.Background(), *e.Leg)
		}
	}
}

// heartbeats publishes a heartbeat every Heartbeat until Close.
func (r *Replicas) heartbeats() {
	tick := time.NewTicker(r.opts.Heartbeat)
	defer tick.Stop()
	r.publish(r.hello())
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
			r.publish(r.hello())
			r.expirePeers()
			r.sendStalePicks()
			r.flushIfReady() // at the latest peerTimeout heartbeats after NATS returned
		}
	}
}

// hello is a heartbeat, with this replica's queue heads.
func (r *Replicas) hello() *envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &envelope{Hello: true, Queues: maps.Clone(r.heads)}
}

// PublishQueue tells the peers the new head of this replica's admission
// queue of pool (admit.Admitter.ShareWith's publish).
func (r *Replicas) PublishQueue(pool string, h admit.Head) {
	r.mu.Lock()
	r.heads[pool] = h
	heads := maps.Clone(r.heads)
	r.mu.Unlock()
	r.publish(&envelope{Queues: heads})
}

// PeerQueue is the highest priority any live peer has queued for pool,
// and whether any has a request queued (admit.Peers).
func (r *Replicas) PeerQueue(pool string) (priority int, queued bool) {
	cutoff := r.now().Add(-peerTimeout * r.opts.Heartbeat)
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, heads := range r.peerHeads {
		p := r.peers[name]
		if p == nil || p.LastSeen.Before(cutoff) {
			continue
		}
		if h, ok := heads[pool]; ok && h.Queued && (!queued || h.Priority > priority) {
			priority, queued = h.Priority, true
		}
	}
	return priority, queued
}

// expirePeers logs peers that stopped being heard from.
func (r *Replicas) expirePeers() {
	cutoff := r.now().Add(-peerTimeout * r.opts.Heartbeat)
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, p := range r.peers {
		if p.Alive && p.LastSeen.Before(cutoff) {
			r.log.Warn("a peer replica is silent; its holds stay until their requests' feedback or the reservation TTL",
				zap.String("peer", name), zap.Time("last_seen", p.LastSeen))
		}
		p.Alive = !p.LastSeen.Before(cutoff)
	}
}

// Peers returns the replicas heard from, by name.
func (r *Replicas) Peers() []Peer {
	cutoff := r.now().Add(-peerTimeout * r.opts.Heartbeat)
	r.mu.Lock()
	out := make([]Peer, 0, len(r.peers))
	for _, p := range r.peers {
		q := *p
		q.Alive = !q.LastSeen.Before(cutoff)
		out = append(out, q)
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Name is this replica's name among its peers.
func (r *Replicas) Name() string { return r.opts.Name }

// Connected reports whether the replica is connected to NATS.
func (r *Replicas) Connected() bool { return r.nc.IsConnected() }

func (r *Replicas) connected(what string) {
	r.m.connected.Set(1)
	r.log.Info("NATS " + what + ": sharing state with the other replicas")
}

func (r *Replicas) disconnected(err error) {
	r.m.connected.Set(0)
	if r.nc != nil && r.nc.IsClosed() {
		return
	}
	r.lost()
	r.log.Warn("NATS unreachable: routing alone until it returns (events are buffered, then dropped and counted)", zap.Error(err))
}

func (r *Replicas) asyncError(err error) {
	if errors.Is(err, nats.ErrSlowConsumer) {
		r.m.dropped.WithLabelValues("unknown", "slow_consumer").Inc()
	}
	r.log.Warn("NATS error", zap.Error(err))
}
