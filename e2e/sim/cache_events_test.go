package sim

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/duet-router/duet/scheduler/kvevents"
	"github.com/duet-router/duet/scheduler/prefix"
)

// tierSet is a bit set of the tiers a mirror holds a block in.
type tierSet uint8

const (
	inGPU tierSet = 1 << iota
	inHost
)

// tierOf maps a medium to its bit.
func tierOf(t *testing.T, medium string) tierSet {
	switch medium {
	case mediumGPU:
		return inGPU
	case mediumHost:
		return inHost
	}
	t.Fatalf("unexpected medium %q", medium)
	return 0
}

// eventMirror applies a model's cache events to per-rank block sets and
// checks, as it goes, what a consumer relies on: a stored chain's parent
// is held (prefix closure), a store adds a block its tier does not hold
// yet and a removal takes one it holds, token ids fill their blocks.
type eventMirror struct {
	t      *testing.T
	bt     int
	ranks  []map[uint64]tierSet
	last   time.Duration
	calls  int
	counts map[string]int
}

// newEventMirror returns an empty mirror of dp ranks, blocks of bt tokens.
func newEventMirror(t *testing.T, dp, bt int) *eventMirror {
	m := &eventMirror{t: t, bt: bt, counts: map[string]int{}}
	for range dp {
		m.ranks = append(m.ranks, map[uint64]tierSet{})
	}
	return m
}

// apply is the model's sink.
func (m *eventMirror) apply(at time.Duration, rank int, events []kvevents.Event) {
	t := m.t
	t.Helper()
	if at < m.last {
		t.Fatalf("events at %v after events at %v", at, m.last)
	}
	if len(events) == 0 {
		t.Fatalf("an empty event list at %v", at)
	}
	m.last = at
	m.calls++
	held := m.ranks[rank]
	for _, e := range events {
		switch e.Kind {
		case kvevents.AllBlocksCleared:
			clear(held)
			m.counts["cleared"]++
		case kvevents.BlockStored:
			if e.HasParent && held[e.ParentHash] == 0 {
				t.Fatalf("rank %d: stored %x under parent %x, which no tier holds", rank, e.BlockHashes, e.ParentHash)
			}
			if e.BlockSize != m.bt || (e.TokenIDs != nil && len(e.TokenIDs) != len(e.BlockHashes)*m.bt) {
				t.Fatalf("rank %d: %d token ids for %d blocks of %d", rank, len(e.TokenIDs), len(e.BlockHashes), e.BlockSize)
			}
			tier := tierOf(t, e.Medium)
			for _, h := range e.BlockHashes {
				if held[h]&tier != 0 {
					t.Fatalf("rank %d: %s stored %x twice", rank, e.Medium, h)
				}
				held[h] |= tier
			}
			m.counts["stored "+e.Medium] += len(e.BlockHashes)
		case kvevents.BlockRemoved:
			tier := tierOf(t, e.Medium)
			for _, h := range e.BlockHashes {
				if held[h]&tier == 0 {
					t.Fatalf("rank %d: %s removed %x, which it does not hold", rank, e.Medium, h)
				}
				if held[h] &^= tier; held[h] == 0 {
					delete(held, h)
				}
			}
			m.counts["removed "+e.Medium] += len(e.BlockHashes)
		}
	}
}

// check compares the mirror with the model's caches.
func (m *eventMirror) check(model *Model) {
	t := m.t
	t.Helper()
	for i, r := range model.core.ranks {
		want := map[uint64]tierSet{}
		for h := range r.cache.blocks {
			want[h] |= inGPU
		}
		if r.host != nil {
			for h := range r.host.blocks {
				want[h] |= inHost
			}
		}
		if !maps.Equal(want, m.ranks[i]) {
			for h, tiers := range want {
				if m.ranks[i][h] != tiers {
					t.Fatalf("rank %d: block %x is in tiers %b, the events say %b", i, h, tiers, m.ranks[i][h])
				}
			}
			t.Fatalf("rank %d: the events hold %d blocks, the cache %d", i, len(m.ranks[i]), len(want))
		}
		if len(r.events) != 0 {
			t.Fatalf("rank %d: %d events recorded and not handed over", i, len(r.events))
		}
	}
}

// promptSource draws token-id prompts that share prefixes: a random
// length of one of a few documents, then a random tail.
type promptSource struct {
	rng  *rand.Rand
	docs [][]int64
	text bool
}

// newPromptSource returns a source of prompts over docs documents.
func newPromptSource(seed uint64, docs int, text bool) *promptSource {
	s := &promptSource{rng: rand.New(rand.NewPCG(seed, 7)), text: text}
	for range docs {
		d := make([]int64, 1500)
		for i := range d {
			d[i] = int64(s.rng.IntN(150000))
		}
		s.docs = append(s.docs, d)
	}
	return s
}

// next returns a prompt parsed as /generate parses it (input_ids, or the
// same length of text), with its max_new_tokens.
func (s *promptSource) next(t *testing.T, bt int) (Prompt, []int64) {
	t.Helper()
	doc := s.docs[s.rng.IntN(len(s.docs))]
	ids := slices.Clone(doc[:16+s.rng.IntN(len(doc)-16)])
	for range s.rng.IntN(80) {
		ids = append(ids, int64(s.rng.IntN(150000)))
	}
	body := map[string]any{"input_ids": ids, "sampling_params": map[string]any{"max_new_tokens": 1 + s.rng.IntN(40)}}
	if s.text {
		txt := make([]byte, 4*len(ids))
		for i, id := range ids {
			copy(txt[4*i:], fmt.Sprintf("%04d", id%10000))
		}
		body = map[string]any{"text": string(txt), "sampling_params": body["sampling_params"]}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePrompt("/generate", raw, bt)
	if err != nil {
		t.Fatal(err)
	}
	return p, ids
}

// TestCacheEventsMirrorTheCache drives models through random workloads
// (shared prefixes, eviction pressure, aborts, flushes and resets, the
// decode radix cache with and without its host tier) and checks after
// every call that the events, applied in order, hold exactly the blocks
// the caches hold; with token-id prompts a kvevents.RankView fed the same
// events matches every probe prompt as far as CachedPrefix (or
// DecodeCachedPrefix) does.
func TestCacheEventsMirrorTheCache(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		text bool
	}{
		{name: "aggregated", cfg: Config{Mode: ModeNull, Profile: "dense-8b-h100", DPSize: 2, MaxTotalTokens: 6000}},
		{name: "prefill lockstep", cfg: Config{Mode: ModePrefill, Profile: "dsv3-dp8-h100-node", DPSize: 3, MaxTotalTokens: 5000}},
		{name: "decode radix", cfg: Config{Mode: ModeDecode, Profile: "dense-8b-h100", DPSize: 2, MaxTotalTokens: 6000, DecodeRadixCache: true}},
		{name: "decode hicache", cfg: Config{Mode: ModeDecode, Profile: "dense-8b-h100", DPSize: 2, MaxTotalTokens: 6000,
			DecodeRadixCache: true, HierarchicalCache: true, HiCacheRatio: 0.75}},
		{name: "decode hicache text", text: true, cfg: Config{Mode: ModeDecode, Profile: "dense-8b-h100", DPSize: 2,
			MaxTotalTokens: 6000, DecodeRadixCache: true, HierarchicalCache: true, HiCacheRatio: 0.75}},
		{name: "aggregated text", text: true, cfg: Config{Mode: ModeNull, Profile: "dense-8b-h100", DPSize: 1, MaxTotalTokens: 4000}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewModel(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			bt := m.core.p.prof.BlockSize
			dp := m.cfg.DPSize
			mirror := newEventMirror(t, dp, bt)
			views := make([]*kvevents.RankView, dp)
			for i := range views {
				views[i] = kvevents.NewRankView(bt, 1<<20)
			}
			m.OnCacheEvents(func(at time.Duration, rank int, events []kvevents.Event) {
				mirror.apply(at, rank, events)
				views[rank].Apply(0, kvevents.Batch{Events: events})
			})
			src := newPromptSource(uint64(len(tc.name)), 4, tc.text)
			hasher := prefix.Hasher{BlockTokens: bt, MaxBlocks: 1 << 20}
			var probes []Prompt
			var probeIDs [][]int64
			for range 8 {
				p, ids := src.next(t, bt)
				probes = append(probes, p)
				probeIDs = append(probeIDs, ids)
			}
			hits := 0
			checkViews := func() {
				t.Helper()
				if tc.text {
					return
				}
				for rank, v := range views {
					for i, p := range probes {
						limit := (p.Tokens - 1) / bt
						gpu, anyTier := v.Match(hasher.Tokens(probeIDs[i], nil), 0)
						got, want := min(gpu, limit)*bt, m.CachedPrefix(rank, p)
						if m.core.p.decodeRadix {
							got, want = min(anyTier, limit)*bt, m.DecodeCachedPrefix(rank, p)
						}
						if got != want {
							t.Fatalf("rank %d probe %d: the view matches %d tokens, the model %d", rank, i, got, want)
						}
						if got > 0 {
							hits++
						}
					}
					if c := v.Counts(); c.Orphans != 0 || c.Malformed != 0 {
						t.Fatalf("rank %d: view counts %+v", rank, c)
					}
				}
			}
			rng := rand.New(rand.NewPCG(3, uint64(len(tc.name))))
			var live []*Item
			at := time.Duration(0)
			for step := 0; step < 600; step++ {
				at += time.Duration(rng.IntN(40)) * time.Millisecond
				switch x := rng.IntN(100); {
				case x < 55:
					p, ids := src.next(t, bt)
					if rng.IntN(4) == 0 {
						j := rng.IntN(len(probes))
						probes[j], probeIDs[j] = p, ids
					}
					it, err := m.Submit(at, rng.IntN(dp), p, p.MaxTokens)
					if err != nil {
						t.Fatal(err)
					}
					live = append(live, it)
				case x < 85:
					m.Advance(at)
				case x < 92 && len(live) > 0:
					m.Abort(at, live[rng.IntN(len(live))])
				case x < 96:
					m.FlushCache(at)
				case x < 98:
					m.ResetCache(at)
				default:
					at += 2 * time.Second
					m.Advance(at)
				}
				// Decode items get their KV a while after preallocation.
				for _, it := range live {
					if it.State() == ItemTransfer && m.cfg.Mode == ModeDecode && at-it.AdmittedAt() > 30*time.Millisecond {
						m.KVArrived(at, it)
					}
				}
				live = slices.DeleteFunc(live, func(it *Item) bool { return it.State() == ItemDone })
				mirror.check(m)
				checkViews()
			}
			for _, it := range live {
				if it.State() == ItemTransfer && m.cfg.Mode == ModeDecode {
					m.KVArrived(at, it)
				}
			}
			m.Advance(at + time.Hour)
			mirror.check(m)
			checkViews()
			for _, key := range []string{"stored GPU", "removed GPU", "cleared"} {
				if mirror.counts[key] == 0 {
					t.Errorf("no %s events: the workload does not exercise them (%v)", key, mirror.counts)
				}
			}
			if m.cfg.HierarchicalCache && (mirror.counts["stored CPU_PINNED"] == 0 || mirror.counts["removed CPU_PINNED"] == 0) {
				t.Errorf("no host-tier events: %v", mirror.counts)
			}
			if !tc.text && hits == 0 {
				t.Error("no probe ever matched: the views are not exercised")
			}
			t.Logf("%d calls, %d probe hits, %v", mirror.calls, hits, mirror.counts)
		})
	}
}

// TestCacheEventsOffByDefault: without a sink nothing is recorded.
func TestCacheEventsOffByDefault(t *testing.T) {
	m, err := NewModel(Config{Mode: ModeNull, Profile: "dense-8b-h100", MaxTotalTokens: 3000})
	if err != nil {
		t.Fatal(err)
	}
	src := newPromptSource(1, 2, false)
	for i := range 50 {
		p, _ := src.next(t, 16)
		if _, err := m.Submit(time.Duration(i)*10*time.Millisecond, 0, p, p.MaxTokens); err != nil {
			t.Fatal(err)
		}
		if n := len(m.core.ranks[0].events); n != 0 {
			t.Fatalf("%d events recorded without a sink", n)
		}
	}
	m.Advance(time.Hour)
	if len(m.core.ranks[0].cache.blocks) == 0 {
		t.Fatal("nothing cached: the workload does not exercise the cache")
	}
}
