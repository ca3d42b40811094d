package kvevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/duet-router/duet/scheduler/prefix"
)

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestTrackerStates: a rank fed in process goes from fallback to live on
// its publisher's first batch, or through warming when it joined late;
// lagging batches make it fall back until they catch up; an
// AllBlocksCleared makes a warming view whole.
func TestTrackerStates(t *testing.T) {
	tokens := make([]int64, 64)
	for i := range tokens {
		tokens[i] = int64(i + 3)
	}
	blocks := prefix.Hasher{BlockTokens: 16}.Tokens(tokens, nil)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	ts := func() float64 { return float64(clock.t.UnixNano()) / 1e9 }
	type step struct {
		do       func(h Handler, e *engine)
		wantOK   bool
		wantGPU  int
		partial  bool
		describe string
	}
	store := func(seq uint64, pages int) func(Handler, *engine) {
		return func(h Handler, e *engine) {
			e.chain = nil
			h.Apply(seq, Batch{TS: ts(), Events: []Event{e.store(tokens, 0, pages, "")}})
		}
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "from the first batch", steps: []step{
			{do: func(Handler, *engine) {}, describe: "before any batch"},
			{do: store(0, 3), wantOK: true, wantGPU: 3, describe: "after batch 0"},
		}},
		{name: "joined late", steps: []step{
			{do: store(7, 2), wantOK: true, wantGPU: 2, partial: true, describe: "after batch 7"},
			{do: func(Handler, *engine) { clock.t = clock.t.Add(2 * time.Minute) }, wantOK: true, wantGPU: 2, describe: "after the warmup"},
		}},
		{name: "cleared", steps: []step{
			{do: store(7, 2), wantOK: true, wantGPU: 2, partial: true, describe: "after batch 7"},
			{do: func(h Handler, e *engine) {
				h.Apply(8, Batch{TS: ts(), Events: []Event{{Kind: AllBlocksCleared}}})
			}, wantOK: true, describe: "after AllBlocksCleared"},
		}},
		{name: "lagging", steps: []step{
			{do: store(0, 4), wantOK: true, wantGPU: 4, describe: "in time"},
			{do: func(h Handler, e *engine) {
				h.Apply(1, Batch{TS: ts() - 10, Events: nil})
			}, describe: "10s late"},
			{do: func(h Handler, e *engine) {
				h.Apply(2, Batch{TS: ts() - 1, Events: nil})
			}, wantOK: true, wantGPU: 4, describe: "1s late"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker[string](TrackerConfig{BlockTokens: 16, Clock: clock.now}, nil)
			tr.SetTargets([]Target[string]{{Key: "r0", Name: "engine#0"}})
			h := tr.Handler("r0")
			e := &engine{pageSize: 16}
			for _, st := range tc.steps {
				st.do(h, e)
				m, ok := tr.Match("r0", blocks)
				if ok != st.wantOK || m.GPU != st.wantGPU || m.Partial != st.partial {
					t.Fatalf("%s: Match = %+v, %v; want GPU %d, partial %v, ok %v", st.describe, m, ok, st.wantGPU, st.partial, st.wantOK)
				}
			}
		})
	}
	tr := NewTracker[string](TrackerConfig{BlockTokens: 16}, nil)
	if _, ok := tr.Match("unknown", blocks); ok {
		t.Error("Match of a rank not followed is ok")
	}
	if tr.Handler("unknown") != nil {
		t.Error("Handler of a rank not followed")
	}
}

// TestTrackerRouted: routed blocks count until reported.
func TestTrackerRouted(t *testing.T) {
	tokens := make([]int64, 48)
	for i := range tokens {
		tokens[i] = int64(i * 5)
	}
	blocks := prefix.Hasher{BlockTokens: 16}.Tokens(tokens, nil)
	tr := NewTracker[int](TrackerConfig{BlockTokens: 16, ExpectFor: time.Second}, nil)
	tr.SetTargets([]Target[int]{{Key: 1}})
	tr.Handler(1).Apply(0, Batch{})
	now := time.Now()
	tr.Routed(1, blocks, now)
	if m, ok := tr.Match(1, blocks); !ok || m.GPU != 3 || m.Blocks != 0 {
		t.Fatalf("after Routed: %+v, %v", m, ok)
	}
	tr.Routed(1, blocks, now.Add(-2*time.Second))
	if m, _ := tr.Match(1, blocks); m.GPU != 0 {
		t.Fatalf("after the expectation expired: %+v", m)
	}
	tr.SetTargets(nil)
	if _, ok := tr.Match(1, blocks); ok {
		t.Fatal("a dropped rank still matches")
	}
}

// TestTrackerPublisherDies: a subscribed rank is live while its publisher
// runs, falls back when its port stops answering, and is live again
// when a new publisher (sequence from 0) takes its port.
func TestTrackerPublisherDies(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := freePort(t)
	src := Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port)}
	tr := NewTracker[string](TrackerConfig{BlockTokens: 2, ProbeInterval: 50 * time.Millisecond, MaxLag: -1}, zap.NewNop())
	tr.SetTargets([]Target[string]{{Key: "r", Name: "engine#0", Source: src}})
	go tr.Run(ctx)

	// batch(seq) stores one 2-token block whose tokens are 1, 2.
	blocks := prefix.Hasher{BlockTokens: 2}.Tokens([]int64{1, 2}, nil)
	waitFor := func(what string, cond func(m Match, ok bool) bool, publish func()) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if publish != nil {
				publish()
			}
			if cond(tr.Match("r", blocks)) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		m, ok := tr.Match("r", blocks)
		t.Fatalf("waited for %s: Match = %+v, %v; status %+v", what, m, ok, tr.Status())
	}

	pctx, pcancel := context.WithCancel(ctx)
	p := startPublisher(t, pctx, port, 0)
	waitFor("a view", func(m Match, ok bool) bool { return ok && m.GPU == 1 }, func() { p.publish(false) })
	p.pub.Close()
	pcancel()
	waitFor("the fallback", func(_ Match, ok bool) bool { return !ok }, nil)
	if st := tr.Status(); len(st) != 1 || st[0].Fallbacks["unreachable"] != 1 {
		t.Fatalf("status %+v: want one fallback for an unreachable port", st)
	}

	p2 := startPublisher(t, ctx, port, 0)
	waitFor("the new publisher's view, complete", func(m Match, ok bool) bool { return ok && !m.Partial && m.GPU == 1 }, func() {
		p2.mu.Lock()
		p2.seq = 0 // each probe is the new publisher's first batch
		p2.mu.Unlock()
		p2.publish(false)
	})
}

// TestTrackerIdleEngineGoesLive: duet subscribes to an engine that has
// been idle for longer than MaxLag (its batches are old history in its
// replay buffer, and it publishes nothing new). The replay on subscribing
// is history, not lag: the rank goes live at once and stays live, with no
// lag fallback. A live batch that arrives late still makes it fall back.
// (The replayed batches' age made every such rank fall back, for good.)
func TestTrackerIdleEngineGoesLive(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubPort, replayPort := freePort(t), freePort(t)
	p := startPublisher(t, ctx, pubPort, replayPort)
	p.ts = float64(time.Now().Add(-10*time.Second).UnixNano()) / 1e9 // the engine went idle 10 s ago
	for range 3 {
		p.publish(true) // published before duet subscribed
	}
	core, logs := observer.New(zap.InfoLevel)
	tr := NewTracker[string](TrackerConfig{BlockTokens: 2, MaxLag: time.Second, ProbeInterval: 50 * time.Millisecond}, zap.New(core))
	src := Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)}
	tr.SetTargets([]Target[string]{{Key: "r", Name: "engine#0", Source: src}})
	go tr.Run(ctx)

	waitState := func(what string, want State) RankStatus[string] {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, _ := tr.RankStatus("r")
			if st.State == want {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("waited for %s: status %+v; logs %v", what, st, logs.All())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	st := waitState("the replayed history to make the rank live", StateLive)
	if st.Stats.Replayed != 3 || st.Fallbacks["lag"] != 0 || st.Lag < 9*time.Second {
		t.Fatalf("status %+v: want 3 batches replayed, no lag fallback, the last batch 10 s old", st)
	}
	time.Sleep(300 * time.Millisecond) // several probes: nothing changes while the engine stays idle
	if st, _ := tr.RankStatus("r"); st.State != StateLive || logs.FilterMessageSnippet("lag").Len() != 0 {
		t.Fatalf("status %+v, logs %v: want the rank still live, no lag logged", st, logs.All())
	}

	// A live batch stamped 10 s ago is lag.
	deadline := time.Now().Add(10 * time.Second)
	for st, _ := tr.RankStatus("r"); st.State != StateFallback && time.Now().Before(deadline); st, _ = tr.RankStatus("r") {
		p.publish(false)
		time.Sleep(20 * time.Millisecond)
	}
	if st, _ := tr.RankStatus("r"); st.State != StateFallback || st.Fallbacks["lag"] != 1 {
		t.Fatalf("status %+v: want a late live batch to make the rank fall back, counted once", st)
	}
}

// TestTrackerReplayedBatchesAndLag, fed in process: replayed batches never
// count as lag, whatever their age; the replay's newest batch
// (Batch.Current) ends a lag; a gap's replayed batches leave it as it is
// until the live batch after them says.
func TestTrackerReplayedBatchesAndLag(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	old := float64(clock.t.Add(-time.Minute).UnixNano()) / 1e9
	fresh := float64(clock.t.UnixNano()) / 1e9
	tests := []struct {
		name    string
		batches []Batch
		want    State
		lags    uint64
	}{
		{name: "an idle engine's history", batches: []Batch{{TS: old, Replayed: true}, {TS: old, Replayed: true, Current: true}},
			want: StateLive},
		{name: "a late live batch", batches: []Batch{{TS: old}}, want: StateFallback, lags: 1},
		{name: "lagging, then caught up by replay", batches: []Batch{{TS: old}, {TS: old, Replayed: true, Current: true}},
			want: StateLive, lags: 1},
		{name: "a gap's replay leaves the lag to the live batch", batches: []Batch{{TS: old}, {TS: old, Replayed: true}},
			want: StateFallback, lags: 1},
		{name: "a gap's replay, then a live batch in time", batches: []Batch{{TS: old}, {TS: old, Replayed: true}, {TS: fresh}},
			want: StateLive, lags: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker[string](TrackerConfig{BlockTokens: 16, MaxLag: time.Second, Clock: clock.now}, nil)
			tr.SetTargets([]Target[string]{{Key: "r0", Name: "engine#0"}})
			h := tr.Handler("r0")
			h.Reset("subscribed")
			for i, b := range tc.batches {
				h.Apply(uint64(i), b)
			}
			if st, _ := tr.RankStatus("r0"); st.State != tc.want || st.Fallbacks["lag"] != tc.lags {
				t.Fatalf("state %v, lag fallbacks %d; want %v, %d", st.State, st.Fallbacks["lag"], tc.want, tc.lags)
			}
		})
	}
}

// TestTrackerUnreachableCounted: a rank whose event port never answered
// counts one "unreachable" fallback, logged once however many probes
// fail (it counted none, and the subscription logged every few seconds);
// its recovery is logged once, and each later loss counts again.
func TestTrackerUnreachableCounted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := freePort(t)
	core, logs := observer.New(zap.InfoLevel)
	tr := NewTracker[string](TrackerConfig{BlockTokens: 2, ProbeInterval: 10 * time.Millisecond, MaxLag: -1}, zap.New(core))
	tr.SetTargets([]Target[string]{{Key: "r", Name: "engine#0", Source: Source{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port)}}})
	go tr.Run(ctx)
	unreachable := func() []observer.LoggedEntry {
		return logs.FilterMessageSnippet("KV event port unreachable").FilterLevelExact(zap.WarnLevel).All()
	}
	waitFor := func(what string, cond func(st RankStatus[string]) bool) RankStatus[string] {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, _ := tr.RankStatus("r")
			if cond(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("waited for %s: status %+v; logs %v", what, st, logs.All())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("the port found unreachable", func(st RankStatus[string]) bool { return st.Fallbacks["unreachable"] > 0 })
	time.Sleep(300 * time.Millisecond) // about 30 more probes fail
	if st, _ := tr.RankStatus("r"); st.Fallbacks["unreachable"] != 1 || st.State != StateFallback || len(unreachable()) != 1 {
		t.Fatalf("status %+v, warnings %v: want one fallback counted and logged for a port that never answered", st, unreachable())
	}

	pctx, pcancel := context.WithCancel(ctx)
	p := startPublisher(t, pctx, port, 0)
	waitFor("the port answering", func(RankStatus[string]) bool {
		return logs.FilterMessage("KV event port reachable again").Len() > 0
	})
	time.Sleep(100 * time.Millisecond)
	if n := logs.FilterMessage("KV event port reachable again").Len(); n != 1 {
		t.Fatalf("recovery logged %d times, want once", n)
	}
	p.pub.Close()
	pcancel()
	st := waitFor("the port lost again", func(st RankStatus[string]) bool { return st.Fallbacks["unreachable"] == 2 })
	if len(unreachable()) != 2 || st.State != StateFallback {
		t.Fatalf("status %+v, warnings %v: want the second loss counted and logged", st, unreachable())
	}
}

// BenchmarkIngest is what one KV event costs duet from its bytes to the
// view: a batch of 8 events decoded and applied to a followed rank, as a
// subscription does. Each batch stores 4 pages of 16 tokens per event,
// extending one chain (SGLang merges a request's consecutive stores), and
// then evicts them, so that the view stays small; ns/event times a rate
// is the CPU that rate of events costs.
func BenchmarkIngest(b *testing.B) {
	var events []any
	var removed []int64
	for i := range 4 {
		hashes := []int64{int64(i*4 + 1), int64(i*4 + 2), int64(i*4 + 3), int64(i*4 + 4)}
		tokens := make([]int, 64)
		for j := range tokens {
			tokens[j] = 151000 + i*64 + j
		}
		var parent any
		if i > 0 {
			parent = int64(i * 4)
		}
		events = append(events, map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
			"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU"})
		removed = append(removed, hashes...)
	}
	for i := range 4 {
		events = append(events, map[string]any{"type": "BlockRemoved", "block_hashes": removed[len(removed)-4*(i+1) : len(removed)-4*i], "medium": "GPU"})
	}
	payload, err := msgpack.Marshal([]any{1764100000.5, events, 0})
	if err != nil {
		b.Fatal(err)
	}
	tr := NewTracker[int](TrackerConfig{BlockTokens: 16, MaxLag: -1}, nil)
	tr.SetTargets([]Target[int]{{Key: 0}})
	h := tr.Handler(0)
	b.SetBytes(int64(len(payload)))
	var seq uint64
	for b.Loop() {
		batch, err := DecodeBatch(payload)
		if err != nil {
			b.Fatal(err)
		}
		h.Apply(seq, batch)
		seq++
	}
	if m, _ := tr.Match(0, nil); m.Blocks != 0 {
		b.Fatalf("the view holds %d blocks", m.Blocks)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
}
