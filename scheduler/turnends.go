package scheduler

import "sync"

// A decode engine with a decode radix cache keeps, on the rank that served
// a turn, the turn's prompt and the answer it generated. The next turn's
// prompt starts with both. duet's prefix index holds the prompts it routed
// (their hashed blocks), so the next turn matches the earlier prompt there;
// the answer never passes through duet (responses are not read: that would
// cost every request), and only the prompt's first prefix.DefaultMaxBlocks
// blocks are hashed. turnEnds fills both gaps: it remembers where each turn
// routed to such a target ended (the last hashed block of its prompt) and
// how many tokens the target's cache holds along that chain, the prompt's
// estimated tokens at the pick and, once the request's usage is reported
// (Feedback.CompletionTokens), its answer too. A later prompt that matches
// a target up to such a block is believed cached there up to that many
// tokens. Token ids and the engines' KV events make this precise; until
// then it is duet's estimate, like the rest of the index.

// maxTurnEnds bounds the turns remembered; the oldest are forgotten first.
const maxTurnEnds = 1 << 16

// turnEnd is where one turn's prompt ended on one target: its last hashed
// block.
type turnEnd struct {
	target TargetKey
	block  uint64
}

// turnEnds maps turn ends to the tokens cached along their chain. Safe for
// concurrent use.
type turnEnds struct {
	mu     sync.Mutex
	tokens map[turnEnd]int64
	// ring holds the keys in insertion order; next is the slot the next
	// new key takes, forgetting the key there.
	ring []turnEnd
	next int
}

// newTurnEnds returns an empty set bounded by maxTurnEnds.
func newTurnEnds() *turnEnds {
	return &turnEnds{tokens: map[turnEnd]int64{}}
}

// put records that a turn ending at e was routed to e.target with tokens
// of prompt: the newest turn along a chain replaces what was known of it.
func (t *turnEnds) put(e turnEnd, tokens int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.tokens[e]; !ok {
		if len(t.ring) < maxTurnEnds {
			t.ring = append(t.ring, e)
		} else {
			delete(t.tokens, t.ring[t.next])
			t.ring[t.next] = e
			t.next = (t.next + 1) % maxTurnEnds
		}
	}
	t.tokens[e] = tokens
}

// answered adds a turn's answer to its chain: the target's cache now holds
// the prompt and the answer. A chain forgotten, or replaced by a longer
// turn meanwhile, is left alone.
func (t *turnEnds) answered(e turnEnd, prompt, answer int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.tokens[e]; ok {
		t.tokens[e] = max(cur, prompt+answer)
	}
}

// lookup returns the tokens cached along the chain ending at e.
func (t *turnEnds) lookup(e turnEnd) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.tokens[e]
	return n, ok
}

// forget drops every turn end of target (its endpoint left the pool).
func (t *turnEnds) forget(target TargetKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for e := range t.tokens {
		if e.target == target {
			delete(t.tokens, e)
		}
	}
}
