package tokenize

import (
	"container/list"
	"strings"
	"sync"
)

// DefaultPieceCacheBytes bounds the piece cache: 64 MiB of text and ids.
const DefaultPieceCacheBytes = 64 << 20

// pieceCache keeps the ids of long pieces of text (the text between two
// added tokens: in a chat, one message's content), least recently used
// first out, bounded in bytes (text plus 4 bytes per id).
type pieceCache struct {
	mu    sync.Mutex
	limit int64
	size  int64
	lru   *list.List // of *pieceEntry, most recent first
	byKey map[string]*list.Element
}

// pieceEntry is one cached piece.
type pieceEntry struct {
	text string
	ids  []int32
}

// newPieceCache returns a cache of at most limit bytes; 0 caches nothing.
func newPieceCache(limit int64) *pieceCache {
	return &pieceCache{limit: limit, lru: list.New(), byKey: map[string]*list.Element{}}
}

// cost is what an entry counts against the limit.
func (e *pieceEntry) cost() int64 { return int64(len(e.text) + 4*len(e.ids) + 64) }

// get returns the ids of text, if cached. The slice must not be changed.
func (c *pieceCache) get(text string) ([]int32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[text]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(el)
	return el.Value.(*pieceEntry).ids, true
}

// put caches a copy of ids for text, evicting the least recently used.
func (c *pieceCache) put(text string, ids []int32) {
	e := &pieceEntry{text: strings.Clone(text), ids: append([]int32(nil), ids...)}
	if e.cost() > c.limit {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[text]; ok {
		return
	}
	c.byKey[e.text] = c.lru.PushFront(e)
	c.size += e.cost()
	for c.size > c.limit {
		old := c.lru.Back()
		oe := old.Value.(*pieceEntry)
		c.lru.Remove(old)
		delete(c.byKey, oe.text)
		c.size -= oe.cost()
	}
}
