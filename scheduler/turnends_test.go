package scheduler

import (
	"context"
	"strings"
	"testing"
)

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

// TestTurnEndsBounded checks that the turn ends forget the oldest beyond
// their bound and that a late answer never shrinks a chain.
func TestTurnEndsBounded(t *testing.T) {
	te := newTurnEnds()
	key := TargetKey{URL: "http://d", Rank: 0}
	for i := range maxTurnEnds + 10 {
		te.put(turnEnd{target: key, block: uint64(i)}, int64(i))
	}
	if _, ok := te.lookup(turnEnd{target: key, block: 0}); ok {
		t.Error("the oldest turn end is still known past the bound")
	}
	if n, ok := te.lookup(turnEnd{target: key, block: maxTurnEnds + 9}); !ok || n != maxTurnEnds+9 {
		t.Errorf("newest = %d, %v", n, ok)
	}
	if len(te.tokens) != maxTurnEnds {
		t.Errorf("%d turn ends kept, want %d", len(te.tokens), maxTurnEnds)
	}
	e := turnEnd{target: key, block: 1 << 40}
	te.put(e, 5000)
	te.answered(e, 100, 50) // an older, shorter turn's late usage
	if n, _ := te.lookup(e); n != 5000 {
		t.Errorf("a late answer shrank the chain to %d", n)
	}
	te.answered(e, 5000, 300)
	if n, _ := te.lookup(e); n != 5300 {
		t.Errorf("answered chain = %d, want 5300", n)
	}
	te.forget(key)
	if _, ok := te.lookup(e); ok {
		t.Error("forget kept a turn end")
	}
}
