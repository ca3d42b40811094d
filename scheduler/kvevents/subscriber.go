package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"
)

// Source is where one (engine, DP rank) publishes its events.
type Source struct {
	// Endpoint is the rank's PUB socket, tcp://host:port (SGLang: the
	// configured port plus the rank).
	Endpoint string
	// Replay is the rank's ROUTER socket for missed batches; empty when
	// the engine serves none.
	Replay string
	// Topic is the publisher's topic; SGLang's default is "".
	Topic string
}

// Handler receives one rank's events in order. Calls never overlap.
type Handler interface {
	// Apply applies one batch, whose sequence number is seq.
	Apply(seq uint64, b Batch)
	// Reset drops what the rank's events built so far: the subscription
	// (re)started, the publisher restarted, batches were lost and could
	// not be replayed, or a batch was garbage. Apply calls follow.
	Reset(reason string)
}

// Stats counts what a subscriber saw.
type Stats struct {
	Batches, Events, Malformed, Gaps, Replayed, Resets uint64
	// LastBatch is when the last batch arrived; zero before the first.
	LastBatch time.Time
}

// Subscriber keeps one rank's subscription: it connects, reconnects
// with backoff, checks sequence numbers, replays what it missed where the
// engine allows, and hands batches to its Handler.
type Subscriber struct {
	src Source
	h   Handler
	log *zap.Logger

	// RetryMin and RetryMax bound the backoff between connections;
	// ReplayTimeout bounds one replay.
	RetryMin, RetryMax, ReplayTimeout time.Duration

	seq     uint64
	haveSeq bool
	// dedupe skips live batches a catch-up replay covered, until the
	// first newer one.
	dedupe bool
	// unreachable: the last session could not connect (its failure was
	// logged; the next ones are not, until one connects).
	unreachable bool

	batches, events, malformed, gaps, replayed, resets atomic.Uint64
	lastBatch                                          atomic.Int64
}

// NewSubscriber returns a subscriber of src that feeds h.
func NewSubscriber(src Source, h Handler, log *zap.Logger) *Subscriber {
	return &Subscriber{src: src, h: h, log: log.With(zap.String("kv_events", src.Endpoint)),
		RetryMin: 100 * time.Millisecond, RetryMax: 5 * time.Second, ReplayTimeout: 2 * time.Second}
}

// Stats returns the subscriber's counters.
func (s *Subscriber) Stats() Stats {
	st := Stats{Batches: s.batches.Load(), Events: s.events.Load(), Malformed: s.malformed.Load(),
		Gaps: s.gaps.Load(), Replayed: s.replayed.Load(), Resets: s.resets.Load()}
	if ns := s.lastBatch.Load(); ns != 0 {
		st.LastBatch = time.Unix(0, ns)
	}
	return st
}

// Run subscribes until ctx ends. It logs once per change of the
// connection's state: when a connected session ends, when the publisher
// cannot be reached (not again while it stays so), and when it connects
// again; the retries in between log at debug level.
func (s *Subscriber) Run(ctx context.Context) {
	backoff := s.RetryMin
	for ctx.Err() == nil {
		connected, received, err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if received {
			backoff = s.RetryMin
		}
		switch {
		case connected:
			s.log.Info("KV event subscription ended; reconnecting", zap.Error(err), zap.Duration("after", backoff))
		case !s.unreachable:
			s.unreachable = true
			s.log.Info("KV event publisher not reachable; retrying with backoff, logged again when it connects",
				zap.Error(err), zap.Duration("retry_max", s.RetryMax))
		default:
			s.log.Debug("KV event publisher still not reachable", zap.Error(err), zap.Duration("after", backoff))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, s.RetryMax)
	}
}

// session connects once and receives until the socket fails; connected
// reports whether it connected, received whether any message arrived.
func (s *Subscriber) session(ctx context.Context) (connected, received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(s.RetryMin), zmq4.WithAutomaticReconnect(true))
	defer sub.Close()
	if err := sub.Dial(s.src.Endpoint); err != nil {
		return false, false, fmt.Errorf("dial %s: %w", s.src.Endpoint, err)
	}
	if s.unreachable {
		s.unreachable = false
		s.log.Info("KV event publisher reachable: subscribed")
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, s.src.Topic); err != nil {
		return true, false, fmt.Errorf("subscribe: %w", err)
	}
	if !s.haveSeq {
		s.catchUp(ctx)
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			return true, received, err
		}
		received = true
		s.handle(ctx, msg.Frames)
	}
}

// catchUp, on a new subscription, asks the publisher's replay socket for
// everything it holds from sequence 0, so that a rank whose engine
// publishes nothing for a while (an idle engine) has a view at once
// rather than at its next batch: whole when the publisher still holds its
// first batch, else from the oldest batch it holds (the view then warms
// up). The replay's last batch is the publisher's newest (Batch.Current),
// however old: history, not lag. Live batches the replay already covered
// are then skipped (dedupe). Without a replay socket, when the publisher
// holds nothing, or when the replay fails (logged), the first live batch
// starts the view.
func (s *Subscriber) catchUp(ctx context.Context) {
	if s.src.Replay == "" {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, s.ReplayTimeout)
	defer cancel()
	got, err := fetchReplay(rctx, s.src.Replay, 0, endSeq)
	switch {
	case err != nil && ctx.Err() != nil:
		return
	case err != nil:
		s.log.Warn("KV event replay on subscribing failed; the rank's view starts at its next live batch",
			zap.String("replay", s.src.Replay), zap.Error(err))
		return
	case len(got) == 0:
		s.log.Info("KV event replay on subscribing: the publisher holds no batch; the rank's view starts at its first",
			zap.String("replay", s.src.Replay))
		return
	}
	s.reset("subscribed")
	s.applyReplayed(got, true)
	s.dedupe = true
	s.log.Info("KV events replayed on subscribing", zap.Uint64("from", got[0].seq), zap.Int("batches", len(got)))
}

// endSeq is the replay's end marker (-1).
const endSeq = ^uint64(0)

// handle checks one message's sequence and applies it.
func (s *Subscriber) handle(ctx context.Context, frames [][]byte) {
	seq, b, err := parseMessage(frames)
	if err != nil {
		s.malformed.Add(1)
		s.log.Warn("malformed KV event message; the rank's events start over", zap.Error(err))
		s.reset("malformed message")
		s.haveSeq, s.dedupe = false, false
		return
	}
	if s.dedupe {
		if seq <= s.seq {
			return // the catch-up replay applied it already
		}
		s.dedupe = false
	}
	// A new subscription or a restarted publisher starts the view over:
	// what the publisher sent before this batch may still be in its
	// replay buffer (a restarted one's whole short history), and with it
	// the view is whole.
	fromStart := false
	switch {
	case !s.haveSeq:
		s.reset("subscribed")
		fromStart = true
	case seq <= s.seq:
		s.reset(fmt.Sprintf("sequence went back from %d to %d: the publisher restarted", s.seq, seq))
		fromStart = true
	case seq > s.seq+1:
		s.gaps.Add(1)
		if !s.replay(ctx, s.seq+1, seq) {
			s.reset(fmt.Sprintf("batches %d to %d lost", s.seq+1, seq-1))
		}
	}
	if fromStart && seq > 0 && s.replay(ctx, 0, seq) {
		s.log.Info("KV events replayed from the publisher's first batch", zap.Uint64("batches", seq))
	}
	s.apply(seq, b)
}

// reset counts a reset and passes it on.
func (s *Subscriber) reset(reason string) {
	s.resets.Add(1)
	s.h.Reset(reason)
}

// applyReplayed hands on, in order, batches a replay returned, marked as
// such; current marks the last as the publisher's newest (Batch.Current).
func (s *Subscriber) applyReplayed(got []replayed, current bool) {
	for i, r := range got {
		r.batch.Replayed = true
		r.batch.Current = current && i == len(got)-1
		s.apply(r.seq, r.batch)
	}
	s.replayed.Add(uint64(len(got)))
}

// apply hands one batch on.
func (s *Subscriber) apply(seq uint64, b Batch) {
	s.seq, s.haveSeq = seq, true
	s.batches.Add(1)
	s.events.Add(uint64(len(b.Events)))
	s.lastBatch.Store(time.Now().UnixNano())
	s.h.Apply(seq, b)
}

// parseMessage reads [topic, seq, payload].
func parseMessage(frames [][]byte) (uint64, Batch, error) {
	if len(frames) != 3 {
		return 0, Batch{}, fmt.Errorf("%d frames, want topic, sequence and payload", len(frames))
	}
	if len(frames[1]) != 8 {
		return 0, Batch{}, fmt.Errorf("a sequence of %d bytes", len(frames[1]))
	}
	b, err := DecodeBatch(frames[2])
	if err != nil {
		return 0, Batch{}, err
	}
	return binary.BigEndian.Uint64(frames[1]), b, nil
}

// replay asks the publisher's replay socket for batches from up to (not
// including) until and applies them; false when it has no replay socket,
// fails, or no longer holds them all.
func (s *Subscriber) replay(ctx context.Context, from, until uint64) bool {
	if s.src.Replay == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, s.ReplayTimeout)
	defer cancel()
	got, err := fetchReplay(ctx, s.src.Replay, from, until)
	switch {
	case err != nil:
	case len(got) > 0 && got[0].seq != from:
		err = fmt.Errorf("the publisher no longer holds batch %d (its oldest is %d)", from, got[0].seq)
	case len(got) != int(until-from):
		err = fmt.Errorf("the publisher returned %d of the %d batches", len(got), until-from)
	}
	if err != nil {
		s.log.Warn("KV event replay failed", zap.Uint64("from", from), zap.Uint64("until", until), zap.Error(err))
		return false
	}
	s.applyReplayed(got, false)
	return true
}

// replayed is one batch a replay returned.
type replayed struct {
	seq   uint64
	batch Batch
}

// errReplay marks a replay answer that breaks the protocol.
var errReplay = errors.New("bad replay answer")

// fetchReplay sends ["", from] to a ROUTER and reads its answers until
// the end marker (sequence -1), keeping those before until: a contiguous
// run from the first batch at or after from, which may start later when
// the publisher no longer holds from (the caller decides). Both shapes of
// answer are read: ["", topic, seq, payload] (SGLang 0.5.23) and ["",
// seq, payload] (vLLM and older SGLang).
func fetchReplay(ctx context.Context, endpoint string, from, until uint64) ([]replayed, error) {
	dealer := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(1))
	defer dealer.Close()
	if err := dealer.Dial(endpoint); err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	start := binary.BigEndian.AppendUint64(nil, from)
	if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, start)); err != nil {
		return nil, fmt.Errorf("send the replay request: %w", err)
	}
	var out []replayed
	next := from
	for {
		msg, err := dealer.Recv()
		if err != nil {
			return nil, fmt.Errorf("receive the replay: %w", err)
		}
		seq, payload, err := parseReplay(msg.Frames)
		if err != nil {
			return nil, err
		}
		if seq == endSeq {
			return out, nil
		}
		if seq < next || seq >= until {
			continue
		}
		if len(out) > 0 && seq != next {
			return nil, fmt.Errorf("%w: batch %d where %d was due", errReplay, seq, next)
		}
		b, err := DecodeBatch(payload)
		if err != nil {
			return nil, fmt.Errorf("replayed batch %d: %w", seq, err)
		}
		out = append(out, replayed{seq: seq, batch: b})
		next = seq + 1
	}
}

// parseReplay reads one replay answer as a DEALER receives it: ["",
// topic, seq, payload] or ["", seq, payload], seq 8 bytes big-endian.
func parseReplay(f [][]byte) (seq uint64, payload []byte, err error) {
	var seqFrame []byte
	switch {
	case len(f) == 4 && len(f[0]) == 0:
		seqFrame, payload = f[2], f[3]
	case len(f) == 3 && len(f[0]) == 0:
		seqFrame, payload = f[1], f[2]
	default:
		return 0, nil, fmt.Errorf("%w: %d frames (%s); want [\"\", topic, seq, payload] or [\"\", seq, payload]",
			errReplay, len(f), frameSizes(f))
	}
	if len(seqFrame) != 8 {
		return 0, nil, fmt.Errorf("%w: a sequence frame of %d bytes, want 8", errReplay, len(seqFrame))
	}
	return binary.BigEndian.Uint64(seqFrame), payload, nil
}

// frameSizes describes frames by their sizes, for errors.
func frameSizes(f [][]byte) string {
	sizes := make([]string, len(f))
	for i, b := range f {
		sizes[i] = fmt.Sprintf("%d bytes", len(b))
	}
	return strings.Join(sizes, ", ")
}
