package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/zap"

	"github.com/duet-router/duet/scheduler/kvevents"
)

// This file publishes the engine model's cache events over ZMQ as SGLang
// 0.5.23's ZmqEventPublisher does (disaggregation/kv_events.py): per DP
// rank a PUB socket on the configured port plus the rank, messages [topic,
// sequence (8 bytes big-endian, from 0), msgpack KVEventBatch], and a
// ROUTER that replays the last buffer_steps batches to a DEALER that sends
// ["", start sequence], ending with ["", "", -1, ""].

// replayEnd is the sequence frame that ends a replay (-1).
var replayEnd = binary.BigEndian.AppendUint64(nil, ^uint64(0))

// KVEventRankStats counts what one rank's publisher did (GET
// /sim/kv_events, Server.KVEventStats).
type KVEventRankStats struct {
	// Rank is the DP rank; Endpoint and Replay its sockets' addresses
	// (Replay empty without a replay endpoint).
	Rank     int    `json:"dp_rank"`
	Endpoint string `json:"endpoint"`
	Replay   string `json:"replay_endpoint,omitempty"`
	// Up is false while the publisher is down (Faults: kv_events_down_ms).
	Up bool `json:"up"`
	// NextSeq is the sequence number of the next batch.
	NextSeq uint64 `json:"next_seq"`
	// Batches and Events count what was published since the publisher
	// (re)started; Restarts counts its restarts.
	Batches  uint64 `json:"batches"`
	Events   uint64 `json:"events"`
	Restarts uint64 `json:"restarts"`
	// Unpublished counts stored blocks left out because the engine does
	// not know their token ids (text prompts): a real engine always has
	// them.
	Unpublished uint64 `json:"unpublished_blocks"`
	// Dropped counts event lists the engine made while the publisher was
	// down.
	Dropped uint64 `json:"dropped_while_down"`
	// Withheld counts batches kept for replay but not sent (FaultUpdate:
	// kv_events_drop).
	Withheld uint64 `json:"withheld"`
	// Replays counts replay requests served.
	Replays uint64 `json:"replays"`
}

// kvPublisher is one server's KV event publisher: a rankPublisher per DP
// rank. Its methods are safe for concurrent use; publish is the engine's
// cache sink and runs under the engine's lock.
type kvPublisher struct {
	set KVEventsConfig
	log *zap.Logger

	mu     sync.Mutex
	ranks  []*rankPublisher
	up     bool
	closed bool
	// started is set by the first start: only a started publisher comes
	// back after a stop.
	started bool
	// gen counts stops, so that a restart scheduled by an older stop
	// does nothing.
	gen uint64
	// warned is set once text blocks were left out (logged once).
	warned bool
}

// rankPublisher is one DP rank's sockets, sequence and replay buffer.
type rankPublisher struct {
	rank             int
	endpoint, replay string

	pub, router zmq4.Socket
	cancel      context.CancelFunc
	done        chan struct{}

	mu  sync.Mutex
	seq uint64
	// buf holds the last batches for replay.
	buf replayRing
	// shadow holds the tiers of every published block, so that removals
	// of blocks never published (no token ids) are left out.
	shadow map[uint64]uint8
	// withhold is how many of the next batches are kept for replay but
	// not sent (FaultUpdate.KVEventsDrop).
	withhold int
	stats    KVEventRankStats
}

// replayEntry is one buffered batch.
type replayEntry struct {
	seq     uint64
	payload []byte
}

// replayRing keeps the last max batches, oldest first from head.
type replayRing struct {
	max   int
	items []replayEntry
	head  int
}

// push appends e, dropping the oldest batch when the ring is full.
func (r *replayRing) push(e replayEntry) {
	switch {
	case r.max <= 0:
	case len(r.items) < r.max:
		r.items = append(r.items, e)
	default:
		r.items[r.head] = e
		r.head = (r.head + 1) % r.max
	}
}

// from returns the batches from sequence start on, in order.
func (r *replayRing) from(start uint64) []replayEntry {
	var out []replayEntry
	for i := range r.items {
		if e := r.items[(r.head+i)%len(r.items)]; e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// newKVPublisher returns a stopped publisher of dpSize ranks.
func newKVPublisher(set KVEventsConfig, dpSize int, log *zap.Logger) *kvPublisher {
	p := &kvPublisher{set: set, log: log.With(zap.String("kv_events", set.Endpoint))}
	for r := range dpSize {
		rp := &rankPublisher{rank: r, endpoint: rankEndpoint(set.Endpoint, r), shadow: map[uint64]uint8{}}
		if set.ReplayEndpoint != nil {
			rp.replay = rankEndpoint(*set.ReplayEndpoint, r)
		}
		rp.stats = KVEventRankStats{Rank: r, Endpoint: rp.endpoint, Replay: rp.replay}
		p.ranks = append(p.ranks, rp)
	}
	return p
}

// warnWithoutTokenizer says, once at the start of a server without a
// tokenizer (Config.Tokenizer), that its text prompts' blocks will not be
// published: the engine model keys them by characters, and a real engine
// always publishes token ids.
func (p *kvPublisher) warnWithoutTokenizer() {
	p.log.Warn("KV events: without --tokenizer-path only prompts sent as token ids (/generate input_ids) are published; " +
		"text prompts (chat, completions, /generate text) are not, since duet-sim does not know their token ids: " +
		"give --tokenizer-path DIR, the tokenizer of duet's pool")
}

// start binds every rank's sockets and publishes each rank's first batch,
// [AllBlocksCleared], as SGLang's scheduler does at start (its cache's
// first reset). Sequences start at 0 and replay buffers empty.
func (p *kvPublisher) start() error {
	_, err := p.startLocked(func() bool { return true })
	return err
}

// startLocked starts the publisher if ok() holds under its lock, and
// reports whether it did.
func (p *kvPublisher) startLocked(ok func() bool) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up || p.closed || !ok() {
		return false, nil
	}
	for _, rp := range p.ranks {
		if err := rp.open(p.set, p.log); err != nil {
			for _, o := range p.ranks {
				o.close()
			}
			return false, err
		}
	}
	p.up, p.started = true, true
	for _, rp := range p.ranks {
		rp.publish(p, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	}
	p.log.Info("KV event publisher started", zap.Int("dp_size", len(p.ranks)), zap.Bool("replay", p.set.ReplayEndpoint != nil))
	return true, nil
}

// stop closes every rank's sockets and returns the stop's generation.
func (p *kvPublisher) stop() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	if p.up {
		for _, rp := range p.ranks {
			rp.close()
		}
		p.up = false
	}
	return p.gen
}

// current reports whether the publisher may come back after the stop of
// generation gen: it was started once, and neither stopped again nor
// closed since.
func (p *kvPublisher) current(gen uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.currentLocked(gen)
}

// currentLocked is current; the caller holds p.mu.
func (p *kvPublisher) currentLocked(gen uint64) bool {
	return p.gen == gen && p.started && !p.closed
}

// restart starts the publisher again if it is current(gen).
func (p *kvPublisher) restart(gen uint64) error {
	started, err := p.startLocked(func() bool { return p.currentLocked(gen) })
	if started {
		for _, rp := range p.ranks {
			rp.mu.Lock()
			rp.stats.Restarts++
			rp.mu.Unlock()
		}
	}
	return err
}

// shutdown stops the publisher for good.
func (p *kvPublisher) shutdown() {
	p.stop()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
}

// publish is the engine's cache sink: one batch of rank's events.
func (p *kvPublisher) publish(_ time.Duration, rank int, events []kvevents.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rank < 0 || rank >= len(p.ranks) {
		return
	}
	rp := p.ranks[rank]
	if !p.up {
		rp.mu.Lock()
		rp.stats.Dropped++
		rp.mu.Unlock()
		return
	}
	rp.publish(p, events)
}

// drop makes every rank keep its next n batches for replay without
// sending them, as messages lost on the way.
func (p *kvPublisher) drop(n int) {
	for _, rp := range p.ranks {
		rp.mu.Lock()
		rp.withhold += n
		rp.mu.Unlock()
	}
}

// stats returns every rank's counters.
func (p *kvPublisher) stats() []KVEventRankStats {
	p.mu.Lock()
	up := p.up
	p.mu.Unlock()
	out := make([]KVEventRankStats, len(p.ranks))
	for i, rp := range p.ranks {
		rp.mu.Lock()
		out[i] = rp.stats
		out[i].Up = up
		out[i].NextSeq = rp.seq
		rp.mu.Unlock()
	}
	return out
}

// open binds the rank's sockets and resets its sequence and buffers.
func (rp *rankPublisher) open(set KVEventsConfig, log *zap.Logger) error {
	ctx, cancel := context.WithCancel(context.Background())
	stdlog := zap.NewStdLog(log)
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(stdlog))
	if err := pub.Listen(rp.endpoint); err != nil {
		cancel()
		_ = pub.Close()
		return fmt.Errorf("kv events: rank %d PUB socket: %w", rp.rank, err)
	}
	if set.HWM > 0 {
		if err := pub.SetOption(zmq4.OptionHWM, set.HWM); err != nil {
			cancel()
			_ = pub.Close()
			return fmt.Errorf("kv events: rank %d PUB high-water mark: %w", rp.rank, err)
		}
	}
	var router zmq4.Socket
	if rp.replay != "" {
		router = zmq4.NewRouter(ctx, zmq4.WithLogger(stdlog))
		if err := router.Listen(rp.replay); err != nil {
			cancel()
			_ = pub.Close()
			_ = router.Close()
			return fmt.Errorf("kv events: rank %d replay socket: %w", rp.rank, err)
		}
	}
	rp.mu.Lock()
	rp.pub, rp.router, rp.cancel = pub, router, cancel
	rp.seq = 0
	rp.buf = replayRing{max: set.BufferSteps}
	clear(rp.shadow)
	rp.withhold = 0
	rp.stats.Batches, rp.stats.Events = 0, 0
	done := make(chan struct{})
	rp.done = done
	rp.mu.Unlock()
	go rp.serveReplay(router, done, set, log)
	return nil
}

// close closes the rank's sockets and waits for its replay server.
func (rp *rankPublisher) close() {
	rp.mu.Lock()
	pub, router, cancel, done := rp.pub, rp.router, rp.cancel, rp.done
	rp.pub, rp.router, rp.cancel, rp.done = nil, nil, nil, nil
	rp.mu.Unlock()
	if pub == nil {
		return
	}
	cancel()
	_ = pub.Close()
	if router != nil {
		_ = router.Close()
	}
	<-done
}

// publish sends one batch of events (the caller holds p.mu), leaving out
// stored blocks without token ids and removals of blocks never published.
func (rp *rankPublisher) publish(p *kvPublisher, events []kvevents.Event) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	out, skipped := rp.filter(events)
	if skipped > 0 {
		rp.stats.Unpublished += uint64(skipped)
		if !p.warned {
			p.warned = true
			p.log.Warn("KV events: blocks of text prompts are not published (no token ids; send input_ids)",
				zap.Int("dp_rank", rp.rank), zap.Int("blocks", skipped))
		}
	}
	if len(out) == 0 || rp.pub == nil {
		return
	}
	payload, err := encodeBatch(float64(time.Now().UnixNano())/1e9, out, rp.rank)
	if err != nil {
		p.log.Error("KV events: encode batch", zap.Error(err))
		return
	}
	seq := rp.seq
	rp.seq++
	seqFrame := binary.BigEndian.AppendUint64(nil, seq)
	if rp.withhold > 0 {
		rp.withhold--
		rp.stats.Withheld++
	} else if err := rp.pub.Send(zmq4.NewMsgFrom([]byte(p.set.Topic), seqFrame, payload)); err != nil {
		p.log.Warn("KV events: publish", zap.Int("dp_rank", rp.rank), zap.Error(err))
	}
	rp.buf.push(replayEntry{seq: seq, payload: payload})
	rp.stats.Batches++
	rp.stats.Events += uint64(len(out))
}

// filter returns the events a real engine would publish: stores without
// token ids are left out (counted in skipped blocks), and so are removals
// of blocks that were never published. The caller holds rp.mu.
func (rp *rankPublisher) filter(events []kvevents.Event) (out []kvevents.Event, skipped int) {
	out = make([]kvevents.Event, 0, len(events))
	for _, e := range events {
		bit := uint8(kvevents.TierGPU)
		if e.Medium == mediumHost {
			bit = uint8(kvevents.TierHost)
		}
		switch e.Kind {
		case kvevents.AllBlocksCleared:
			clear(rp.shadow)
			out = append(out, e)
		case kvevents.BlockStored:
			if e.TokenIDs == nil {
				skipped += len(e.BlockHashes)
				continue
			}
			for _, h := range e.BlockHashes {
				rp.shadow[h] |= bit
			}
			out = append(out, e)
		case kvevents.BlockRemoved:
			kept := e.BlockHashes[:0:0]
			for _, h := range e.BlockHashes {
				if t := rp.shadow[h]; t&bit != 0 {
					kept = append(kept, h)
					if t &^= bit; t == 0 {
						delete(rp.shadow, h)
					} else {
						rp.shadow[h] = t
					}
				}
			}
			if len(kept) > 0 {
				e.BlockHashes = kept
				out = append(out, e)
			}
		}
	}
	return out, skipped
}

// serveReplay answers replay requests until the sockets close: a DEALER's
// ["", start] (a ROUTER sees [identity, "", start]) gets every buffered
// batch from start on, then the end marker; anything else is ignored, as
// SGLang logs and drops it.
func (rp *rankPublisher) serveReplay(router zmq4.Socket, done chan struct{}, set KVEventsConfig, log *zap.Logger) {
	defer close(done)
	if router == nil {
		return
	}
	topic := []byte(set.Topic)
	for {
		msg, err := router.Recv()
		if err != nil {
			return
		}
		f := msg.Frames
		if len(f) != 3 {
			log.Warn("KV events: invalid replay request", zap.Int("dp_rank", rp.rank), zap.Int("frames", len(f)))
			continue
		}
		start := beUint(f[2])
		rp.mu.Lock()
		batch := rp.buf.from(start)
		rp.stats.Replays++
		rp.mu.Unlock()
		for _, e := range batch {
			if err := router.Send(zmq4.NewMsgFrom(f[0], []byte{}, topic, binary.BigEndian.AppendUint64(nil, e.seq), e.payload)); err != nil {
				break
			}
		}
		_ = router.Send(zmq4.NewMsgFrom(f[0], []byte{}, []byte{}, replayEnd, []byte{}))
	}
}

// beUint reads a big-endian unsigned integer of up to 8 bytes (Python's
// int.from_bytes(b, "big")).
func beUint(b []byte) uint64 {
	var n uint64
	for _, c := range b {
		n = n<<8 | uint64(c)
	}
	return n
}

// encodeBatch encodes a KVEventBatch as msgspec encodes SGLang 0.5.23's
// structures: the batch a positional array [ts, events, attn_dp_rank];
// each event a map tagged by "type", its required fields always present
// (None as nil), its optional ones omitted when None (omit_defaults).
// Block hashes are SGLang's signed 64-bit integers.
func encodeBatch(ts float64, events []kvevents.Event, rank int) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	err := errors.Join(e.EncodeArrayLen(3), e.EncodeFloat64(ts), e.EncodeArrayLen(len(events)))
	for i := range events {
		err = errors.Join(err, encodeEvent(e, &events[i]))
	}
	err = errors.Join(err, e.EncodeInt(int64(rank)))
	if err != nil {
		return nil, fmt.Errorf("encode KV event batch: %w", err)
	}
	return buf.Bytes(), nil
}

// encodeEvent encodes one event as a tagged map.
func encodeEvent(e *msgpack.Encoder, ev *kvevents.Event) error {
	hashes := func() error {
		err := e.EncodeArrayLen(len(ev.BlockHashes))
		for _, h := range ev.BlockHashes {
			err = errors.Join(err, e.EncodeInt(int64(h)))
		}
		return err
	}
	optString := func(key, v string) error {
		if v == "" {
			return nil
		}
		return errors.Join(e.EncodeString(key), e.EncodeString(v))
	}
	switch ev.Kind {
	case kvevents.BlockStored:
		n := 6
		for _, v := range []string{ev.Medium, ev.CacheSalt, ev.LoRAName} {
			if v != "" {
				n++
			}
		}
		err := errors.Join(e.EncodeMapLen(n), e.EncodeString("type"), e.EncodeString("BlockStored"),
			e.EncodeString("block_hashes"), hashes(), e.EncodeString("parent_block_hash"))
		if ev.HasParent {
			err = errors.Join(err, e.EncodeInt(int64(ev.ParentHash)))
		} else {
			err = errors.Join(err, e.EncodeNil())
		}
		err = errors.Join(err, e.EncodeString("token_ids"), e.EncodeArrayLen(len(ev.TokenIDs)))
		for _, id := range ev.TokenIDs {
			err = errors.Join(err, e.EncodeInt(id))
		}
		err = errors.Join(err, e.EncodeString("block_size"), e.EncodeInt(int64(ev.BlockSize)), e.EncodeString("lora_id"))
		if ev.HasLoRA {
			err = errors.Join(err, e.EncodeInt(ev.LoRAID))
		} else {
			err = errors.Join(err, e.EncodeNil())
		}
		return errors.Join(err, optString("medium", ev.Medium), optString("cache_salt", ev.CacheSalt),
			optString("lora_name", ev.LoRAName))
	case kvevents.BlockRemoved:
		n := 2
		if ev.Medium != "" {
			n++
		}
		return errors.Join(e.EncodeMapLen(n), e.EncodeString("type"), e.EncodeString("BlockRemoved"),
			e.EncodeString("block_hashes"), hashes(), optString("medium", ev.Medium))
	case kvevents.AllBlocksCleared:
		return errors.Join(e.EncodeMapLen(1), e.EncodeString("type"), e.EncodeString("AllBlocksCleared"))
	}
	return fmt.Errorf("unknown event kind %v", ev.Kind)
}

// handleKVEventStats serves GET /sim/kv_events: every rank's publisher
// counters (404 without a publisher).
func (s *Server) handleKVEventStats(w http.ResponseWriter, _ *http.Request) {
	if s.kvpub == nil {
		writeDetail(w, http.StatusNotFound, "no KV event publisher (--kv-events-config with \"publisher\": \"zmq\")")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ranks": s.kvpub.stats()})
}

// KVEventStats returns every rank's KV event publisher counters; nil
// without a publisher.
func (s *Server) KVEventStats() []KVEventRankStats {
	if s.kvpub == nil {
		return nil
	}
	return s.kvpub.stats()
}
