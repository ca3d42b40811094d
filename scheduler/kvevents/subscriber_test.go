package kvevents

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// recorder is a Handler that records what it was given.
type recorder struct {
	mu     sync.Mutex
	seqs   []uint64
	resets []string
	hashes []uint64
}

func (r *recorder) Apply(seq uint64, b Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seqs = append(r.seqs, seq)
	for _, e := range b.Events {
		r.hashes = append(r.hashes, e.BlockHashes...)
	}
}

func (r *recorder) Reset(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resets = append(r.resets, reason)
}

// snapshot returns copies of what was recorded.
func (r *recorder) snapshot() ([]uint64, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seqs), slices.Clone(r.resets)
}

// waitSeqs waits until the recorder holds n batches.
func (r *recorder) waitSeqs(t *testing.T, n int) []uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if seqs, _ := r.snapshot(); len(seqs) >= n {
			return seqs
		}
		time.Sleep(10 * time.Millisecond)
	}
	seqs, resets := r.snapshot()
	t.Fatalf("waited for %d batches: got %v (resets %q)", n, seqs, resets)
	return nil
}

// freePort returns a free loopback TCP port.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// quiet discards the test publishers' logs (TCP probes make zmq4 log a
// failed handshake).
var quiet = log.New(io.Discard, "", 0)

// publisher plays SGLang's ZmqEventPublisher in Go: a PUB socket, and a
// ROUTER that replays its buffer.
type publisher struct {
	t      *testing.T
	pub    zmq4.Socket
	mu     sync.Mutex
	buffer map[uint64][]byte
	seq    uint64
	// shape is the replay answers': shapeSGLang (the zero value) or
	// shapeVLLM.
	shape replayShape
	// ts is the timestamp of the batches published (1.0 unless set).
	ts float64
	// garbage makes the replay answer with payloads that are not batches.
	garbage bool
}

// replayShape is how a publisher frames its replay answers.
type replayShape int

const (
	// shapeSGLang: ["", topic, seq, payload], as SGLang 0.5.23 answers.
	shapeSGLang replayShape = iota
	// shapeVLLM: ["", seq, payload], as vLLM and older SGLang answer.
	shapeVLLM
)

// String names the shape, for subtests.
func (s replayShape) String() string {
	if s == shapeVLLM {
		return "vllm"
	}
	return "sglang"
}

// frames returns a replay answer of seq and payload to the DEALER id, in
// shape s.
func (s replayShape) frames(id []byte, seq uint64, payload []byte) zmq4.Msg {
	seqFrame := binary.BigEndian.AppendUint64(nil, seq)
	if s == shapeVLLM {
		return zmq4.NewMsgFrom(id, []byte{}, seqFrame, payload)
	}
	return zmq4.NewMsgFrom(id, []byte{}, []byte{}, seqFrame, payload)
}

// startPublisher binds a PUB on pubPort, and a ROUTER on replayPort when
// it is not 0.
func startPublisher(t *testing.T, ctx context.Context, pubPort, replayPort int) *publisher {
	t.Helper()
	return startShapedPublisher(t, ctx, pubPort, replayPort, shapeSGLang)
}

// startShapedPublisher is startPublisher with replay answers in shape.
func startShapedPublisher(t *testing.T, ctx context.Context, pubPort, replayPort int, shape replayShape) *publisher {
	t.Helper()
	p := &publisher{t: t, pub: zmq4.NewPub(ctx, zmq4.WithLogger(quiet)), buffer: map[uint64][]byte{}, shape: shape, ts: 1}
	if err := p.pub.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", pubPort)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.pub.Close() })
	if replayPort != 0 {
		router := zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")), zmq4.WithLogger(quiet))
		if err := router.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { router.Close() })
		go p.serveReplay(router)
	}
	return p
}

// serveReplay answers replay requests as SGLang's publisher does.
func (p *publisher) serveReplay(router zmq4.Socket) {
	for {
		msg, err := router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var seqs []uint64
		for s := range p.buffer {
			if s >= start {
				seqs = append(seqs, s)
			}
		}
		slices.Sort(seqs)
		for _, s := range seqs {
			payload := p.buffer[s]
			if p.garbage {
				payload = []byte("garbage")
			}
			_ = router.Send(p.shape.frames(id, s, payload))
		}
		p.mu.Unlock()
		_ = router.Send(p.shape.frames(id, endSeq, []byte{}))
	}
}

// batchAt encodes a batch of one BlockStored event with hash h, stamped
// ts.
func batchAt(t *testing.T, h int64, ts float64) []byte {
	t.Helper()
	b, err := msgpack.Marshal([]any{ts, []any{map[string]any{"type": "BlockStored", "block_hashes": []int64{h},
		"parent_block_hash": nil, "token_ids": []int{1, 2}, "block_size": 2, "lora_id": nil}}, 0})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// publish sends the next batch; skip leaves it out of the PUB socket (a
// lost batch), though the replay buffer keeps it.
func (p *publisher) publish(skip bool) {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	payload := batchAt(p.t, int64(seq), p.ts)
	p.buffer[seq] = payload
	p.mu.Unlock()
	if skip {
		return
	}
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
		p.t.Fatal(err)
	}
}

// subscribe starts a subscriber of src and waits until it receives: the
// publisher sends probes until one arrives (PUB drops messages before a
// subscriber joins).
func subscribe(t *testing.T, ctx context.Context, src Source, p *publisher) (*Subscriber, *recorder) {
	t.Helper()
	rec := &recorder{}
	s := NewSubscriber(src, rec, zap.NewNop())
	s.RetryMin = 20 * time.Millisecond
	go s.Run(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p.publish(false)
		time.Sleep(20 * time.Millisecond)
		if seqs, _ := rec.snapshot(); len(seqs) > 0 {
			return s, rec
		}
	}
	t.Fatal("the subscriber never received a batch")
	return nil, nil
}

// TestSubscriberSequence: in order, a gap replayed, a gap lost without a
// replay socket, a publisher restart, garbage.
func TestSubscriberSequence(t *testing.T) {
	for _, tc := range []struct {
		name   string
		replay bool
	}{{"with replay", true}, {"without replay", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pubPort, replayPort := freePort(t), 0
			src := Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pubPort)}
			if tc.replay {
				replayPort = freePort(t)
				src.Replay = fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)
			}
			p := startPublisher(t, ctx, pubPort, replayPort)
			s, rec := subscribe(t, ctx, src, p)
			seqs, _ := rec.snapshot()
			first := seqs[0]

			// Two batches lost on the PUB socket, then one that arrives.
			p.publish(false)
			p.publish(true)
			p.publish(true)
			p.publish(false)
			delivered := int(p.seq - first)
			if !tc.replay {
				delivered -= 2
			}
			got := rec.waitSeqs(t, delivered)
			_, resets := rec.snapshot()
			if tc.replay {
				want := make([]uint64, 0, p.seq-first)
				for q := first; q < p.seq; q++ {
					want = append(want, q)
				}
				if !slices.Equal(got, want) || len(resets) != 1 {
					t.Fatalf("got %v, resets %q: want %v, the subscription's reset only", got, resets, want)
				}
			} else if len(resets) != 2 || !strings.Contains(resets[1], "lost") {
				t.Fatalf("resets %q: want the lost batches named", resets)
			}
			// With replay, the batches published before the subscription
			// came back too (the publisher's buffer starts at 0).
			if st := s.Stats(); st.Gaps != 1 || (tc.replay && (first != 0 || st.Replayed < 2)) {
				t.Errorf("stats %+v", st)
			}

			// Garbage, then the publisher starts over at 0.
			if err := p.pub.Send(zmq4.NewMsgFrom([]byte{}, []byte{1, 2}, []byte("garbage"))); err != nil {
				t.Fatal(err)
			}
			p.mu.Lock()
			p.seq = 0
			p.mu.Unlock()
			before, _ := rec.snapshot()
			p.publish(false)
			rec.waitSeqs(t, len(before)+1)
			_, resets = rec.snapshot()
			if !slices.Contains(resets, "malformed message") {
				t.Errorf("resets %q: want the garbage named", resets)
			}
			if st := s.Stats(); st.Malformed != 1 {
				t.Errorf("stats %+v: want the garbage counted", st)
			}
		})
	}
}

// TestSubscriberReconnects: the publisher goes away and comes back on
// the same port; the subscriber resumes (a restart: a reset, then its
// batches from 0).
func TestSubscriberReconnects(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := freePort(t)
	src := Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port)}
	pctx, pcancel := context.WithCancel(ctx)
	p := startPublisher(t, pctx, port, 0)
	_, rec := subscribe(t, ctx, src, p)
	for range 20 { // a sequence well ahead of where the new publisher starts
		p.publish(false)
	}
	rec.waitSeqs(t, 20)
	p.pub.Close()
	pcancel()

	p2 := startPublisher(t, ctx, port, 0)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p2.publish(false)
		time.Sleep(20 * time.Millisecond)
		if _, resets := rec.snapshot(); len(resets) >= 2 {
			if !strings.Contains(resets[1], "restarted") {
				t.Fatalf("resets %q: want the restart named", resets)
			}
			return
		}
	}
	seqs, resets := rec.snapshot()
	t.Fatalf("no reset after the publisher came back: seqs %v, resets %q", seqs, resets)
}

// TestSubscriberAgainstPyZMQ subscribes to a publisher written with
// pyzmq (libzmq) and msgspec, the libraries SGLang publishes with, in
// SGLang's framing and replay protocol (testdata/publisher.py): batches
// arrive in order, and two withheld from the PUB socket come back by
// replay.
//
// It runs with both shapes of replay answer: SGLang 0.5.23's ["", topic,
// seq, payload] and vLLM's (and older SGLang's) ["", seq, payload].
func TestSubscriberAgainstPyZMQ(t *testing.T) {
	python := os.Getenv("DUET_PYTHON")
	if python == "" {
		t.Skip("DUET_PYTHON is not set: run through make (make unit, make test), which installs pyzmq and msgspec in .venv")
	}
	for _, shape := range []replayShape{shapeSGLang, shapeVLLM} {
		t.Run(shape.String(), func(t *testing.T) { testAgainstPyZMQ(t, python, shape) })
	}
}

// testAgainstPyZMQ is TestSubscriberAgainstPyZMQ with replay answers in
// shape.
func testAgainstPyZMQ(t *testing.T, python string, shape replayShape) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubPort, replayPort := freePort(t), freePort(t)
	cmd := exec.CommandContext(ctx, python, "testdata/publisher.py", fmt.Sprint(pubPort), fmt.Sprint(replayPort), shape.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("publisher.py: %q", lines.Text())
	}
	rec := &recorder{}
	s := NewSubscriber(Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)}, rec, zap.NewNop())
	s.RetryMin = 20 * time.Millisecond
	go s.Run(ctx)
	// publisher.py sends probes (batches with hash -1) until told to go.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := fmt.Fprintln(stdin, "probe"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if seqs, _ := rec.snapshot(); len(seqs) > 0 {
			break
		}
	}
	before, _ := rec.snapshot()
	if len(before) == 0 {
		t.Fatal("no probe arrived")
	}
	if _, err := fmt.Fprintln(stdin, "go"); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() {
		t.Fatal("publisher.py ended")
	}
	var total uint64
	fmt.Sscan(lines.Text(), &total) // sequence numbers published in all
	seqs := rec.waitSeqs(t, int(total-before[0]))
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("sequence %v is not contiguous", seqs)
		}
	}
	rec.mu.Lock()
	hashes := slices.Clone(rec.hashes)
	rec.mu.Unlock()
	for _, h := range []uint64{100, 101, 102, 103, 104, 105} {
		if !slices.Contains(hashes, h) {
			t.Errorf("hash %d missing from %v", h, hashes)
		}
	}
	// The probes published before the subscription joined came back by
	// replay too (the view is whole from sequence 0), then the two
	// withheld batches.
	if st := s.Stats(); st.Gaps != 1 || st.Replayed < 2 {
		t.Errorf("stats %+v: want one gap, the two withheld batches replayed", st)
	}
	if before[0] != 0 {
		t.Errorf("the first batch applied is %d: want 0, replayed on joining", before[0])
	}
}

// TestSubscriberCatchesUpOnSubscribing: a subscriber that joins a
// publisher with a replay socket gets everything the publisher holds from
// sequence 0 at once, before any new batch (an idle engine publishes
// nothing), and then skips the live batches the replay covered.
// Both shapes of replay answer are read.
func TestSubscriberCatchesUpOnSubscribing(t *testing.T) {
	for _, shape := range []replayShape{shapeSGLang, shapeVLLM} {
		t.Run(shape.String(), func(t *testing.T) { testCatchUp(t, shape) })
	}
}

// testCatchUp is TestSubscriberCatchesUpOnSubscribing with replay answers
// in shape.
func testCatchUp(t *testing.T, shape replayShape) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubPort, replayPort := freePort(t), freePort(t)
	p := startShapedPublisher(t, ctx, pubPort, replayPort, shape)
	for range 3 {
		p.publish(true) // published before anyone subscribed
	}
	rec := &recorder{}
	s := NewSubscriber(Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)}, rec, zap.NewNop())
	s.RetryMin = 20 * time.Millisecond
	go s.Run(ctx)
	if got := rec.waitSeqs(t, 3); !slices.Equal(got, []uint64{0, 1, 2}) {
		t.Fatalf("caught up %v, want 0 1 2", got)
	}
	// Live batches from here on follow without a gap or a second reset.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p.publish(false)
		time.Sleep(20 * time.Millisecond)
		if seqs, _ := rec.snapshot(); len(seqs) > 3 {
			break
		}
	}
	seqs, resets := rec.snapshot()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("sequence %v is not contiguous", seqs)
		}
	}
	if len(seqs) <= 3 || len(resets) != 1 {
		t.Fatalf("seqs %v, resets %q: want live batches after the catch-up and one reset", seqs, resets)
	}
}

// TestParseReplay reads replay answers as a DEALER receives them, in
// SGLang 0.5.23's shape and in vLLM's (and older SGLang's), end markers
// included, and names what is wrong with anything else.
func TestParseReplay(t *testing.T) {
	seq := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	payload := []byte{0x92, 0xcb}
	tests := []struct {
		name        string
		frames      [][]byte
		wantSeq     uint64
		wantPayload []byte
		wantErr     string
	}{
		{name: "sglang", frames: [][]byte{{}, []byte("kv"), seq(7), payload}, wantSeq: 7, wantPayload: payload},
		{name: "sglang end", frames: [][]byte{{}, {}, seq(endSeq), {}}, wantSeq: endSeq, wantPayload: []byte{}},
		{name: "vllm", frames: [][]byte{{}, seq(7), payload}, wantSeq: 7, wantPayload: payload},
		{name: "vllm end", frames: [][]byte{{}, seq(endSeq), {}}, wantSeq: endSeq, wantPayload: []byte{}},
		{name: "no delimiter", frames: [][]byte{seq(7), payload}, wantErr: "2 frames (8 bytes, 2 bytes)"},
		{name: "delimiter not empty", frames: [][]byte{{1}, seq(7), payload}, wantErr: "3 frames"},
		{name: "short sequence", frames: [][]byte{{}, {0, 7}, payload}, wantErr: "a sequence frame of 2 bytes"},
		{name: "five frames", frames: [][]byte{{}, {}, {}, seq(7), payload}, wantErr: "5 frames"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, p, err := parseReplay(tc.frames)
			if tc.wantErr != "" {
				if !errors.Is(err, errReplay) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.wantSeq || !bytes.Equal(p, tc.wantPayload) {
				t.Fatalf("parseReplay = %d, %x, %v; want %d, %x", got, p, err, tc.wantSeq, tc.wantPayload)
			}
		})
	}
}

// TestSubscriberWarnsOnBadReplay: a replay on subscribing whose batches do
// not decode is logged as a warning (it was dropped without a word), and
// the rank's view starts at its next live batch.
func TestSubscriberWarnsOnBadReplay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubPort, replayPort := freePort(t), freePort(t)
	p := startPublisher(t, ctx, pubPort, replayPort)
	p.garbage = true
	p.publish(true)
	core, logs := observer.New(zap.InfoLevel)
	rec := &recorder{}
	s := NewSubscriber(Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)},
		rec, zap.New(core))
	s.RetryMin = 20 * time.Millisecond
	go s.Run(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && logs.FilterMessageSnippet("replay on subscribing failed").Len() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	warned := logs.FilterMessageSnippet("KV event replay on subscribing failed").FilterLevelExact(zap.WarnLevel).All()
	if len(warned) != 1 || !strings.Contains(fmt.Sprint(warned[0].ContextMap()["error"]), "replayed batch 0") {
		t.Fatalf("logs %v: want one warning naming the batch that did not decode", logs.All())
	}
	if seqs, _ := rec.snapshot(); len(seqs) != 0 {
		t.Fatalf("applied %v from a garbage replay", seqs)
	}
}

// TestSubscriberLogsUnreachableOnce: a publisher that cannot be reached is
// logged once, however many times the subscriber retries, and its
// recovery once (it was logged at info level on every retry, every ~6 s
// with the default backoff, forever).
func TestSubscriberLogsUnreachableOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := freePort(t)
	core, logs := observer.New(zap.InfoLevel)
	rec := &recorder{}
	s := NewSubscriber(Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port)}, rec, zap.New(core))
	s.RetryMin, s.RetryMax = time.Millisecond, 5*time.Millisecond
	go s.Run(ctx)
	// Each session dials with 10 retries of RetryMin: a session fails
	// every ~20 ms, so 500 ms hold many.
	time.Sleep(500 * time.Millisecond)
	if got := logs.FilterMessage("KV event publisher not reachable; retrying with backoff, logged again when it connects").Len(); got != 1 || logs.Len() != 1 {
		t.Fatalf("logs %v: want one line saying the publisher is not reachable", logs.All())
	}
	p := startPublisher(t, ctx, port, 0)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p.publish(false)
		time.Sleep(20 * time.Millisecond)
		if seqs, _ := rec.snapshot(); len(seqs) > 0 {
			break
		}
	}
	if got := logs.FilterMessage("KV event publisher reachable: subscribed").Len(); got != 1 {
		t.Fatalf("logs %v: want the recovery logged once", logs.All())
	}
}
