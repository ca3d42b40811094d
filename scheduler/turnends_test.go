package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/duet-router/duet/scheduler/prefix"
)

// prefixMaxBlocks is the hashed blocks' bound.
const prefixMaxBlocks = prefix.DefaultMaxBlocks

// candidateSpy is a decode policy that reads decode caches and records the
// candidates of each pick; it picks the candidate at pick, or the first.
type candidateSpy struct {
	pick  int
	cands [][]Candidate
}

func (*candidateSpy) Name() string           { return "spy" }
func (*candidateSpy) ReadsDecodeCache() bool { return true }
func (p *candidateSpy) Pick(_ context.Context, _ *Request, cands []Candidate) (int, error) {
	p.cands = append(p.cands, append([]Candidate(nil), cands...))
	return min(p.pick, len(cands)-1), nil
}

// cachedOn returns the CachedTokens of the candidate on url in cands.
func cachedOn(cands []Candidate, url string) int64 {
	for _, c := range cands {
		if c.Endpoint.URL == url {
			return c.CachedTokens
		}
	}
	return -1
}

// TestDecodeCacheCountsEarlierTurns checks what a decode engine with a
// decode radix cache is believed to hold: after a turn routed there, the
// next turn matches that turn's prompt and, once its usage reported the
// answer's length, the answer; an engine without the cache gets nothing;
// and a pool without any such engine matches nothing for the decode role.
func TestDecodeCacheCountsEarlierTurns(t *testing.T) {
	radixInfo := `{"dp_size":1,"disaggregation_mode":"decode","disaggregation_decode_enable_radix_cache":true}`
	plainInfo := `{"dp_size":1,"disaggregation_mode":"decode"}`
	prefill := newFakeEngine(t, serverInfo200(info(1, "prefill", 8998)))
	radix := newFakeEngine(t, serverInfo200(radixInfo))
	plain := newFakeEngine(t, serverInfo200(plainInfo))
	spy := &candidateSpy{}
	s := newTestScheduler(t, Config{
		Prefill:              []EndpointSpec{{URL: prefill.url()}},
		Decode:               []EndpointSpec{{URL: radix.url()}, {URL: plain.url()}},
		DecodePolicyInstance: spy,
	}, nil)
	mustDiscover(t, s)

	// Turn 1: 4000 characters (1000 tokens at 4 per token), to the radix
	// engine (candidate 0).
	turn1 := strings.Repeat("abcd", 1000)
	if _, err := s.Pick(t.Context(), &Request{ID: "t1", Prompt: []byte(turn1), MaxTokens: 200}); err != nil {
		t.Fatalf("Pick t1: %v", err)
	}
	// Turn 2 before turn 1's usage: turn 1's prompt. It goes to the
	// engine without the cache, so that only turn 1 is on the radix one.
	spy.pick = 1
	answer := strings.Repeat("wxyz", 200) // 200 tokens
	turn2 := turn1 + answer + strings.Repeat("efgh", 100)
	if _, err := s.Pick(t.Context(), &Request{ID: "t2a", Prompt: []byte(turn2), MaxTokens: 200}); err != nil {
		t.Fatalf("Pick t2a: %v", err)
	}
	got := spy.cands[1]
	if c := cachedOn(got, radix.url()); c != 1000 {
		t.Errorf("before the answer is reported, the radix engine holds %d tokens, want 1000 (turn 1's prompt)", c)
	}
	if c := cachedOn(got, plain.url()); c != 0 {
		t.Errorf("the engine without a decode cache holds %d tokens, want 0", c)
	}
	// Turn 1 ends with 200 tokens of answer.
	spy.pick = 0
	s.Complete(Feedback{RequestID: "t1", CompletionTokens: 200, PromptTokens: 1000})
	if _, err := s.Pick(t.Context(), &Request{ID: "t2b", Prompt: []byte(turn2), MaxTokens: 200}); err != nil {
		t.Fatalf("Pick t2b: %v", err)
	}
	if c := cachedOn(spy.cands[2], radix.url()); c != 1200 {
		t.Errorf("after the answer, the radix engine holds %d tokens, want 1200 (prompt and answer)", c)
	}

	// A pool without decode caches: nothing is matched for decode.
	spy2 := &candidateSpy{}
	s2 := newTestScheduler(t, Config{
		Prefill:              []EndpointSpec{{URL: prefill.url()}},
		Decode:               []EndpointSpec{{URL: plain.url()}},
		DecodePolicyInstance: spy2,
	}, nil)
	mustDiscover(t, s2)
	for _, id := range []string{"a", "b"} {
		if _, err := s2.Pick(t.Context(), &Request{ID: id, Prompt: []byte(turn1), MaxTokens: 200}); err != nil {
			t.Fatalf("Pick: %v", err)
		}
	}
	if c := spy2.cands[1][0].CachedTokens; c != 0 {
		t.Errorf("a pool without decode caches matched %d tokens on decode", c)
	}
	if n := s2.index.Targets(); n != 0 {
		t.Errorf("a pool without decode caches indexed %d targets, want 0 (the default prefill policy indexes none here)", n)
	}
}

// TestTurnEndsBounded checks how a target's turn ends are kept: within its
// cache's capacity, least recently routed forgotten first, at most
// maxTurnEndsPerTarget of them; a turn replaces the one it extends; an
// answer extends only the chain of the same prompt.
func TestTurnEndsBounded(t *testing.T) {
	te := newTurnEnds()
	key := TargetKey{URL: "http://d", Rank: 0}
	end := func(b uint64) turnEnd { return turnEnd{target: key, block: b} }
	te.setCapacity(key, 100000)
	te.put(end(1), turnChain{tokens: 40000, sum: 1}, nil)
	te.put(end(2), turnChain{tokens: 40000, sum: 2}, nil)
	if got := te.counter(key).Load(); got != 80000 {
		t.Fatalf("total %d, want 80000", got)
	}
	// A third conversation does not fit beside both: the oldest goes.
	te.put(end(3), turnChain{tokens: 30000, sum: 3}, nil)
	if _, ok := te.lookup(end(1)); ok {
		t.Error("the least recently routed chain was kept beyond the capacity")
	}
	if got := te.counter(key).Load(); got != 70000 {
		t.Errorf("total %d, want 70000", got)
	}
	// Turn 2 of conversation 2 extends its first turn and replaces it.
	te.put(end(4), turnChain{tokens: 45000, sum: 4}, &turnEnd{target: key, block: 2})
	if _, ok := te.lookup(end(2)); ok {
		t.Error("the extended turn end was kept beside the turn that extends it")
	}
	if got := te.counter(key).Load(); got != 75000 {
		t.Errorf("total %d, want 75000 (conversations 2 and 3)", got)
	}
	te.answered(end(4), 99, 500) // another prompt's late usage
	if c, _ := te.lookup(end(4)); c.tokens != 45000 {
		t.Errorf("another prompt's answer changed the chain to %d", c.tokens)
	}
	te.answered(end(4), 4, 500)
	if c, _ := te.lookup(end(4)); c.tokens != 45500 || te.counter(key).Load() != 75500 {
		t.Errorf("answered chain = %d (total %d), want 45500 (75500)", c.tokens, te.counter(key).Load())
	}
	te.setCapacity(key, 50000) // a smaller cache: only the newest fits
	if _, ok := te.lookup(end(3)); ok {
		t.Error("a lower capacity kept the older chain")
	}
	if _, ok := te.lookup(end(4)); !ok {
		t.Error("a lower capacity dropped the newest chain")
	}
	other := TargetKey{URL: "http://e", Rank: 1}
	for i := range maxTurnEndsPerTarget + 10 {
		te.put(turnEnd{target: other, block: uint64(i)}, turnChain{tokens: 1}, nil)
	}
	if got := te.counter(other).Load(); got != maxTurnEndsPerTarget {
		t.Errorf("%d turn ends kept, want %d", got, maxTurnEndsPerTarget)
	}
	te.forget(key)
	if _, ok := te.lookup(end(4)); ok || te.counter(key).Load() != 0 {
		t.Error("forget kept a turn end")
	}
	if n := te.n.Load(); n != int64(len(te.ends)) || n != maxTurnEndsPerTarget {
		t.Errorf("count %d, %d turn ends held, want %d", n, len(te.ends), maxTurnEndsPerTarget)
	}
}

// TestTurnEndsBeyondTheHashedBlocks checks prompts longer than the hashed
// blocks (64 KiB): a prefill target that served an earlier turn is believed
// to hold all of that turn's prompt when the new prompt starts with it,
// and only the hashed blocks when it does not (another conversation that
// shares the first 64 KiB).
func TestTurnEndsBeyondTheHashedBlocks(t *testing.T) {
	prefill := newFakeEngine(t, serverInfo200(info(1, "prefill", 8998)))
	decode := newFakeEngine(t, serverInfo200(info(1, "decode", -1)))
	spy := &prefillSpy{}
	s := newTestScheduler(t, Config{
		Prefill:               []EndpointSpec{{URL: prefill.url()}},
		Decode:                []EndpointSpec{{URL: decode.url()}},
		PrefillPolicyInstance: spy,
	}, nil)
	mustDiscover(t, s)
	shared := strings.Repeat("abcd", 20000)                   // 80 KB: more than the hashed 64 KiB
	turn1 := shared + strings.Repeat("efgh", 5000)            // 25,000 tokens at 4 bytes a token
	turn2 := turn1 + strings.Repeat("ijkl", 1000)             // turn 1, then more
	other := shared + strings.Repeat("mnop", 5000) + "qrstuv" // the same first 80 KB, then not turn 1
	for i, p := range []string{turn1, turn2, other} {
		if _, err := s.Pick(t.Context(), &Request{ID: fmt.Sprint(i), Prompt: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}
	hashed := int64(prefixMaxBlocks * 16) // 1024 blocks of 64 bytes, 16 tokens each
	if got := spy.cands[1][0].CachedTokens; got != 25000 {
		t.Errorf("turn 2 after turn 1: %d tokens cached, want 25000 (all of turn 1)", got)
	}
	if got := spy.cands[2][0].CachedTokens; got != hashed {
		t.Errorf("another prompt sharing the hashed blocks: %d tokens cached, want the hashed %d", got, hashed)
	}
}

// prefillSpy is a prefill policy that reads prefixes and records the
// candidates of each pick.
type prefillSpy struct{ cands [][]Candidate }

func (*prefillSpy) Name() string      { return "prefill-spy" }
func (*prefillSpy) ReadsPrefix() bool { return true }
func (p *prefillSpy) Pick(_ context.Context, _ *Request, cands []Candidate) (int, error) {
	p.cands = append(p.cands, append([]Candidate(nil), cands...))
	return 0, nil
}
