package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// A decode that preallocated a request's KV sends its prefill the transfer
// metadata (SGLang: the destination KV indices and, with the decode radix
// cache, decode_prefix_len, how much of the prompt the decode holds
// already). The prefill's request then leaves its bootstrap queue for the
// waiting queue, and sends only the KV beyond the prefix. duet-sim carries
// the message over the prefill's bootstrap server: POST /sim/kv_prefix
// {"room": R, "decode_prefix_len": N}, which the prefill applies to the
// item of that room, or keeps for a while if the item has not arrived yet.

// Pending decode prefixes (those received before their prefill item) are
// bounded in number and age.
const (
	maxPendingPrefixes = 4096
	pendingPrefixTTL   = time.Minute
	// prefixPostTimeout bounds a decode's POST /sim/kv_prefix (wall time).
	prefixPostTimeout = time.Second
)

// kvPrefixMsg is the body of POST /sim/kv_prefix.
type kvPrefixMsg struct {
	Room            *int64 `json:"room"`
	DecodePrefixLen *int   `json:"decode_prefix_len"`
}

// Outcomes of a POST /sim/kv_prefix (its answer's status field).
const (
	prefixApplied = "applied" // the room's item got it
	prefixPending = "pending" // kept until the room's item arrives
	prefixIgnored = "ignored" // no bootstrap queue (the simple model without AwaitTransfer)
)

// prefixTarget is a live prefill item that accepts its decode prefix.
type prefixTarget struct {
	apply func(tokens int)
}

// pendingPrefix is a decode prefix received before its item.
type pendingPrefix struct {
	tokens int
	at     time.Time
}

// prefixBoard routes decode prefixes to the prefill items of their rooms.
type prefixBoard struct {
	mu      sync.Mutex
	live    map[int64]*prefixTarget
	pending map[int64]pendingPrefix
	now     func() time.Time
}

// newPrefixBoard returns an empty board.
func newPrefixBoard() *prefixBoard {
	return &prefixBoard{live: make(map[int64]*prefixTarget), pending: make(map[int64]pendingPrefix), now: time.Now}
}

// register makes apply receive room's decode prefix: at once if it came
// already, else when it comes. The returned function unregisters it.
func (b *prefixBoard) register(room int64, apply func(tokens int)) (unregister func()) {
	t := &prefixTarget{apply: apply}
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.pending[room]; ok {
		delete(b.pending, room)
		apply(p.tokens)
	}
	b.live[room] = t
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.live[room] == t {
			delete(b.live, room)
		}
	}
}

// deliver hands room's decode prefix to its item, or keeps it for an item
// still to come; it returns prefixApplied or prefixPending.
func (b *prefixBoard) deliver(room int64, tokens int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.live[room]; ok {
		t.apply(tokens)
		return prefixApplied
	}
	now := b.now()
	b.pending[room] = pendingPrefix{tokens: tokens, at: now}
	if len(b.pending) > maxPendingPrefixes {
		b.prune(now)
	}
	return prefixPending
}

// prune drops the pending prefixes older than the TTL, then the oldest
// ones while there are too many.
func (b *prefixBoard) prune(now time.Time) {
	for room, p := range b.pending {
		if now.Sub(p.at) > pendingPrefixTTL {
			delete(b.pending, room)
		}
	}
	for len(b.pending) > maxPendingPrefixes {
		var oldest int64
		var at time.Time
		first := true
		for room, p := range b.pending {
			if first || p.at.Before(at) {
				oldest, at, first = room, p.at, false
			}
		}
		delete(b.pending, oldest)
	}
}

// pendingCount is the number of prefixes waiting for their item.
func (b *prefixBoard) pendingCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// handleKVPrefix serves POST /sim/kv_prefix on a prefill's bootstrap
// server.
func (s *Server) handleKVPrefix(w http.ResponseWriter, r *http.Request) {
	var msg kvPrefixMsg
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&msg); err != nil {
		writeDetail(w, http.StatusBadRequest, "invalid body: "+err.Error())
		return
	}
	if msg.Room == nil || msg.DecodePrefixLen == nil || *msg.DecodePrefixLen < 0 {
		writeDetail(w, http.StatusBadRequest, "room and a non-negative decode_prefix_len are required")
		return
	}
	status := prefixIgnored
	if s.hasBootstrapQueue() {
		status = s.prefixes.deliver(*msg.Room, *msg.DecodePrefixLen)
	}
	writeJSON(w, http.StatusOK, map[string]any{"room": *msg.Room, "decode_prefix_len": *msg.DecodePrefixLen, "status": status})
}

// hasBootstrapQueue reports whether this server's prefill items wait for
// their decode's transfer metadata: the engine model's, and the simple
// model's with AwaitTransfer.
func (s *Server) hasBootstrapQueue() bool {
	return s.cfg.Mode == ModePrefill && (s.eng != nil || s.cfg.AwaitTransfer)
}

// postPrefix tells the prefill whose bootstrap server is at addr that
// this decode preallocated room's KV and holds tokens of its prompt
// already.
func (c *kvClient) postPrefix(ctx context.Context, addr string, room int64, tokens int) error {
	body, err := json.Marshal(kvPrefixMsg{Room: &room, DecodePrefixLen: &tokens})
	if err != nil {
		return fmt.Errorf("encode kv prefix: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, prefixPostTimeout)
	defer cancel()
	u := "http://" + addr + "/sim/kv_prefix"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build request %s: %w", u, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", u, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: status %d", u, resp.StatusCode)
	}
	return nil
}
