package sim

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/duet-router/duet/scheduler/kvevents"
	"github.com/duet-router/duet/scheduler/prefix"
)

func TestKVEventsConfig(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		dp      int
		wantErr string
		// info is what /server_info's kv_events must hold (nil: null).
		info map[string]any
	}{
		{name: "defaults publish nothing", raw: `{}`, dp: 1},
		{name: "zmq with SGLang's defaults", raw: `{"publisher": "zmq"}`, dp: 2, info: map[string]any{
			"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557.0, "topic": "", "block_size": 16.0, "dp_size": 2.0}},
		{name: "replay and topic", raw: `{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:6000", "bind": true,
			"replay_endpoint": "tcp://127.0.0.1:6100", "topic": "kv", "buffer_steps": 5, "unknown": 1}`, dp: 4,
			info: map[string]any{"publisher": "zmq", "endpoint_host": "127.0.0.1", "endpoint_port_base": 6000.0, "topic": "kv",
				"block_size": 16.0, "dp_size": 4.0, "replay_endpoint_port_base": 6100.0}},
		{name: "ipv6 wildcard", raw: `{"publisher": "zmq", "endpoint": "tcp://[::]:7000"}`, dp: 1,
			info: map[string]any{"publisher": "zmq", "endpoint_host": "[::]", "endpoint_port_base": 7000.0, "topic": "",
				"block_size": 16.0, "dp_size": 1.0}},
		{name: "unknown publisher", raw: `{"publisher": "kafka"}`, dp: 1, wantErr: "Unknown event publisher 'kafka'"},
		{name: "connect-style endpoint", raw: `{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}`, dp: 1,
			wantErr: "binds its PUB sockets only"},
		{name: "ipc endpoint", raw: `{"publisher": "zmq", "endpoint": "ipc:///tmp/kv"}`, dp: 1, wantErr: "tcp:// only"},
		{name: "ports past 65535", raw: `{"publisher": "zmq", "endpoint": "tcp://*:65535"}`, dp: 2, wantErr: "run past 65535"},
		{name: "bad format", raw: `{"publisher": "zmq", "format": "vllm"}`, dp: 1, wantErr: "format must be"},
		{name: "not JSON", raw: `publisher=zmq`, dp: 1, wantErr: "not a valid KVEventsConfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Profile: "dense-8b-h100", DPSize: tc.dp, KVEventsConfig: tc.raw}
			_, err := New(cfg, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var info map[string]any
			get(t, startTest(t, cfg).api.URL+"/server_info").json(t, &info)
			if info["kv_events_config"] != tc.raw {
				t.Fatalf("kv_events_config %v, want the flag's value", info["kv_events_config"])
			}
			got, _ := info["kv_events"].(map[string]any)
			if tc.info == nil && info["kv_events"] != nil || tc.info != nil && !reflect.DeepEqual(got, tc.info) {
				t.Fatalf("kv_events %v, want %v", info["kv_events"], tc.info)
			}
		})
	}
	var info map[string]any
	get(t, startTest(t, Config{}).api.URL+"/server_info").json(t, &info)
	if v, ok := info["kv_events_config"]; !ok || v != nil || info["kv_events"] != nil {
		t.Fatalf("without the flag: kv_events_config %v (present %v), kv_events %v; want both null", v, ok, info["kv_events"])
	}
}

// wireBatches are batches that cover every field duet-sim encodes.
var wireBatches = []struct {
	rank   int
	events []kvevents.Event
}{
	{rank: 0, events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}},
	{rank: 3, events: []kvevents.Event{
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 1 << 63, ^uint64(0), 300}, TokenIDs: seqIDs(64, 16*4),
			BlockSize: 16, Medium: mediumGPU},
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{0x8000_0000_dead_beef}, ParentHash: 300, HasParent: true,
			TokenIDs: seqIDs(151000, 16), BlockSize: 16, Medium: mediumHost},
		{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{300, 1 << 40}, Medium: mediumGPU},
		{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{0x8000_0000_dead_beef}, Medium: mediumHost},
		{Kind: kvevents.AllBlocksCleared},
	}},
	{rank: 1, events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{7}, ParentHash: 1 << 62, HasParent: true,
		TokenIDs: seqIDs(0, 1), BlockSize: 1, Medium: mediumGPU}}},
	{rank: 0, events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: seqBlocks(1<<32, 300),
		TokenIDs: seqIDs(1, 300*16), BlockSize: 16, Medium: mediumGPU}}},
}

// seqIDs returns n token ids from first on.
func seqIDs(first, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(first + i)
	}
	return out
}

// TestEncodeBatchRoundTrip: duet's decoder reads back what duet-sim
// encodes.
func TestEncodeBatchRoundTrip(t *testing.T) {
	for i, b := range wireBatches {
		payload, err := encodeBatch(1764100000.25+float64(i), b.events, b.rank)
		if err != nil {
			t.Fatal(err)
		}
		got, err := kvevents.DecodeBatch(payload)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		want := kvevents.Batch{TS: 1764100000.25 + float64(i), Events: b.events, DPRank: b.rank, HasRank: true}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("batch %d: decoded %+v, want %+v", i, got, want)
		}
	}
}

// TestEncodeBatchMatchesMsgspec: msgspec, strictly typed with SGLang
// 0.5.23's structures, decodes every payload duet-sim encodes, and
// encoding the decoded batch again gives the same bytes: the payloads are
// exactly what SGLang's publisher sends.
func TestEncodeBatchMatchesMsgspec(t *testing.T) {
	python := os.Getenv("DUET_PYTHON")
	if python == "" {
		t.Skip("DUET_PYTHON is not set: run through make (make unit, make test), which installs msgspec in .venv")
	}
	var in strings.Builder
	var payloads [][]byte
	for i, b := range wireBatches {
		payload, err := encodeBatch(float64(i)+0.5, b.events, b.rank)
		if err != nil {
			t.Fatal(err)
		}
		payloads = append(payloads, payload)
		in.WriteString(hex.EncodeToString(payload) + "\n")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "testdata/kvevents_msgspec.py")
	cmd.Stdin = strings.NewReader(in.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kvevents_msgspec.py: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(payloads) {
		t.Fatalf("%d answers for %d payloads: %s", len(lines), len(payloads), out)
	}
	for i, line := range lines {
		var ans struct {
			Error     string
			Reencoded string
			Batch     struct {
				Rank   int
				Events []map[string]any
			}
		}
		if err := json.Unmarshal([]byte(line), &ans); err != nil {
			t.Fatal(err)
		}
		if ans.Error != "" {
			t.Fatalf("batch %d: msgspec rejects it: %s", i, ans.Error)
		}
		if ans.Reencoded != hex.EncodeToString(payloads[i]) {
			t.Fatalf("batch %d: msgspec encodes it as\n%s\nduet-sim as\n%x", i, ans.Reencoded, payloads[i])
		}
		if ans.Batch.Rank != wireBatches[i].rank || len(ans.Batch.Events) != len(wireBatches[i].events) {
			t.Fatalf("batch %d: decoded %+v", i, ans.Batch)
		}
		for j, e := range ans.Batch.Events {
			if want := wireBatches[i].events[j].Kind.String(); e["type"] != want {
				t.Fatalf("batch %d event %d: type %v, want %s", i, j, e["type"], want)
			}
		}
	}
}

// quietLog discards zmq4's logs in tests.
var quietLog = log.New(io.Discard, "", 0)

// kvSim is a started server with KV events on loopback ports.
type kvSim struct {
	srv          *Server
	url          string
	pubs, replay []string
}

// startKVSim starts a server publishing KV events on free loopback ports
// (retrying on a port another process took meanwhile).
func startKVSim(t *testing.T, cfg Config, bufferSteps int) *kvSim {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	dp := cfg.DPSize
	for attempt := 0; attempt < 20; attempt++ {
		base := 20000 + rng.IntN(40000)
		if !portsFree(base, 2*dp) {
			continue
		}
		c := cfg
		c.Listen = "127.0.0.1:0"
		c.KVEventsConfig = fmt.Sprintf(`{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:%d", "bind": true, `+
			`"replay_endpoint": "tcp://127.0.0.1:%d", "buffer_steps": %d}`, base, base+dp, bufferSteps)
		srv, err := New(c, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(context.Background()); err != nil {
			if strings.Contains(err.Error(), "KV event publisher") {
				continue
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		k := &kvSim{srv: srv, url: "http://" + srv.Addr().String()}
		for r := range dp {
			k.pubs = append(k.pubs, fmt.Sprintf("tcp://127.0.0.1:%d", base+r))
			k.replay = append(k.replay, fmt.Sprintf("tcp://127.0.0.1:%d", base+dp+r))
		}
		return k
	}
	t.Fatal("no free ports for the KV event publisher")
	return nil
}

// portsFree reports whether n loopback ports from base can be bound.
func portsFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

// rankFeed is one rank's subscription feeding a view.
type rankFeed struct {
	sub  *kvevents.Subscriber
	view *kvevents.RankView
	rec  *seqRecorder
}

// seqRecorder passes batches to a view and records sequences and resets.
type seqRecorder struct {
	view   *kvevents.RankView
	mu     sync.Mutex
	seqs   []uint64
	resets []string
	kinds  []kvevents.Kind
}

// Apply implements kvevents.Handler.
func (r *seqRecorder) Apply(seq uint64, b kvevents.Batch) {
	r.view.Apply(seq, b)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seqs = append(r.seqs, seq)
	for _, e := range b.Events {
		r.kinds = append(r.kinds, e.Kind)
	}
}

// Reset implements kvevents.Handler.
func (r *seqRecorder) Reset(reason string) {
	r.view.Reset(reason)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resets = append(r.resets, reason)
}

// snapshot returns copies of the sequences and resets seen.
func (r *seqRecorder) snapshot() ([]uint64, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seqs), slices.Clone(r.resets)
}

// subscribe starts one subscriber per rank of k.
func (k *kvSim) subscribe(t *testing.T, ctx context.Context) []*rankFeed {
	t.Helper()
	var feeds []*rankFeed
	for r := range k.pubs {
		view := kvevents.NewRankView(16, 1<<20)
		rec := &seqRecorder{view: view}
		sub := kvevents.NewSubscriber(kvevents.Source{Endpoint: k.pubs[r], Replay: k.replay[r]}, rec, zaptest.NewLogger(t))
		sub.RetryMin, sub.RetryMax = 20*time.Millisecond, 200*time.Millisecond
		go sub.Run(ctx)
		feeds = append(feeds, &rankFeed{sub: sub, view: view, rec: rec})
	}
	return feeds
}

// settle flushes the cache until every feed has seen a batch (a
// subscriber misses what was published before it connected), so that
// views and caches start empty together.
func (k *kvSim) settle(t *testing.T, feeds []*rankFeed) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r := post(t, k.url+"/flush_cache", ""); r.status != 200 {
			t.Fatalf("flush_cache: %d %s", r.status, r.body)
		}
		time.Sleep(30 * time.Millisecond)
		all := true
		for _, f := range feeds {
			if f.sub.Stats().Batches == 0 {
				all = false
			}
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the subscribers received nothing")
		}
	}
}

// traffic sends n /generate requests with input_ids drawn from src,
// concurrently, and waits for them.
func (k *kvSim) traffic(t *testing.T, src *promptSource, n int) []Prompt {
	t.Helper()
	var wg sync.WaitGroup
	prompts := make([]Prompt, n)
	for i := range n {
		p, ids := src.next(t, 16)
		prompts[i] = p
		body, _ := json.Marshal(map[string]any{"input_ids": ids, "sampling_params": map[string]any{"max_new_tokens": 1 + i%7}})
		wg.Go(func() {
			if r := post(t, k.url+"/generate", string(body)); r.status != 200 {
				t.Errorf("generate: %d %s", r.status, r.body)
			}
		})
	}
	wg.Wait()
	return prompts
}

// agree waits until every rank's view matches its cache: as many pages
// as the cache holds blocks, and the model's match for every prompt.
func (k *kvSim) agree(t *testing.T, feeds []*rankFeed, prompts []Prompt) {
	t.Helper()
	hasher := prefix.Hasher{BlockTokens: 16, MaxBlocks: 1 << 20}
	var why string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		why = ""
		k.srv.eng.locked(func(core *engineCore, _ time.Duration) {
			for r, f := range feeds {
				if _, pages := f.view.Blocks(); pages != len(core.ranks[r].cache.blocks) {
					why = fmt.Sprintf("rank %d: the view holds %d pages, the cache %d blocks", r, pages, len(core.ranks[r].cache.blocks))
					return
				}
				for i, p := range prompts {
					matched, _ := core.ranks[r].cache.match(p.Blocks, (p.Tokens-1)/16)
					gpu, _ := f.view.Match(hasher.Tokens(p.TokenIDs, nil), 0)
					if min(gpu, (p.Tokens-1)/16) != len(matched) {
						why = fmt.Sprintf("rank %d prompt %d: the view matches %d blocks, the cache %d", r, i, gpu, len(matched))
						return
					}
				}
			}
		})
		if why == "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal(why)
}

// TestKVEventsOverZMQ: subscribers of a running server, one per rank,
// keep views that agree with the ranks' caches under eviction pressure;
// batches lost on the way come back by replay; after the publisher goes
// down and comes back (an engine restart: sequence from 0, the cache
// emptied) the views start over and agree again.
func TestKVEventsOverZMQ(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := startKVSim(t, Config{Profile: "dense-8b-h100", DPSize: 2, MaxTotalTokens: 5000, TimeScale: 20}, 10000)
	feeds := k.subscribe(t, ctx)
	k.settle(t, feeds)
	src := newPromptSource(11, 3, false)

	prompts := k.traffic(t, src, 40)
	k.agree(t, feeds, prompts)
	st := k.srv.KVEventStats()
	if st[0].Batches == 0 || st[1].Batches == 0 || st[0].Unpublished != 0 {
		t.Fatalf("publisher stats %+v", st)
	}

	// Lost batches are replayed.
	var before uint64
	for _, f := range feeds {
		before += f.sub.Stats().Replayed
	}
	if _, err := k.srv.UpdateFaults(FaultUpdate{KVEventsDrop: intp(2)}); err != nil {
		t.Fatal(err)
	}
	prompts = append(prompts, k.traffic(t, src, 30)...)
	k.agree(t, feeds, prompts)
	var after, gaps uint64
	for _, f := range feeds {
		after += f.sub.Stats().Replayed
		gaps += f.sub.Stats().Gaps
	}
	if after-before < 4 || gaps == 0 {
		t.Fatalf("replayed %d batches after %d gaps, want the 2 withheld of each rank", after-before, gaps)
	}

	// The publisher goes down and comes back as a restarted engine's.
	resetsBefore := make([]int, len(feeds))
	for r, f := range feeds {
		_, resets := f.rec.snapshot()
		resetsBefore[r] = len(resets)
	}
	down := 300.0
	if _, err := k.srv.UpdateFaults(FaultUpdate{KVEventsDownMS: &down}); err != nil {
		t.Fatal(err)
	}
	if st := k.srv.KVEventStats(); st[0].Up {
		t.Fatal("publisher still up")
	}
	eventually(t, "the publisher to come back", func() bool { return k.srv.KVEventStats()[0].Up })
	if st := k.srv.KVEventStats(); st[0].Restarts != 1 {
		t.Fatalf("stats after the restart %+v", st)
	}
	k.srv.eng.locked(func(core *engineCore, _ time.Duration) {
		if n := len(core.ranks[0].cache.blocks); n != 0 {
			t.Errorf("the restart left %d blocks cached", n)
		}
	})
	// The subscribers reconnect, and the new sequence resets their views.
	deadline := time.Now().Add(10 * time.Second)
	for r, f := range feeds {
		for {
			_, resets := f.rec.snapshot()
			if len(resets) > resetsBefore[r] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d: no reset after the restart: %q", r, resets)
			}
			// Keep publishing so that the reconnected subscriber sees batches.
			k.traffic(t, src, 2)
		}
	}
	// What was published before a subscriber reconnected is lost to it,
	// as with a real engine: start the views and caches over together.
	k.settle(t, feeds)
	prompts = append(prompts, k.traffic(t, src, 20)...)
	k.agree(t, feeds, prompts)
	for r, f := range feeds {
		blocks, pages := f.view.Blocks()
		t.Logf("rank %d: publisher %+v; subscriber %+v; view %d blocks %d pages %+v", r, k.srv.KVEventStats()[r],
			f.sub.Stats(), blocks, pages, f.view.Counts())
	}
}

// TestKVEventsReplayProtocol speaks SGLang's replay protocol to a
// running server with a DEALER: ["", start] gets every buffered batch
// from start on as ["", topic, seq, payload], the same payloads the PUB
// socket sent, then ["", "", -1, ""]; the buffer keeps the last
// buffer_steps batches.
func TestKVEventsReplayProtocol(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := startKVSim(t, Config{Profile: "dense-8b-h100", DPSize: 1, MaxTotalTokens: 5000, TimeScale: 20}, 4)
	sub := zmq4.NewSub(ctx, zmq4.WithLogger(quietLog))
	defer sub.Close()
	if err := sub.Dial(k.pubs[0]); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	live := map[uint64][]byte{}
	var mu sync.Mutex
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 || len(msg.Frames[1]) != 8 {
				t.Errorf("frames %q", msg.Frames)
				return
			}
			mu.Lock()
			live[binary.BigEndian.Uint64(msg.Frames[1])] = msg.Frames[2]
			mu.Unlock()
		}
	}()
	src := newPromptSource(5, 2, false)
	eventually(t, "the subscription", func() bool {
		post(t, k.url+"/flush_cache", "")
		mu.Lock()
		defer mu.Unlock()
		return len(live) > 0
	})
	k.traffic(t, src, 12)
	next := k.srv.KVEventStats()[0].NextSeq
	eventually(t, "the live batches", func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := live[next-1]
		return ok
	})
	dealer := zmq4.NewDealer(ctx, zmq4.WithLogger(quietLog))
	defer dealer.Close()
	if err := dealer.Dial(k.replay[0]); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		start uint64
		want  []uint64
	}{{start: 0, want: []uint64{next - 4, next - 3, next - 2, next - 1}}, {start: next - 2, want: []uint64{next - 2, next - 1}}, {start: next + 5}} {
		if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, tc.start))); err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for {
			msg, err := dealer.Recv()
			if err != nil {
				t.Fatal(err)
			}
			f := msg.Frames
			if len(f) != 4 || len(f[0]) != 0 || len(f[2]) != 8 {
				t.Fatalf("replay frames %q", f)
			}
			seq := binary.BigEndian.Uint64(f[2])
			if seq == ^uint64(0) {
				if len(f[1]) != 0 || len(f[3]) != 0 {
					t.Fatalf("end marker %q", f)
				}
				break
			}
			mu.Lock()
			sent := live[seq]
			mu.Unlock()
			if string(f[3]) != string(sent) {
				t.Fatalf("replayed batch %d differs from the one published", seq)
			}
			got = append(got, seq)
		}
		if !slices.Equal(got, tc.want) {
			t.Fatalf("replay from %d: %v, want %v", tc.start, got, tc.want)
		}
	}
}

// TestKVEventsTextPromptsUnpublished: blocks of text prompts, whose token
// ids the simulator does not know, are counted and not published; their
// removals are not published either.
func TestKVEventsTextPromptsUnpublished(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := startKVSim(t, Config{Profile: "dense-8b-h100", DPSize: 1, MaxTotalTokens: 3000, TimeScale: 20}, 100)
	feeds := k.subscribe(t, ctx)
	k.settle(t, feeds)
	for i := range 20 {
		body := fmt.Sprintf(`{"text": %q, "sampling_params": {"max_new_tokens": 2}}`, strings.Repeat(fmt.Sprintf("text %d ", i), 150))
		if r := post(t, k.url+"/generate", body); r.status != 200 {
			t.Fatalf("generate: %d %s", r.status, r.body)
		}
	}
	st := k.srv.KVEventStats()[0]
	if st.Unpublished == 0 {
		t.Fatalf("stats %+v: no text block counted", st)
	}
	if c := feeds[0].view.Counts(); c.Stored != 0 || c.Removed != 0 || c.Malformed != 0 {
		t.Fatalf("view counts %+v: text blocks were published", c)
	}
}

// TestKVEventsFaultValidation: the KV event actions need a publisher and
// sane values.
func TestKVEventsFaultValidation(t *testing.T) {
	plain := startTest(t, Config{Profile: "dense-8b-h100"}).sim
	down := 10.0
	if _, err := plain.UpdateFaults(FaultUpdate{KVEventsDownMS: &down}); err == nil || !strings.Contains(err.Error(), "no KV event publisher") {
		t.Fatalf("down without a publisher: %v", err)
	}
	if _, err := plain.UpdateFaults(FaultUpdate{KVEventsDrop: intp(1)}); err == nil {
		t.Fatal("drop without a publisher accepted")
	}
	yes := true
	if _, err := plain.UpdateFaults(FaultUpdate{ResetCache: &yes}); err != nil {
		t.Fatalf("reset without a publisher: %v", err)
	}
	k := startKVSim(t, Config{Profile: "dense-8b-h100", DPSize: 1}, 10)
	for _, bad := range []float64{0, -5} {
		if _, err := k.srv.UpdateFaults(FaultUpdate{KVEventsDownMS: &bad}); err == nil {
			t.Fatalf("kv_events_down_ms %v accepted", bad)
		}
	}
	r := post(t, k.url+"/sim/faults", `{"kv_events_drop": 1, "reset_cache": true}`)
	if r.status != 200 {
		t.Fatalf("POST /sim/faults: %d %s", r.status, r.body)
	}
	var stats struct{ Ranks []KVEventRankStats }
	get(t, k.url+"/sim/kv_events").json(t, &stats)
	if len(stats.Ranks) != 1 || !stats.Ranks[0].Up || stats.Ranks[0].Withheld != 1 {
		t.Fatalf("GET /sim/kv_events: %+v (the reset's AllBlocksCleared is the withheld batch)", stats)
	}
	// A server never started (served through Handler) does not bind its
	// publisher when a down fault ends.
	idle := startTest(t, Config{Profile: "dense-8b-h100", KVEventsConfig: `{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:1", "bind": true}`}).sim
	one := 1.0
	if _, err := idle.UpdateFaults(FaultUpdate{KVEventsDownMS: &one}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	if st := idle.KVEventStats(); st[0].Up || st[0].Restarts != 0 {
		t.Fatalf("a never started publisher came up: %+v", st)
	}
	if r := get(t, startTest(t, Config{}).api.URL+"/sim/kv_events"); r.status != 404 {
		t.Fatalf("GET /sim/kv_events without a publisher: %d", r.status)
	}
}

// TestFlushCache: /flush_cache empties idle ranks (AllBlocksCleared) and
// answers as SGLang does; a rank holding a request is left alone.
func TestFlushCache(t *testing.T) {
	ts := startTest(t, Config{Profile: "dense-8b-h100", TimeScale: 20})
	src := newPromptSource(3, 1, false)
	_, ids := src.next(t, 16)
	body, _ := json.Marshal(map[string]any{"input_ids": ids, "sampling_params": map[string]any{"max_new_tokens": 1}})
	if r := post(t, ts.api.URL+"/generate", string(body)); r.status != 200 {
		t.Fatalf("generate: %d", r.status)
	}
	var cleared int
	ts.sim.eng.locked(func(core *engineCore, _ time.Duration) {
		if len(core.ranks[0].cache.blocks) == 0 {
			t.Fatal("nothing cached")
		}
		core.sink = func(_ time.Duration, _ int, ev []kvevents.Event) {
			for _, e := range ev {
				if e.Kind == kvevents.AllBlocksCleared {
					cleared++
				}
			}
		}
	})
	r := get(t, ts.api.URL+"/flush_cache")
	if r.status != 200 || !strings.HasPrefix(string(r.body), "Cache flushed.\n") {
		t.Fatalf("flush_cache: %d %q", r.status, r.body)
	}
	ts.sim.eng.locked(func(core *engineCore, _ time.Duration) {
		if n := len(core.ranks[0].cache.blocks); n != 0 || cleared != 1 {
			t.Fatalf("after the flush: %d blocks, %d AllBlocksCleared", n, cleared)
		}
	})
	// A request in flight keeps its rank from flushing. It must have
	// reached the engine's rank, not only the server: the flush looks at
	// the ranks. It is short enough (2,000 tokens at 20x) that it ends
	// soon even if the client's cancel does not abort it.
	long, _ := json.Marshal(map[string]any{"input_ids": ids, "sampling_params": map[string]any{"max_new_tokens": 2000}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); postCtx(ctx, t, ts.api.URL+"/generate", string(long)) }()
	eventually(t, "the request on the engine's rank", func() bool {
		n := 0
		ts.sim.eng.locked(func(core *engineCore, _ time.Duration) {
			core.forEachRequest(core.ranks[0], func(*engineRequest) { n++ })
		})
		return n == 1
	})
	r = post(t, ts.api.URL+"/flush_cache", "")
	if r.status != 400 || string(r.body) != "Flush cache failed.\n" {
		t.Fatalf("flush_cache with a request in flight: %d %q", r.status, r.body)
	}
	cancel()
	<-done
}

// TestKVEventsFirstBatch: ranks publish on the endpoint's port plus the
// rank; the first batch of a fresh publisher is [AllBlocksCleared] with
// sequence 0 and the rank; the replay buffer keeps the last buffer_steps.
func TestKVEventsFirstBatch(t *testing.T) {
	set, _, err := ParseKVEventsConfig(`{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:1", "bind": true}`, false)
	if err != nil {
		t.Fatal(err)
	}
	p := newKVPublisher(set, 2, zap.NewNop())
	for r, rp := range p.ranks {
		if want := fmt.Sprintf("tcp://127.0.0.1:%d", 1+r); rp.endpoint != want {
			t.Fatalf("rank %d endpoint %s, want %s", r, rp.endpoint, want)
		}
	}
	rp := p.ranks[1]
	rp.buf = replayRing{max: 3}
	rp.pub = nopSocket{}
	p.up = true
	rp.publish(p, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	buf := rp.buf.from(0)
	if len(buf) != 1 || buf[0].seq != 0 || rp.seq != 1 {
		t.Fatalf("buffer %+v seq %d", buf, rp.seq)
	}
	b, err := kvevents.DecodeBatch(buf[0].payload)
	if err != nil || len(b.Events) != 1 || b.Events[0].Kind != kvevents.AllBlocksCleared || b.DPRank != 1 {
		t.Fatalf("first batch %+v %v", b, err)
	}
	for range 5 {
		rp.publish(p, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	}
	if buf := rp.buf.from(0); len(buf) != 3 || buf[0].seq != 3 || buf[2].seq != 5 {
		t.Fatalf("buffer bounded to 3: %+v", buf)
	}
	if buf := rp.buf.from(5); len(buf) != 1 || buf[0].seq != 5 {
		t.Fatalf("buffer from 5: %+v", buf)
	}
}

// nopSocket is a PUB socket that sends nowhere.
type nopSocket struct{ zmq4.Socket }

// Send implements zmq4.Socket.
func (nopSocket) Send(zmq4.Msg) error { return nil }
