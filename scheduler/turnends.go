package scheduler

import (
	"container/list"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// An engine's cache keeps, on the rank that served a turn, the turn's
// prompt: a prefill engine's radix cache, and a decode engine's with a
// decode radix cache, which keeps the answer it generated too. The next
// turn's prompt starts with both. duet's prefix index holds the prompts it
// routed as hashed blocks, but only a prompt's first prefix.DefaultMaxBlocks
// blocks (64 KiB of text), and the answer never passes through duet
// (responses are not read: that would cost every request). turnEnds fills
// both gaps. It remembers where each turn routed to a target ended (the
// last hashed block of its prompt, with the prompt's length and a checksum
// of all of it) and how many tokens the target's cache holds along that
// chain: the prompt's estimated tokens at the pick and, on a decode target
// once the request's usage is reported (Feedback.CompletionTokens), its
// answer too. A later prompt that matches a target up to such a block, and
// whose start has the same checksum over the earlier prompt's length, is
// believed cached there up to that many tokens. Token ids and the engines'
// KV events make this precise; until then it is duet's estimate, like the
// rest of the index.

// maxTurnEndsPerTarget bounds the turn ends one target keeps; its least
// recently routed are forgotten first.
const maxTurnEndsPerTarget = 4096

// turnEnd is where one turn's prompt ended on one target: its last hashed
// block.
type turnEnd struct {
	target TargetKey
	block  uint64
}

// turnChain is what a target's cache holds along the chain ending at a
// turn end: tokens, and the prompt it was routed with, as its length
// (bytes of text, or token ids) and the checksum of its units beyond its
// hashed blocks (promptSum; the blocks are in the turn end's key).
type turnChain struct {
	tokens int64
	units  int
	sum    uint64
}

// turnEnds maps turn ends to what is cached along their chain, and keeps
// each target's chains within what its cache can hold: the chains of one
// target are in routing order, and when their tokens exceed the target's
// capacity (setCapacity) the least recently routed are forgotten, as the
// engine's LRU evicts them. A turn that extends an earlier one replaces it
// (the earlier prompt is part of the new chain). Safe for concurrent use.
type turnEnds struct {
	mu      sync.Mutex
	ends    map[turnEnd]*list.Element // of *endEntry
	targets map[TargetKey]*targetEnds
	// n is len(ends), read without mu: lookups in an empty set (no pool
	// role keeps turn ends) take no lock.
	n atomic.Int64
}

// endEntry is one turn end with its chain.
type endEntry struct {
	end   turnEnd
	chain turnChain
}

// targetEnds are one target's chains, most recently routed first, with
// their tokens in all and the target's capacity (0: unknown).
type targetEnds struct {
	lru list.List
	// total is read without t.mu by the target's ledger entry (counter).
	total    atomic.Int64
	capacity int64
}

// newTurnEnds returns an empty set.
func newTurnEnds() *turnEnds {
	return &turnEnds{ends: map[turnEnd]*list.Element{}, targets: map[TargetKey]*targetEnds{}}
}

// put records that a turn ending at e was routed to e.target; it replaces
// the earlier turn end replaces (nil: none) that the prompt extended on the
// same target.
func (t *turnEnds) put(e turnEnd, c turnChain, replaces *turnEnd) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if replaces != nil && *replaces != e && replaces.target == e.target {
		t.removeLocked(*replaces)
	}
	te := t.targets[e.target]
	if te == nil {
		te = &targetEnds{}
		t.targets[e.target] = te
	}
	if el, ok := t.ends[e]; ok {
		entry := el.Value.(*endEntry)
		te.total.Add(c.tokens - entry.chain.tokens)
		entry.chain = c
		te.lru.MoveToFront(el)
	} else {
		t.ends[e] = te.lru.PushFront(&endEntry{end: e, chain: c})
		t.n.Add(1)
		te.total.Add(c.tokens)
	}
	t.boundLocked(te)
}

// answered adds a turn's answer to its chain: the target's cache now holds
// the prompt and the answer. A chain forgotten, or replaced by another
// turn meanwhile, is left alone.
func (t *turnEnds) answered(e turnEnd, sum uint64, answer int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.ends[e]
	if !ok {
		return
	}
	entry := el.Value.(*endEntry)
	if entry.chain.sum != sum {
		return
	}
	entry.chain.tokens += answer
	te := t.targets[e.target]
	te.total.Add(answer)
	t.boundLocked(te)
}

// lookup returns the chain ending at e.
func (t *turnEnds) lookup(e turnEnd) (turnChain, bool) {
	if t.n.Load() == 0 {
		return turnChain{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.ends[e]
	if !ok {
		return turnChain{}, false
	}
	return el.Value.(*endEntry).chain, true
}

// setCapacity bounds target's chains to tokens (its cache's capacity).
func (t *turnEnds) setCapacity(target TargetKey, tokens int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if te := t.targets[target]; te != nil {
		te.capacity = tokens
		t.boundLocked(te)
		return
	}
	t.targets[target] = &targetEnds{capacity: tokens}
}

// forget drops every turn end of target (its endpoint left the pool).
func (t *turnEnds) forget(target TargetKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	te := t.targets[target]
	if te == nil {
		return
	}
	for el := te.lru.Front(); el != nil; el = el.Next() {
		delete(t.ends, el.Value.(*endEntry).end)
		t.n.Add(-1)
	}
	te.total.Store(0)
	delete(t.targets, target)
}

// counter returns target's total for its ledger entry to read without a
// lock; the entry takes it when the target enters a snapshot.
func (t *turnEnds) counter(target TargetKey) *atomic.Int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	te := t.targets[target]
	if te == nil {
		te = &targetEnds{}
		t.targets[target] = te
	}
	return &te.total
}

// boundLocked forgets te's least recently routed chains while they hold
// more than its capacity (keeping the newest), or are too many. Caller
// holds t.mu.
func (t *turnEnds) boundLocked(te *targetEnds) {
	for te.lru.Len() > maxTurnEndsPerTarget || te.capacity > 0 && te.total.Load() > te.capacity && te.lru.Len() > 1 {
		t.removeLocked(te.lru.Back().Value.(*endEntry).end)
	}
}

// removeLocked forgets turn end e. Caller holds t.mu.
func (t *turnEnds) removeLocked(e turnEnd) {
	el, ok := t.ends[e]
	if !ok {
		return
	}
	te := t.targets[e.target]
	te.total.Add(-el.Value.(*endEntry).chain.tokens)
	te.lru.Remove(el)
	delete(t.ends, e)
	t.n.Add(-1)
}

// promptUnits is the prompt's length in the units turnChain counts: token
// ids when the request has them, else bytes of its text.
func promptUnits(req *Request) int {
	if len(req.TokenIDs) > 0 {
		return len(req.TokenIDs)
	}
	return len(req.Prompt)
}

// promptSum is the checksum of the prompt's units [from, to) (see
// promptUnits). A turn end's key holds the chained hash of its prompt's
// hashed blocks, which covers the units before from = blocks × units per
// block; the checksum covers the rest, so that a prompt of 64 KiB or less
// costs the checksum of its last partial block only.
func promptSum(req *Request, from, to int) uint64 {
	if len(req.TokenIDs) == 0 {
		return xxhash.Sum64(req.Prompt[from:to])
	}
	var d xxhash.Digest
	var b [8]byte
	for _, id := range req.TokenIDs[from:to] {
		binary.LittleEndian.PutUint64(b[:], uint64(id))
		d.Write(b[:])
	}
	return d.Sum64()
}

// chainOf is the chain a pick of req starts on a target: the whole prompt,
// its tokens (over its items, which are one), and the checksum of what its
// blocks do not cover (unitsPerBlock units each).
func chainOf(req *Request, unitsPerBlock int) turnChain {
	n := promptUnits(req)
	from := min(len(req.Blocks)*unitsPerBlock, n)
	return turnChain{tokens: req.PromptTokens, units: n, sum: promptSum(req, from, n)}
}
