package kvevents

import (
	"math/rand/v2"
	"testing"

	"github.com/duet-router/duet/scheduler/prefix"
)

// engine plays an engine's radix cache of one rank, reporting pages of
// pageSize tokens as SGLang does: a store event per request with the
// parent page's hash, removals leaf first.
type engine struct {
	pageSize int
	next     uint64
	// chain is the page hashes of the one cached sequence, in order.
	chain []uint64
}

// store reports the pages of tokens[from:to] (whole pages) as one event.
func (e *engine) store(tokens []int64, fromPage, toPage int, medium string) Event {
	ev := Event{Kind: BlockStored, BlockSize: e.pageSize, Medium: medium}
	if fromPage > 0 {
		ev.ParentHash, ev.HasParent = e.chain[fromPage-1], true
	}
	for p := fromPage; p < toPage; p++ {
		if p >= len(e.chain) {
			e.next++
			e.chain = append(e.chain, e.next*7919)
		}
		ev.BlockHashes = append(ev.BlockHashes, e.chain[p])
		ev.TokenIDs = append(ev.TokenIDs, tokens[p*e.pageSize:(p+1)*e.pageSize]...)
	}
	return ev
}

// removeFrom reports the pages from page on removed (the leaves).
func (e *engine) removeFrom(page int, medium string) Event {
	return Event{Kind: BlockRemoved, BlockHashes: append([]uint64(nil), e.chain[page:]...), Medium: medium}
}

// TestRankViewMatchesHasher: whatever the page size (a divisor of the
// block size) and however the stores are cut, the view holds exactly the
// blocks prefix.Hasher.Tokens gives a request for the same tokens; leaf
// removals take whole blocks off the end.
func TestRankViewMatchesHasher(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 1))
	for _, tc := range []struct{ page, block int }{{16, 16}, {1, 16}, {4, 16}, {64, 64}, {8, 32}} {
		tokens := make([]int64, 40*tc.block+tc.page*3)
		for i := range tokens {
			tokens[i] = int64(rng.IntN(150000))
		}
		pages := len(tokens) / tc.page
		blocks := prefix.Hasher{BlockTokens: tc.block, MaxBlocks: 1 << 20}.Tokens(tokens, nil)
		v := NewRankView(tc.block, 1<<20)
		e := &engine{pageSize: tc.page}
		// Stores cut at random page boundaries, as requests extend the chain.
		for at := 0; at < pages; {
			to := min(pages, at+1+rng.IntN(12))
			v.Apply(0, Batch{Events: []Event{e.store(tokens, at, to, "")}})
			at = to
		}
		if gpu, all := v.Match(blocks, 0); gpu != len(blocks) || all != len(blocks) {
			t.Fatalf("page %d, block %d: matched %d/%d of %d blocks", tc.page, tc.block, gpu, all, len(blocks))
		}
		// A request that diverges after 5 blocks matches 5.
		other := append([]int64(nil), tokens...)
		other[5*tc.block+tc.block/2]++
		if gpu, _ := v.Match(prefix.Hasher{BlockTokens: tc.block}.Tokens(other, nil), 0); gpu != 5 {
			t.Errorf("page %d, block %d: a request diverging in block 5 matched %d", tc.page, tc.block, gpu)
		}
		// Evict the leaves from page p on: blocks ending at or before p stay.
		p := pages/2 + 1
		v.Apply(0, Batch{Events: []Event{e.removeFrom(p, "")}})
		want := p * tc.page / tc.block
		if gpu, _ := v.Match(blocks, 0); gpu != want {
			t.Errorf("page %d, block %d: after evicting from page %d: matched %d, want %d", tc.page, tc.block, p, gpu, want)
		}
	}
}

// TestRankViewTiersAndResets: host-tier copies, clearing, orphans,
// namespaced events, malformed stores and the page bound.
func TestRankViewTiersAndResets(t *testing.T) {
	tokens := make([]int64, 64)
	for i := range tokens {
		tokens[i] = int64(i + 1)
	}
	blocks := prefix.Hasher{BlockTokens: 16}.Tokens(tokens, nil)
	e := &engine{pageSize: 16}
	v := NewRankView(16, 1000)
	v.Apply(0, Batch{Events: []Event{e.store(tokens, 0, 4, "GPU")}})
	// HiCache backs the pages up to host memory, then evicts the last two
	// from the GPU.
	backup := e.store(tokens, 0, 4, "CPU_PINNED")
	v.Apply(0, Batch{Events: []Event{backup, e.removeFrom(2, "GPU")}})
	if gpu, all := v.Match(blocks, 0); gpu != 2 || all != 4 {
		t.Errorf("after the GPU eviction: %d on GPU, %d in any tier; want 2 and 4", gpu, all)
	}
	v.Apply(0, Batch{Events: []Event{{Kind: AllBlocksCleared}}})
	if _, all := v.Match(blocks, 0); all != 0 {
		t.Errorf("after AllBlocksCleared: %d blocks", all)
	}

	// A store whose parent the view never saw is left out.
	orphan := e.store(tokens, 2, 4, "")
	v.Apply(0, Batch{Events: []Event{orphan}})
	salted := e.store(tokens, 0, 2, "")
	salted.CacheSalt = "tenant-a"
	broken := e.store(tokens, 0, 2, "")
	broken.TokenIDs = broken.TokenIDs[:20]
	v.Apply(0, Batch{Events: []Event{salted, broken}})
	if b, _ := v.Blocks(); b != 0 {
		t.Errorf("%d blocks from an orphan, a salted and a broken store", b)
	}
	c := v.Counts()
	if c.Orphans != 1 || c.Namespaced != 1 || c.Malformed != 1 {
		t.Errorf("counts %+v", c)
	}

	// Past its page bound the view starts over.
	small := NewRankView(16, 3)
	small.Apply(0, Batch{Events: []Event{e.store(tokens, 0, 4, "")}})
	if b, _ := small.Blocks(); b != 0 || small.Counts().Overflows != 1 {
		t.Errorf("over the bound: %d blocks, counts %+v", b, small.Counts())
	}

	v.Apply(0, Batch{Events: []Event{e.store(tokens, 0, 4, "")}})
	v.Reset("test")
	if b, p := v.Blocks(); b != 0 || p != 0 {
		t.Errorf("after Reset: %d blocks, %d pages", b, p)
	}
}

// BenchmarkRankView is the precise view's share of a request (Match over
// 64 blocks) and of ingestion (one store of 4 pages of 16 tokens).
func BenchmarkRankView(b *testing.B) {
	tokens := make([]int64, 64*16)
	for i := range tokens {
		tokens[i] = int64(i * 31 % 150000)
	}
	blocks := prefix.Hasher{BlockTokens: 16}.Tokens(tokens, nil)
	b.Run("match-64-blocks", func(b *testing.B) {
		v := NewRankView(16, 1<<20)
		e := &engine{pageSize: 16}
		v.Apply(0, Batch{Events: []Event{e.store(tokens, 0, 64, "")}})
		for b.Loop() {
			v.Match(blocks, 0)
		}
	})
	b.Run("store-4-pages", func(b *testing.B) {
		v := NewRankView(16, 1<<30)
		e := &engine{pageSize: 16}
		i := 0
		for b.Loop() {
			at := (i % 16) * 4
			if at == 0 {
				v.Reset("wrap")
				e.chain = nil
			}
			v.Apply(0, Batch{Events: []Event{e.store(tokens, at, at+4, "")}})
			i++
		}
	})
}

// TestRankViewExpect: blocks routed to a rank count as held on its GPU
// until their deadline or until the engine reports them; a report ends the
// expectation, so a later eviction is not hidden by it.
func TestRankViewExpect(t *testing.T) {
	tokens := make([]int64, 64)
	for i := range tokens {
		tokens[i] = int64(i + 7)
	}
	blocks := prefix.Hasher{BlockTokens: 16}.Tokens(tokens, nil)
	e := &engine{pageSize: 16}
	tests := []struct {
		name     string
		expect   int // leading blocks expected, deadline 100
		stored   int // leading pages stored, then the last evict pages evicted
		evict    int
		now      int64
		gpu, all int
	}{
		{name: "nothing", now: 0},
		{name: "expected, before the deadline", expect: 3, now: 50, gpu: 3, all: 3},
		{name: "expected, past the deadline", expect: 3, now: 100},
		{name: "expected beyond what is stored", expect: 4, stored: 2, now: 50, gpu: 4, all: 4},
		{name: "reported, then evicted", expect: 4, stored: 4, evict: 2, now: 50, gpu: 2, all: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := NewRankView(16, 1000)
			e.chain = nil
			v.Expect(blocks[:tc.expect], 100, 0)
			if tc.stored > 0 {
				v.Apply(0, Batch{Events: []Event{e.store(tokens, 0, tc.stored, "")}})
			}
			if tc.evict > 0 {
				v.Apply(0, Batch{Events: []Event{e.removeFrom(tc.stored-tc.evict, "GPU")}})
			}
			if gpu, all := v.Match(blocks, tc.now); gpu != tc.gpu || all != tc.all {
				t.Errorf("Match: %d on GPU, %d in any tier; want %d and %d", gpu, all, tc.gpu, tc.all)
			}
		})
	}
}

// TestRankViewCapacity: a view that holds more than four times its
// engine's KV capacity has missed removals and starts over.
func TestRankViewCapacity(t *testing.T) {
	tokens := make([]int64, 16*40)
	for i := range tokens {
		tokens[i] = int64(i + 11)
	}
	e := &engine{pageSize: 16}
	v := NewRankView(16, 1<<20)
	v.SetCapacity(16 * 10) // ten pages: the view may hold forty
	v.Apply(0, Batch{Events: []Event{e.store(tokens, 0, 40, "")}})
	if b, _ := v.Blocks(); b != 40 || v.Counts().Overflows != 0 {
		t.Fatalf("at four times the capacity: %d blocks, counts %+v", b, v.Counts())
	}
	more := make([]int64, 16)
	v.Apply(1, Batch{Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{999}, TokenIDs: more, BlockSize: 16}}})
	if b, _ := v.Blocks(); b != 0 || v.Counts().Overflows != 1 {
		t.Fatalf("past four times the capacity: %d blocks, counts %+v", b, v.Counts())
	}
}
