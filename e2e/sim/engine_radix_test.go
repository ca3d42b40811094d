package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// pdScenario runs 24 PD requests through a prefill and a decode core
// (2 ranks each, the decode short of KV so that its prealloc queue
// fills), delivering each prefill's KV to its decode when the transfer
// ends, and returns every request's admission, first-token and done
// times, the prefill's cache hits and the decode's tokens. tweak
// configures the decode core.
func pdScenario(t *testing.T, tweak func(*engineParams)) []time.Duration {
	t.Helper()
	p := testCore(t, "dense-8b-h100", ModePrefill, 2, false, func(p *engineParams) { p.capacity = 20000 })
	d := testCore(t, "dense-8b-h100", ModeDecode, 2, false, func(p *engineParams) {
		p.capacity = 9000
		if tweak != nil {
			tweak(p)
		}
	})
	var pre, dec []*engineRequest
	for i := 0; i < 24; i++ {
		at := time.Duration(i*37%23) * 11 * time.Millisecond
		prompt := 600 + (i*421)%2500
		spec := requestSpec{rank: i % 2, prompt: prompt, maxNew: 3 + (i*13)%40, blocks: seqBlocks(uint64(i%4)<<32, prompt/16)}
		p.advance(at - 1)
		spec.kind = kindPrefill
		q, err := p.submit(spec, max(at, p.now))
		if err != nil {
			t.Fatal(err)
		}
		pre = append(pre, q)
		d.advance(at - 1)
		spec.kind = kindDecode
		q2, err := d.submit(spec, max(at, d.now))
		if err != nil {
			t.Fatal(err)
		}
		dec = append(dec, q2)
	}
	for {
		next := never
		for i, q := range pre {
			if q.state == stDone && dec[i].state == stTransfer {
				next = min(next, q.doneAt)
			}
		}
		tp, okp := p.nextEvent()
		td, okd := d.nextEvent()
		if !okp && !okd && next == never {
			break
		}
		if okp {
			next = min(next, tp)
		}
		if okd {
			next = min(next, td)
		}
		p.advance(next)
		d.advance(next)
		for i, q := range pre {
			if q.state == stDone && dec[i].state == stTransfer && q.doneAt <= next {
				d.kvArrived(dec[i], next)
			}
		}
	}
	var out []time.Duration
	for i := range pre {
		out = append(out, pre[i].admittedAt, pre[i].firstTokenAt, pre[i].doneAt, time.Duration(pre[i].cached),
			dec[i].admittedAt, dec[i].firstTokenAt, dec[i].doneAt, time.Duration(dec[i].generated))
	}
	return out
}

// pdScenarioGolden is pdScenario's output captured before the decode
// radix cache existed.
var pdScenarioGolden = []time.Duration{
	0, 45360000, 48326079, 0, 0, 48326079, 62462319, 3,
	154000000, 221092441, 225438053, 0, 154000000, 225438053, 331972853, 16,
	153999999, 243179363, 248904508, 0, 153999999, 248904508, 448727068, 29,
	221092441, 666424252, 673528930, 0, 209000000, 677958901, 990810181, 42,
	243179363, 636628102, 645112313, 592, 208999999, 646749538, 755963378, 15,
	221092441, 666424252, 676287996, 1008, 208999999, 677958901, 883869061, 28,
	243179363, 636628102, 639679378, 624, 208999999, 639679378, 946322818, 41,
	221092441, 666424252, 670855061, 0, 208999999, 670855061, 770148661, 14,
	243179363, 636628102, 642438444, 592, 220000000, 646749538, 849248338, 27,
	221092441, 666424252, 673614127, 1008, 219999999, 677958901, 975813381, 40,
	243179363, 636628102, 645197510, 1440, 219999999, 646749538, 740708578, 13,
	221092441, 740578859, 750527799, 0, 883869061, 891213701, 1083402581, 26,
	243179363, 636628102, 639764575, 592, 62462319, 646749538, 939173378, 39,
	666424252, 740578859, 745094865, 1072, 883869061, 891213701, 975813381, 12,
	243179363, 636628102, 642523641, 1440, 448727068, 646749538, 834033858, 25,
	666424252, 740578859, 747853931, 1856, 975813381, 983225061, 1265239701, 38,
	243179363, 636628102, 645282706, 592, 755963378, 763387458, 841744738, 11,
	666424252, 740578859, 750612996, 2704, 990810181, 998223141, 1174336581, 24,
	243179363, 636628102, 639849772, 672, 755963378, 763387458, 1031242978, 37,
	666424252, 740578859, 745180062, 1088, 990810181, 998223141, 1068090501, 10,
	243179363, 636628102, 642608838, 592, 755963378, 763387458, 931948898, 23,
	666424252, 740578859, 747939127, 1936, 1083402581, 1090818421, 1353810981, 36,
	243179363, 636628102, 645367903, 1440, 841744738, 849248338, 909847058, 9,
	666424252, 740578859, 750698193, 1856, 1174336581, 1181688101, 1339454901, 22,
}

// TestEngineFlagsOffUnchanged checks that without the decode radix cache
// the engine behaves exactly as before it was added: same event times,
// same cache hits, same outputs.
func TestEngineFlagsOffUnchanged(t *testing.T) {
	if got := pdScenario(t, nil); !slices.Equal(got, pdScenarioGolden) {
		t.Fatalf("flags-off scenario changed:\n got %v\nwant %v", got, pdScenarioGolden)
	}
}

// radixCore is a dense-8b-h100 decode core with the decode radix cache;
// hostRatio > 0 adds a host tier of that many times the KV pool.
func radixCore(t *testing.T, capacity int, hostRatio float64) *engineCore {
	t.Helper()
	return testCore(t, "dense-8b-h100", ModeDecode, 1, false, func(p *engineParams) {
		p.capacity = capacity
		p.decodeRadix = true
		if hostRatio > 0 {
			p.hostBlocks = int(hostRatio*float64(capacity)) / p.prof.BlockSize
			p.loadGBps = DefaultHiCacheLoadGBps
		}
	})
}

// decodeTurn preallocates a decode request at at, delivers its KV at
// once and runs the core until it is idle.
func decodeTurn(t *testing.T, c *engineCore, blocks []uint64, prompt, maxNew int, at time.Duration) *engineRequest {
	t.Helper()
	q := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: prompt, maxNew: maxNew, blocks: blocks}, at)
	if q.state != stTransfer {
		t.Fatalf("decode request not preallocated at %v: state %v", at, q.state)
	}
	c.kvArrived(q, at)
	c.runUntilIdle()
	return q
}

func TestDecodeRadixPreallocAllocatesDeltaOnly(t *testing.T) {
	tests := []struct {
		name       string
		radix      bool
		wantHit    int
		wantPriv   int // second request's private KV after preallocation
		wantPinned int
	}{
		// 100 blocks cached by the first request; the second request's
		// prompt is those 1600 tokens plus 800 new ones.
		{name: "radix cache", radix: true, wantHit: 1600, wantPriv: 800, wantPinned: 100},
		{name: "no radix cache", radix: false, wantHit: 0, wantPriv: 2400, wantPinned: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := testCore(t, "dense-8b-h100", ModeDecode, 1, false, func(p *engineParams) { p.decodeRadix = tc.radix })
			first := seqBlocks(1<<40, 100)
			decodeTurn(t, c, first, 1600, 10, 0)
			r := c.ranks[0]
			if tc.radix && (r.cache.tokens() != 1600 || r.cache.evictable() != 1600 || r.referenced() != 0) {
				t.Fatalf("after the first request: cached %d, evictable %d, referenced %d; want 1600 cached, all evictable",
					r.cache.tokens(), r.cache.evictable(), r.referenced())
			}
			blocks := append(slices.Clone(first), seqBlocks(2<<40, 50)...)
			q := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: 2400, maxNew: 100, blocks: blocks}, time.Second)
			if q.decodePrefix != tc.wantHit || q.private != tc.wantPriv || len(q.chain) != tc.wantPinned || q.growth != 100 {
				t.Fatalf("prefix %d private %d pinned %d growth %d; want %d, %d, %d, 100",
					q.decodePrefix, q.private, len(q.chain), q.growth, tc.wantHit, tc.wantPriv, tc.wantPinned)
			}
			for _, b := range q.chain {
				if b.refs != 1 {
					t.Fatalf("matched block %x has %d refs, want pinned once", b.hash, b.refs)
				}
			}
			if got := r.referenced(); got != 2400 {
				t.Fatalf("referenced %d, want 2400 (pinned prefix plus the delta)", got)
			}
			s := c.snapshot(c.now)
			if s[0].prefixHits != int64(tc.wantHit) || (tc.radix && s[0].cacheHitRate != float64(tc.wantHit)/2400) {
				t.Fatalf("prefix hits %d, hit rate %v; want %d, %d/2400", s[0].prefixHits, s[0].cacheHitRate, tc.wantHit, tc.wantHit)
			}
			c.kvArrived(q, c.now)
			c.runUntilIdle()
			if r.private != 0 || r.growth != 0 || r.referenced() != 0 {
				t.Fatalf("KV left: private %d growth %d referenced %d", r.private, r.growth, r.referenced())
			}
		})
	}
}

func TestDecodeRadixAbortedCachesNothing(t *testing.T) {
	c := radixCore(t, 10000, 0)
	q := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: 1600, maxNew: 50, blocks: seqBlocks(1<<40, 100)}, 0)
	c.kvArrived(q, 0)
	c.advance(50 * time.Millisecond)
	if q.state != stRunning {
		t.Fatalf("state %v, want decoding", q.state)
	}
	c.abort(q, c.now)
	c.runUntilIdle()
	r := c.ranks[0]
	if r.cache.tokens() != 0 || q.cachedBlocks != nil || r.referenced() != 0 {
		t.Fatalf("aborted request left %d cached tokens (blocks %v), %d referenced", r.cache.tokens(), q.cachedBlocks, r.referenced())
	}
}

func TestPrefillTransferSendsDeltaOnly(t *testing.T) {
	run := func(prefix int, late bool) *engineRequest {
		c := testCore(t, "dense-8b-h100", ModePrefill, 1, false, nil)
		q := mustSubmit(t, c, requestSpec{kind: kindPrefill, prompt: 4000, maxNew: 1}, 0)
		if !late {
			c.setDecodePrefix(q, prefix)
		}
		c.advance(c.p.prof.prefillStepTime([]prefillChunk{{tokens: 4000}})) // the prefill's end
		if late {
			c.setDecodePrefix(q, prefix) // the transfer started: ignored
		}
		c.runUntilIdle()
		return q
	}
	prof := testCore(t, "dense-8b-h100", ModePrefill, 1, false, nil).p.prof
	tests := []struct {
		name     string
		prefix   int
		late     bool
		wantSent int
	}{
		{name: "no decode prefix", prefix: 0, wantSent: 4000},
		{name: "decode holds 3200", prefix: 3200, wantSent: 800},
		{name: "prefix told after the transfer started", prefix: 3200, late: true, wantSent: 4000},
		{name: "prefix clamped below the prompt", prefix: 9000, wantSent: 1},
	}
	base := run(0, false)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := run(tc.prefix, tc.late)
			if q.sent != tc.wantSent {
				t.Fatalf("sent %d tokens, want %d", q.sent, tc.wantSent)
			}
			if q.firstTokenAt != base.firstTokenAt {
				t.Fatalf("prefill compute changed: first token %v, want %v", q.firstTokenAt, base.firstTokenAt)
			}
			xfer := q.doneAt - q.firstTokenAt
			if xfer != prof.transferTime(tc.wantSent, prof.KVTransferGBps) {
				t.Fatalf("transfer %v, want %v", xfer, prof.transferTime(tc.wantSent, prof.KVTransferGBps))
			}
			// Shorter than the full transfer by exactly the moved tokens.
			saved := (base.doneAt - base.firstTokenAt) - xfer
			want := time.Duration(float64(4000-tc.wantSent) * float64(prof.KVBytesPerToken) / (prof.KVTransferGBps * 1e9) * float64(time.Second))
			if !near(saved, want) {
				t.Fatalf("saved %v, want %v", saved, want)
			}
		})
	}
}

// runToDone advances m until it is done with it, delivering a decode
// item's KV as soon as it is preallocated; it returns the end time.
func runToDone(t *testing.T, m *Model, it *Item, now time.Duration) time.Duration {
	t.Helper()
	for it.State() != ItemDone {
		if it.State() == ItemTransfer {
			m.KVArrived(now, it)
		}
		at, ok := m.NextEvent()
		if !ok {
			t.Fatalf("model idle with the item in state %v", it.State())
		}
		now = max(now, at)
		m.Advance(now)
	}
	return now
}

// turnBodies returns a first and a second turn request on route: the
// second turn's prompt is the first's, the first's answer, then new text,
// as a multi-turn client sends it.
func turnBodies(route string, seed *int64, answer string) (first, second string) {
	sys, q1, q2 := strings.Repeat("system prompt words ", 30), strings.Repeat("first question ", 20), "and a second question"
	seedJSON := ""
	if seed != nil {
		seedJSON = fmt.Sprintf(`,"seed":%d`, *seed)
	}
	switch route {
	case "/v1/chat/completions":
		msgs := fmt.Sprintf(`{"role":"system","content":%q},{"role":"user","content":%q}`, sys, q1)
		first = fmt.Sprintf(`{"messages":[%s],"max_tokens":40%s}`, msgs, seedJSON)
		second = fmt.Sprintf(`{"messages":[%s,{"role":"assistant","content":%q},{"role":"user","content":%q}],"max_tokens":40%s}`,
			msgs, answer, q2, seedJSON)
	case "/v1/completions":
		first = fmt.Sprintf(`{"prompt":%q,"max_tokens":40%s}`, sys+q1, seedJSON)
		second = fmt.Sprintf(`{"prompt":%q,"max_tokens":40%s}`, sys+q1+answer+q2, seedJSON)
	case "/generate":
		sp := `{"max_new_tokens":40}`
		if seed != nil {
			sp = fmt.Sprintf(`{"max_new_tokens":40,"sampling_seed":%d}`, *seed)
		}
		first = fmt.Sprintf(`{"text":%q,"sampling_params":%s}`, sys+q1, sp)
		second = fmt.Sprintf(`{"text":%q,"sampling_params":%s}`, sys+q1+answer+q2, sp)
	}
	return first, second
}

func TestDecodeRadixSecondTurnHitsTheAnswer(t *testing.T) {
	seed := int64(7)
	tests := []struct {
		name  string
		route string
		seed  *int64
	}{
		{name: "chat with seed", route: "/v1/chat/completions", seed: &seed},
		{name: "chat without seed", route: "/v1/chat/completions"},
		{name: "completions with seed", route: "/v1/completions", seed: &seed},
		{name: "generate with sampling_seed", route: "/generate", seed: &seed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewModel(Config{Mode: ModeDecode, Profile: "dense-8b-h100", DecodeRadixCache: true})
			if err != nil {
				t.Fatal(err)
			}
			bt := m.core.p.prof.BlockSize
			answer := answerText(tc.seed, 40)
			if tc.seed != nil && answer != ReplyText(seed, 40) {
				t.Fatalf("answer %q is not ReplyText", answer)
			}
			b1, b2 := turnBodies(tc.route, tc.seed, answer)
			p1, err := ParsePrompt(tc.route, []byte(b1), bt)
			if err != nil {
				t.Fatal(err)
			}
			p2, err := ParsePrompt(tc.route, []byte(b2), bt)
			if err != nil {
				t.Fatal(err)
			}
			it1, err := m.Submit(0, 0, p1, p1.MaxTokens)
			if err != nil {
				t.Fatal(err)
			}
			end := runToDone(t, m, it1, 0)
			cached := it1.CachedBlocks()
			// Committed KV: prompt and answer but its last token.
			if want := (p1.Tokens + 39) / bt; len(cached) != want || len(cached) <= len(p1.Blocks) {
				t.Fatalf("cached %d blocks, want %d (more than the prompt's %d)", len(cached), want, len(p1.Blocks))
			}
			if !slices.Equal(cached, p2.Blocks[:len(cached)]) {
				t.Fatal("the first turn's cached blocks are not a prefix of the second turn's prompt")
			}
			want := len(cached) * bt
			if got := m.DecodeCachedPrefix(0, p2); got != want {
				t.Fatalf("DecodeCachedPrefix %d, want %d", got, want)
			}
			it2, err := m.Submit(end+time.Second, 0, p2, p2.MaxTokens)
			if err != nil {
				t.Fatal(err)
			}
			m.Advance(end + time.Second)
			if it2.DecodePrefix() != want || it2.DecodePrefix() <= p1.Tokens || it2.HostHit() != 0 {
				t.Fatalf("second turn matched %d (host %d), want %d, beyond the first prompt's %d tokens",
					it2.DecodePrefix(), it2.HostHit(), want, p1.Tokens)
			}
		})
	}
}

// matchTokens is what c's rank 0 would match of blocks for a prompt of
// prompt tokens: GPU tier, host tier.
func matchTokens(c *engineCore, blocks []uint64, prompt int) (gpu, host int) {
	m := c.matchDecode(c.ranks[0], blocks, prompt)
	return len(m.gpu) * c.p.prof.BlockSize, len(m.host) * c.p.prof.BlockSize
}

func TestDecodeRadixLRUEviction(t *testing.T) {
	// A KV pool of 1000 tokens; A, B and C are 480-token prompts (30
	// blocks) with one output token, so each caches its 30 prompt blocks.
	// After A, B, A again, C needs room: B, the least recently used, loses
	// its deepest blocks first; A keeps all of its. With a host tier, B's
	// evicted blocks stay in host memory.
	tests := []struct {
		name                string
		hostRatio           float64
		wantBGPU, wantBHost int
	}{
		{name: "GPU tier only", wantBGPU: 32},
		{name: "with a host tier", hostRatio: 2, wantBGPU: 32, wantBHost: 29*16 - 32},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := radixCore(t, 1000, tc.hostRatio)
			A, B, C := seqBlocks(1<<40, 30), seqBlocks(2<<40, 30), seqBlocks(3<<40, 30)
			at := time.Duration(0)
			turn := func(blocks []uint64) *engineRequest {
				at += time.Second
				return decodeTurn(t, c, blocks, 480, 1, at)
			}
			turn(A)
			turn(B)
			if q := turn(A); q.decodePrefix != 464 {
				t.Fatalf("A matched %d, want 464 (at most prompt-1 tokens)", q.decodePrefix)
			}
			turn(C)
			if gpu, host := matchTokens(c, A, 480); gpu != 464 || host != 0 {
				t.Fatalf("A: GPU %d host %d, want all 464 tokens on the GPU", gpu, host)
			}
			if gpu, host := matchTokens(c, B, 480); gpu != tc.wantBGPU || host != tc.wantBHost {
				t.Fatalf("B: GPU %d host %d, want %d and %d", gpu, host, tc.wantBGPU, tc.wantBHost)
			}
			if got := c.ranks[0].cache.tokens(); got > 1000 {
				t.Fatalf("GPU tier holds %d tokens, capacity 1000", got)
			}
		})
	}
}

// hostTierSetup returns a decode core with a host tier (KV pool of 1000
// tokens) where 27 of prompt B's 30 blocks were evicted to host memory,
// and B's blocks.
func hostTierSetup(t *testing.T) (*engineCore, []uint64) {
	t.Helper()
	c := radixCore(t, 1000, 2)
	A, B, C := seqBlocks(1<<40, 30), seqBlocks(2<<40, 30), seqBlocks(3<<40, 30)
	for i, blocks := range [][]uint64{A, B, A, C} {
		decodeTurn(t, c, blocks, 480, 1, time.Duration(i+1)*time.Second)
	}
	return c, B
}

func TestDecodeHostTierLoadBackDoesNotBlockOthers(t *testing.T) {
	// A request loading from the host tier waits; one preallocated after
	// it without a host hit, whose KV arrives at the same time, does not
	// wait behind it.
	c, B := hostTierSetup(t)
	at := 10 * time.Second
	slow := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: 480, maxNew: 5, blocks: B}, at)
	fast := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: 100, maxNew: 5, blocks: seqBlocks(5<<40, 6)}, at)
	c.kvArrived(slow, at)
	c.kvArrived(fast, at)
	c.runUntilIdle()
	if fast.firstTokenAt != at {
		t.Fatalf("request without a host hit started at %v, want %v", fast.firstTokenAt, at)
	}
	if slow.firstTokenAt < at+c.loadTime(slow.hostHit) || slow.hostHit == 0 {
		t.Fatalf("host-hit request (%d tokens from host) started at %v, before its load-back ended at %v",
			slow.hostHit, slow.firstTokenAt, at+c.loadTime(slow.hostHit))
	}
}

func TestDecodeHostTierLoadBack(t *testing.T) {
	// As in TestDecodeRadixLRUEviction, B's deep blocks are evicted to
	// the host tier; B's next turn matches 2 blocks on the GPU and 27 in
	// host memory, which it loads back: it may decode only when both its
	// KV (delivered at once here) and the load-back are done.
	c, B := hostTierSetup(t)
	at := 10 * time.Second
	q := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: 480, maxNew: 5, blocks: B}, at)
	if q.decodePrefix != 464 || q.hostHit != 432 || q.private != 16 {
		t.Fatalf("prefix %d host %d private %d, want 464, 432 and the 16-token delta", q.decodePrefix, q.hostHit, q.private)
	}
	r := c.ranks[0]
	if gpu, host := matchTokens(c, B, 480); gpu != 464 || host != 0 {
		t.Fatalf("after the load-back B is GPU %d host %d, want all 464 on the GPU", gpu, host)
	}
	if r.cache.tokens()+r.private > c.p.capacity {
		t.Fatalf("GPU tier over capacity: %d cached + %d private", r.cache.tokens(), r.private)
	}
	load := c.loadTime(432)
	// 432 tokens × 128 KiB at 25 GB/s ≈ 2.26 ms.
	if want := msf(432 * 131072 / 25e9 * 1000); !near(load, want) {
		t.Fatalf("load-back time %v, want %v", load, want)
	}
	c.kvArrived(q, at)
	c.runUntilIdle()
	if q.firstTokenAt != at+load {
		t.Fatalf("first token at %v, want %v (KV at %v, load-back done at %v)", q.firstTokenAt, at+load, at, at+load)
	}
	// KV arriving after the load-back is not delayed.
	late := mustSubmit(t, c, requestSpec{kind: kindDecode, prompt: 480, maxNew: 5, blocks: seqBlocks(4<<40, 30)}, at+time.Second)
	c.kvArrived(late, at+2*time.Second)
	c.runUntilIdle()
	if late.firstTokenAt != at+2*time.Second {
		t.Fatalf("first token at %v, want the KV arrival %v", late.firstTokenAt, at+2*time.Second)
	}
}

func TestHostCacheLRU(t *testing.T) {
	tests := []struct {
		name  string
		ops   func(h *hostCache)
		query []uint64
		want  int
		size  int
	}{
		{name: "bounded, oldest dropped", ops: func(h *hostCache) {
			for _, x := range []uint64{1, 2, 3, 4} {
				h.add(&cacheBlock{hash: x})
			}
		}, query: []uint64{2, 3, 4}, want: 3, size: 3},
		{name: "re-added block is most recent", ops: func(h *hostCache) {
			h.add(&cacheBlock{hash: 1})
			h.add(&cacheBlock{hash: 2})
			h.add(&cacheBlock{hash: 3})
			h.add(&cacheBlock{hash: 1})
			h.add(&cacheBlock{hash: 4})
		}, query: []uint64{1, 3, 4}, want: 3, size: 3},
		{name: "removed block ends the match", ops: func(h *hostCache) {
			h.add(&cacheBlock{hash: 1})
			h.add(&cacheBlock{hash: 2})
			h.add(&cacheBlock{hash: 3})
			h.remove(2)
		}, query: []uint64{1, 2, 3}, want: 1, size: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHostCache(3)
			tc.ops(h)
			if got := len(h.match(tc.query)); got != tc.want || h.len() != tc.size {
				t.Fatalf("matched %d of %v with %d blocks held, want %d with %d", got, tc.query, h.len(), tc.want, tc.size)
			}
		})
	}
}
