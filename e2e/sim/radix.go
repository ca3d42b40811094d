package sim

import "container/list"

// cacheBlock is one cached prefix block of a rank's KV pool (or of its
// host tier).
type cacheBlock struct {
	hash uint64
	// parent is the hash of the block before this one in its chain;
	// hasParent is false for a chain's first block.
	parent    uint64
	hasParent bool
	// ids are the block's token ids when the engine knows them (token-id
	// prompts), else nil (text the simulator only counts).
	ids []int64
	// refs counts the requests holding the block (it cannot be evicted
	// while refs > 0).
	refs int
	// lru is the block's element in prefixCache.free while refs == 0.
	lru *list.Element
}

// prefixCache is a rank's radix (prefix) cache at block granularity. A
// prompt is a chain of block hashes; a lookup matches the longest cached
// chain from the first block. Blocks held by requests are pinned; free
// blocks stay cached and are evicted least recently used first, the
// deepest block of a chain before its ancestors (a request always pins
// whole chains, and frees them leaf first), so a cached block's ancestors
// are always cached too, like SGLang's radix tree evicting leaves.
type prefixCache struct {
	blockTokens int
	blocks      map[uint64]*cacheBlock
	// free lists the unpinned blocks, least recently used at the front.
	free *list.List
}

// newPrefixCache returns an empty cache of blockTokens-token blocks.
func newPrefixCache(blockTokens int) *prefixCache {
	return &prefixCache{blockTokens: blockTokens, blocks: make(map[uint64]*cacheBlock), free: list.New()}
}

// tokens is the KV held by cached blocks, pinned or not.
func (c *prefixCache) tokens() int { return len(c.blocks) * c.blockTokens }

// evictable is the KV held by unpinned blocks.
func (c *prefixCache) evictable() int { return c.free.Len() * c.blockTokens }

// match returns the cached blocks of the longest cached prefix of hashes
// (at most limit blocks) without pinning them, and how many of them are
// currently free (pinning those takes KV from the evictable pool).
func (c *prefixCache) match(hashes []uint64, limit int) (matched []*cacheBlock, free int) {
	for i, h := range hashes {
		if i >= limit {
			break
		}
		b, ok := c.blocks[h]
		if !ok {
			break
		}
		matched = append(matched, b)
		if b.refs == 0 {
			free++
		}
	}
	return matched, free
}

// pin takes a reference on b.
func (c *prefixCache) pin(b *cacheBlock) {
	if b.refs == 0 && b.lru != nil {
		c.free.Remove(b.lru)
		b.lru = nil
	}
	b.refs++
}

// insert returns the block of key's hash, pinned: the cached one if
// present, else a new one with key's chain and token ids (the caller
// accounts its KV).
func (c *prefixCache) insert(key blockKey) (b *cacheBlock, created bool) {
	if b, ok := c.blocks[key.hash]; ok {
		c.pin(b)
		return b, false
	}
	b = &cacheBlock{hash: key.hash, parent: key.parent, hasParent: key.hasParent, ids: key.ids, refs: 1}
	c.blocks[key.hash] = b
	return b, true
}

// blockKey names a block to insert: its hash, its parent's and its token
// ids (nil when unknown).
type blockKey struct {
	hash      uint64
	parent    uint64
	hasParent bool
	ids       []int64
}

// chainKey is the key of block i of a chain of hashes whose token ids are
// ids (nil, or too short for block i: unknown), blocks of bt tokens.
func chainKey(hashes []uint64, ids []int64, i, bt int) blockKey {
	k := blockKey{hash: hashes[i]}
	if i > 0 {
		k.parent, k.hasParent = hashes[i-1], true
	}
	if end := (i + 1) * bt; bt > 0 && end <= len(ids) {
		k.ids = ids[i*bt : end : end]
	}
	return k
}

// release drops one reference on each block of a chain, leaf first, so
// that the deepest free block is evicted first.
func (c *prefixCache) release(chain []*cacheBlock) {
	for i := len(chain) - 1; i >= 0; i-- {
		b := chain[i]
		b.refs--
		if b.refs == 0 {
			b.lru = c.free.PushBack(b)
		}
	}
}

// evictLRU drops the least recently used free block and returns it; nil
// if no block is free.
func (c *prefixCache) evictLRU() *cacheBlock {
	e := c.free.Front()
	if e == nil {
		return nil
	}
	b := c.free.Remove(e).(*cacheBlock)
	b.lru = nil
	delete(c.blocks, b.hash)
	return b
}

// clear drops every block, pinned or not, and returns how many.
func (c *prefixCache) clear() int {
	n := len(c.blocks)
	clear(c.blocks)
	c.free.Init()
	return n
}

// hostCache is the host tier of a decode rank's radix cache (decode
// HiCache): the blocks evicted from the GPU tier, kept in host memory up
// to a capacity and evicted from there least recently used first. A
// block's KV lives in exactly one tier.
type hostCache struct {
	capBlocks int
	lru       *list.List // of *cacheBlock, least recently used at the front
	blocks    map[uint64]*list.Element
}

// newHostCache returns an empty host tier of capBlocks blocks.
func newHostCache(capBlocks int) *hostCache {
	return &hostCache{capBlocks: capBlocks, lru: list.New(), blocks: make(map[uint64]*list.Element)}
}

// add keeps b (a block evicted from the GPU tier) as the most recently
// used host block. The least recently used blocks beyond capacity are
// evicted first, to make room, and returned.
func (h *hostCache) add(b *cacheBlock) (evicted []*cacheBlock) {
	if e, ok := h.blocks[b.hash]; ok {
		h.lru.MoveToBack(e)
		return nil
	}
	for h.lru.Len() >= h.capBlocks && h.lru.Len() > 0 {
		old := h.lru.Remove(h.lru.Front()).(*cacheBlock)
		delete(h.blocks, old.hash)
		evicted = append(evicted, old)
	}
	h.blocks[b.hash] = h.lru.PushBack(&cacheBlock{hash: b.hash, parent: b.parent, hasParent: b.hasParent, ids: b.ids})
	return evicted
}

// remove drops hash (loaded back to, or cached again in, the GPU tier)
// and returns the block it held; nil if it held none.
func (h *hostCache) remove(hash uint64) *cacheBlock {
	e, ok := h.blocks[hash]
	if !ok {
		return nil
	}
	delete(h.blocks, hash)
	return h.lru.Remove(e).(*cacheBlock)
}

// match returns the longest prefix of hashes held by the host tier.
func (h *hostCache) match(hashes []uint64) []uint64 {
	n := 0
	for n < len(hashes) {
		if _, ok := h.blocks[hashes[n]]; !ok {
			break
		}
		n++
	}
	return hashes[:n]
}

// len is the number of blocks held.
func (h *hostCache) len() int { return h.lru.Len() }

// clear drops every block and returns how many.
func (h *hostCache) clear() int {
	n := h.lru.Len()
	clear(h.blocks)
	h.lru.Init()
	return n
}
