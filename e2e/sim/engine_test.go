package sim

import (
	"math"
	"testing"
	"time"
)

// testCore builds an engine core for profile name with overrides.
func testCore(t *testing.T, name string, mode Mode, dp int, lockstep bool, tweak func(*engineParams)) *engineCore {
	t.Helper()
	prof, err := LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	p := engineParams{
		prof: prof, mode: mode, dpSize: dp, lockstep: lockstep,
		capacity: prof.MaxTotalTokens, maxRunning: prof.MaxRunningRequests,
		chunk: prof.ChunkedPrefillSize, gbps: prof.KVTransferGBps,
	}
	if tweak != nil {
		tweak(&p)
	}
	return newEngineCore(p)
}

// mustSubmit submits at time at, first advancing the model to just before
// it (so requests submitted at the same time arrive together).
func mustSubmit(t *testing.T, c *engineCore, spec requestSpec, at time.Duration) *engineRequest {
	t.Helper()
	if at > 0 {
		c.advance(at - 1)
	}
	q, err := c.submit(spec, at)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	return q
}

// seqBlocks returns n distinct block hashes starting at base.
func seqBlocks(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

// near reports whether a and b differ by less than 1µs.
func near(a, b time.Duration) bool { return math.Abs(float64(a-b)) < float64(time.Microsecond) }

func TestEngineSingleRequestFollowsFormulas(t *testing.T) {
	c := testCore(t, "dense-8b-h100", ModeNull, 1, false, nil)
	prof := c.p.prof
	q := mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 4096, maxNew: 10}, 0)
	c.runUntilIdle()
	// c0 + c1·4096 + c2·4096·(0 + 4096/2) = 15 + 204.8 + 16.777 ms.
	ttft := prof.prefillStepTime([]prefillChunk{{tokens: 4096}})
	if want := msf(15 + 204.8 + 2e-6*4096*2048); !near(ttft, want) {
		t.Fatalf("prefill formula %v, want %v", ttft, want)
	}
	if q.firstTokenAt != ttft {
		t.Fatalf("first token at %v, want %v", q.firstTokenAt, ttft)
	}
	// Nine decode steps, one running request, context 4097..4105.
	want := ttft
	for i := 1; i < 10; i++ {
		want += prof.decodeStepTime(1, 4096+i)
	}
	if q.doneAt != want || q.generated != 10 || q.state != stDone {
		t.Fatalf("done at %v with %d tokens, want %v with 10", q.doneAt, q.generated, want)
	}
	if got := prof.decodeStepTime(64, 64*2048); !near(got, msf(7+64*0.02+0.08*64*2048/1000.0)) {
		t.Fatalf("decode formula %v", got)
	}
	r := c.ranks[0]
	if r.private != 0 || r.growth != 0 || r.referenced() != 0 {
		t.Fatalf("KV left after finishing: private %d growth %d referenced %d", r.private, r.growth, r.referenced())
	}
}

func TestEngineChunkedPrefill(t *testing.T) {
	// dsv3: 1024-token chunks, so a 2500-token prompt takes 3 steps.
	c := testCore(t, "dsv3-dp8-h100-node", ModeNull, 1, false, nil)
	prof := c.p.prof
	q := mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 2500, maxNew: 1}, 0)
	c.runUntilIdle()
	want := prof.prefillStepTime([]prefillChunk{{tokens: 1024, before: 0}}) +
		prof.prefillStepTime([]prefillChunk{{tokens: 1024, before: 1024}}) +
		prof.prefillStepTime([]prefillChunk{{tokens: 452, before: 2048}})
	if q.firstTokenAt != want || q.doneAt != want {
		t.Fatalf("first token %v done %v, want %v", q.firstTokenAt, q.doneAt, want)
	}
}

func TestEngineQueueingGrowsTTFT(t *testing.T) {
	// One rank, arrivals every 50 ms of requests that each need about
	// 120 ms of prefill plus decode: the queue, and TTFT, keep growing.
	c := testCore(t, "dense-8b-h100", ModeNull, 1, false, func(p *engineParams) { p.maxRunning = 2 })
	var reqs []*engineRequest
	for i := 0; i < 12; i++ {
		at := time.Duration(i) * 50 * time.Millisecond
		reqs = append(reqs, mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 2000, maxNew: 20, blocks: seqBlocks(uint64(i)<<32, 125)}, at))
	}
	c.runUntilIdle()
	ttft := func(q *engineRequest) time.Duration { return q.firstTokenAt - q.arrived }
	first, last := ttft(reqs[0]), ttft(reqs[len(reqs)-1])
	if last < 5*first {
		t.Fatalf("TTFT did not grow under overload: first %v last %v", first, last)
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].admittedAt < reqs[i-1].admittedAt {
			t.Fatalf("not first come first served: %d admitted at %v before %d at %v", i, reqs[i].admittedAt, i-1, reqs[i-1].admittedAt)
		}
	}
	// Under light load (one request every second) TTFT stays the
	// prefill time.
	c = testCore(t, "dense-8b-h100", ModeNull, 1, false, nil)
	var light []*engineRequest
	for i := 0; i < 5; i++ {
		light = append(light, mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 2000, maxNew: 20, blocks: seqBlocks(uint64(i)<<32, 125)}, time.Duration(i)*time.Second))
	}
	c.runUntilIdle()
	for _, q := range light {
		if ttft(q) != ttft(light[0]) {
			t.Fatalf("TTFT under light load varies: %v vs %v", ttft(q), ttft(light[0]))
		}
	}
}

func TestEngineSnapshotShowsQueue(t *testing.T) {
	c := testCore(t, "dense-8b-h100", ModeNull, 2, false, func(p *engineParams) { p.maxRunning = 1 })
	for i := 0; i < 3; i++ {
		mustSubmit(t, c, requestSpec{kind: kindUnified, rank: 1, prompt: 1000, maxNew: 100}, 0)
	}
	c.advance(100 * time.Millisecond)
	s := c.snapshot(c.now)
	if s[1].running != 1 || s[1].waiting != 2 || s[1].usedTokens <= 1000 || s[1].totalTokens != s[1].usedTokens+2000 {
		t.Fatalf("rank 1 %+v", s[1])
	}
	if s[0].running != 0 || s[0].waiting != 0 || s[0].usedTokens != 0 {
		t.Fatalf("rank 0 %+v", s[0])
	}
}

// lockstepRun submits 2048-token requests (4 output tokens: the work is
// mostly prefill) at t=0 on the given ranks of a 2-rank dsv3 server and
// returns when the last one finished, and the mean balance ratio.
func lockstepRun(t *testing.T, lockstep bool, ranks []int) (time.Duration, float64) {
	c := testCore(t, "dsv3-dp8-h100-node", ModeNull, 2, lockstep, nil)
	var reqs []*engineRequest
	for i, r := range ranks {
		reqs = append(reqs, mustSubmit(t, c, requestSpec{kind: kindUnified, rank: r, prompt: 2048, maxNew: 4, blocks: seqBlocks(uint64(i)<<32, 128)}, 0))
	}
	c.runUntilIdle()
	var end time.Duration
	for _, q := range reqs {
		end = max(end, q.doneAt)
	}
	return end, c.balanceRatio()
}

func TestEngineLockstepPenalisesImbalance(t *testing.T) {
	balanced, bRatio := lockstepRun(t, true, []int{0, 1, 0, 1})
	imbalanced, iRatio := lockstepRun(t, true, []int{0, 0, 0, 0})
	if imbalanced < balanced*3/2 {
		t.Fatalf("same work, imbalanced %v vs balanced %v: imbalance should cost", imbalanced, balanced)
	}
	if bRatio < 0.99 || iRatio > 0.55 {
		t.Fatalf("balance ratio balanced %.3f (want 1), imbalanced %.3f (want 0.5)", bRatio, iRatio)
	}
	t.Logf("lockstep: balanced %v (ratio %.2f), imbalanced %v (ratio %.2f)", balanced, bRatio, imbalanced, iRatio)
}

func TestEngineLockstepStretchesOtherRanks(t *testing.T) {
	// Rank 1 decodes a short request while rank 0 prefills a long prompt
	// (8 chunks of 1024). Under lockstep every step lasts as long as
	// rank 0's prefill chunk, so rank 1's request finishes much later
	// than on an independent rank.
	run := func(lockstep bool) (short, long *engineRequest) {
		c := testCore(t, "dsv3-dp8-h100-node", ModeNull, 2, lockstep, nil)
		short = mustSubmit(t, c, requestSpec{kind: kindUnified, rank: 1, prompt: 100, maxNew: 10}, 0)
		long = mustSubmit(t, c, requestSpec{kind: kindUnified, rank: 0, prompt: 8192, maxNew: 1}, 0)
		c.runUntilIdle()
		return short, long
	}
	sLock, lLock := run(true)
	sFree, lFree := run(false)
	if lLock.doneAt != lFree.doneAt {
		t.Fatalf("the slow rank's request should not change: %v vs %v", lLock.doneAt, lFree.doneAt)
	}
	if sLock.doneAt < 3*sFree.doneAt {
		t.Fatalf("lockstep short request done at %v, independent %v: lockstep should stretch it", sLock.doneAt, sFree.doneAt)
	}
}

func TestEnginePrefixCacheSkipsPrefill(t *testing.T) {
	c := testCore(t, "dense-8b-h100", ModeNull, 2, false, nil)
	blocks := seqBlocks(7, 256) // 4096 tokens
	a := mustSubmit(t, c, requestSpec{kind: kindUnified, rank: 0, prompt: 4096, maxNew: 1, blocks: blocks}, 0)
	c.runUntilIdle()
	b := mustSubmit(t, c, requestSpec{kind: kindUnified, rank: 0, prompt: 4096, maxNew: 1, blocks: blocks}, time.Second)
	c.runUntilIdle()
	other := mustSubmit(t, c, requestSpec{kind: kindUnified, rank: 1, prompt: 4096, maxNew: 1, blocks: blocks}, 2*time.Second)
	c.runUntilIdle()
	if a.cached != 0 || other.cached != 0 {
		t.Fatalf("cold requests hit the cache: %d, %d (the cache is per rank)", a.cached, other.cached)
	}
	// At most prompt-1 tokens are reused: 255 blocks of 16.
	if b.cached != 4080 {
		t.Fatalf("warm request cached %d, want 4080", b.cached)
	}
	cold, warm := a.firstTokenAt-a.arrived, b.firstTokenAt-b.arrived
	want := c.p.prof.prefillStepTime([]prefillChunk{{tokens: 16, before: 4080}})
	if warm != want || cold < 5*warm {
		t.Fatalf("cold TTFT %v, warm %v (want %v)", cold, warm, want)
	}
	s := c.snapshot(c.now)
	if s[0].prefixHits != 4080 || s[0].prefixQueries != 8192 || math.Abs(s[0].cacheHitRate-4080.0/4096) > 1e-9 {
		t.Fatalf("rank 0 stats %+v", s[0])
	}
	if s[1].cacheHitRate != 0 {
		t.Fatalf("rank 1 hit rate %v", s[1].cacheHitRate)
	}
	// Cached blocks are not "used": SGLang counts them as evictable.
	if s[0].usedTokens != 0 || c.ranks[0].cache.tokens() != 4096 {
		t.Fatalf("used %d, cached %d", s[0].usedTokens, c.ranks[0].cache.tokens())
	}
}

func TestEnginePrefixCacheLRUEviction(t *testing.T) {
	c := testCore(t, "dense-8b-h100", ModeNull, 1, false, func(p *engineParams) { p.capacity = 1000 })
	A, B, C := seqBlocks(1<<40, 30), seqBlocks(2<<40, 30), seqBlocks(3<<40, 30)
	at := time.Duration(0)
	run := func(blocks []uint64) *engineRequest {
		at += time.Second
		q := mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 480, maxNew: 1, blocks: blocks}, at)
		c.runUntilIdle()
		return q
	}
	run(A)
	run(B)
	if q := run(A); q.cached != 464 { // A is now the most recently used
		t.Fatalf("A hit %d, want 464", q.cached)
	}
	run(C) // needs room: evicts B (least recently used), deepest blocks first
	if q := run(A); q.cached != 464 {
		t.Fatalf("A evicted: hit %d", q.cached)
	}
	if q := run(B); q.cached >= 100 || q.cached == 0 {
		t.Fatalf("B should have lost its tail blocks only: hit %d", q.cached)
	}
	if got := c.ranks[0].cache.tokens(); got > 1000 {
		t.Fatalf("cache holds %d tokens, capacity 1000", got)
	}
}

func TestEngineKVBudgetBlocksAdmission(t *testing.T) {
	// Each request needs 1000 prompt + 500 output tokens of KV; 3200
	// tokens fit two.
	c := testCore(t, "dense-8b-h100", ModeNull, 1, false, func(p *engineParams) { p.capacity = 3200 })
	var reqs []*engineRequest
	for i := 0; i < 3; i++ {
		reqs = append(reqs, mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 1000, maxNew: 500, blocks: seqBlocks(uint64(i)<<32, 62)}, 0))
	}
	c.advance(time.Second)
	if reqs[0].state != stRunning || reqs[1].state != stRunning || reqs[2].state != stWaiting {
		t.Fatalf("states %v %v %v", reqs[0].state, reqs[1].state, reqs[2].state)
	}
	if s := c.snapshot(c.now); s[0].waiting != 1 || s[0].totalTokens != s[0].usedTokens+1000 {
		t.Fatalf("snapshot %+v", s[0])
	}
	c.runUntilIdle()
	if reqs[2].admittedAt < min(reqs[0].doneAt, reqs[1].doneAt) {
		t.Fatalf("third admitted at %v before KV was freed (%v, %v)", reqs[2].admittedAt, reqs[0].doneAt, reqs[1].doneAt)
	}
	// A prompt that can never fit is rejected.
	if _, err := c.submit(requestSpec{kind: kindUnified, prompt: 3200, maxNew: 1}, c.now); err == nil {
		t.Fatal("oversized prompt accepted")
	}
	// Output is clipped to what fits.
	q := mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 3000, maxNew: 1000}, c.now)
	if q.maxNew != 200 {
		t.Fatalf("max new %d, want 200", q.maxNew)
	}
}

func TestEngineAbortFreesKV(t *testing.T) {
	c := testCore(t, "dense-8b-h100", ModeNull, 1, false, nil)
	q := mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 1000, maxNew: 1000, blocks: seqBlocks(1, 62)}, 0)
	w := mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 1000, maxNew: 1000}, 0)
	c.advance(500 * time.Millisecond)
	c.abort(q, c.now)
	c.abort(w, c.now)
	c.abort(w, c.now) // idempotent
	r := c.ranks[0]
	if !q.aborted || q.state != stDone || r.private != 0 || r.growth != 0 || r.referenced() != 0 || len(r.running) != 0 {
		t.Fatalf("after abort: private %d growth %d referenced %d running %d", r.private, r.growth, r.referenced(), len(r.running))
	}
	c.runUntilIdle()
}

func TestEnginePDLegs(t *testing.T) {
	// Prefill: done when the KV transfer ends.
	p := testCore(t, "dense-8b-h100", ModePrefill, 1, false, nil)
	q := mustSubmit(t, p, requestSpec{kind: kindPrefill, prompt: 4000, maxNew: 50}, 0)
	p.runUntilIdle()
	prof := p.p.prof
	prefill := prof.prefillStepTime([]prefillChunk{{tokens: 4000}})
	// 4000 × 128 KiB at 40 GB/s ≈ 13.1 ms, plus 1 ms setup.
	xfer := prof.transferTime(4000, 40)
	if !near(xfer, msf(1+4000*131072/40e9*1000)) {
		t.Fatalf("transfer time %v", xfer)
	}
	if q.generated != 1 || q.firstTokenAt != prefill || q.doneAt != prefill+xfer {
		t.Fatalf("prefill leg: %d tokens, first at %v, done at %v; want %v + %v", q.generated, q.firstTokenAt, q.doneAt, prefill, xfer)
	}
	if s := p.snapshot(p.now); s[0].xferMS <= 0 || s[0].usedTokens != 0 {
		t.Fatalf("prefill snapshot %+v", s[0])
	}

	// Decode: preallocation waits for KV; decoding starts when the KV
	// arrives, with the prefill's token first.
	d := testCore(t, "dense-8b-h100", ModeDecode, 1, false, func(p *engineParams) { p.capacity = 5000 })
	a := mustSubmit(t, d, requestSpec{kind: kindDecode, prompt: 3000, maxNew: 10}, 0)
	b := mustSubmit(t, d, requestSpec{kind: kindDecode, prompt: 3000, maxNew: 10}, 0)
	if a.state != stTransfer || b.state != stWaiting {
		t.Fatalf("prealloc states %v %v", a.state, b.state)
	}
	if s := d.snapshot(0); s[0].transfer != 1 || s[0].waiting != 1 || s[0].usedTokens != 3000 {
		t.Fatalf("decode snapshot %+v", s[0])
	}
	d.advance(100 * time.Millisecond)
	d.kvArrived(a, 100*time.Millisecond)
	d.runUntilIdle()
	if a.firstTokenAt != 100*time.Millisecond || a.generated != 10 || a.state != stDone {
		t.Fatalf("decode leg: first token %v, %d tokens, state %v", a.firstTokenAt, a.generated, a.state)
	}
	if b.state != stTransfer || b.admittedAt != a.doneAt {
		t.Fatalf("second decode preallocated at %v (state %v), want when the first finished (%v)", b.admittedAt, b.state, a.doneAt)
	}
}

func TestEngineDeterministic(t *testing.T) {
	// The same arrivals give the same batches, token times and cache hits.
	run := func() []time.Duration {
		c := testCore(t, "dsv3-dp8-h100-node", ModeNull, 4, true, func(p *engineParams) { p.capacity = 20000 })
		var reqs []*engineRequest
		for i := 0; i < 60; i++ {
			at := time.Duration(i*i%97) * 7 * time.Millisecond
			spec := requestSpec{kind: kindUnified, rank: i % 4, prompt: 500 + (i*379)%3000, maxNew: 5 + (i*31)%60,
				blocks: seqBlocks(uint64(i%5)<<32, (500+(i*379)%3000)/16)}
			c.advance(at - 1)
			q, err := c.submit(spec, max(at, c.now))
			if err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, q)
		}
		c.runUntilIdle()
		var out []time.Duration
		for _, q := range reqs {
			out = append(out, q.admittedAt, q.firstTokenAt, q.doneAt, time.Duration(q.cached))
		}
		return out
	}
	a, b := run(), run()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("runs differ at %d: %v vs %v", i, a[i], b[i])
		}
	}
}
