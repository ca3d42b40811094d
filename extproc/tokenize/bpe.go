package tokenize

import (
	"fmt"
	"hash/maphash"
	"math"
	"sync"
)

// bpe is a byte-level BPE model over raw bytes: the vocabulary's entries
// are decoded from their byte-level characters at load, so that pieces of
// text need no re-encoding.
type bpe struct {
	// byteID is the id of each single byte (or of its <0xXX> fallback
	// token).
	byteID [256]int32
	// merges maps a pair of ids to the rank of their merge and the id of
	// the merged token.
	merges map[uint64]merge
	// vocab maps a token's bytes to its id, for ignore_merges.
	vocab        map[string]int32
	ignoreMerges bool
}

// merge is one merge rule: its priority (lower first) and its result.
type merge struct {
	rank, id int32
}

// pairKey packs two ids into a map key.
func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// newBPE builds the model from the file's model section.
func newBPE(m *modelSpec) (*bpe, error) {
	switch {
	case m.Type != "BPE" && m.Type != "":
		return nil, fmt.Errorf("type %q (only BPE): %w", m.Type, errUnsupported)
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("dropout %v: %w", *m.Dropout, errUnsupported)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, fmt.Errorf("continuing_subword_prefix %q: %w", *m.ContinuingSubwordPrefix, errUnsupported)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("end_of_word_suffix %q: %w", *m.EndOfWordSuffix, errUnsupported)
	case len(m.Vocab) == 0:
		return nil, fmt.Errorf("empty vocab")
	case len(m.Vocab) > math.MaxInt32:
		return nil, fmt.Errorf("vocab of %d entries", len(m.Vocab))
	}
	b := &bpe{
		merges:       make(map[uint64]merge, len(m.Merges)),
		vocab:        make(map[string]int32, len(m.Vocab)),
		ignoreMerges: m.IgnoreMerges,
	}
	for tok, id := range m.Vocab {
		if id < 0 || id > math.MaxInt32 {
			return nil, fmt.Errorf("vocab entry %q has id %d", tok, id)
		}
		raw, ok := byteLevelDecode(tok)
		if !ok {
			// Not byte-level text (a <0xXX> fallback token, say): it
			// can never be a piece's bytes, except as a fallback.
			continue
		}
		b.vocab[string(raw)] = int32(id)
	}
	for c := 0; c < 256; c++ {
		id, ok := b.vocab[string([]byte{byte(c)})]
		if !ok && m.ByteFallback {
			var fid int64
			fid, ok = m.Vocab[fmt.Sprintf("<0x%02X>", c)]
			id = int32(fid)
		}
		if !ok {
			return nil, fmt.Errorf("the vocab has no token for byte 0x%02x (%q) and no byte fallback for it", c, string(byteChars[c]))
		}
		b.byteID[c] = id
	}
	for rank, mg := range m.Merges {
		left, lok := byteLevelDecode(mg[0])
		right, rok := byteLevelDecode(mg[1])
		if !lok || !rok {
			return nil, fmt.Errorf("merge %d (%q %q) is not byte-level text", rank, mg[0], mg[1])
		}
		lid, lok := b.vocab[string(left)]
		rid, rok := b.vocab[string(right)]
		id, ok := b.vocab[string(left)+string(right)]
		if !lok || !rok || !ok {
			return nil, fmt.Errorf("merge %d (%q %q) names a token the vocab lacks", rank, mg[0], mg[1])
		}
		key := pairKey(lid, rid)
		if _, dup := b.merges[key]; !dup {
			b.merges[key] = merge{rank: int32(rank), id: id}
		}
	}
	return b, nil
}

// encodeWord appends the ids of one piece of text of two bytes or more
// (wordCache.encode answers single bytes).
func (b *bpe) encodeWord(dst []int32, word string) []int32 {
	if b.ignoreMerges {
		if id, ok := b.vocab[word]; ok {
			return append(dst, id)
		}
	}
	start := len(dst)
	for i := 0; i < len(word); i++ {
		dst = append(dst, b.byteID[word[i]])
	}
	return b.mergeAll(dst, start)
}

// noMerge is the rank of a pair that does not merge.
const noMerge = math.MaxInt32

// mergeAll applies merges to syms[start:] until none applies, lowest rank
// first and, among equal ranks, leftmost first, as Hugging Face's BPE
// does. It keeps the rank of every adjacent pair, so each merge costs two
// lookups.
func (b *bpe) mergeAll(syms []int32, start int) []int32 {
	s := syms[start:]
	if len(s) < 2 {
		return syms
	}
	var small [64]merge
	ranks := small[:0]
	if len(s)-1 > len(small) {
		ranks = make([]merge, 0, len(s)-1)
	}
	for i := 0; i+1 < len(s); i++ {
		ranks = append(ranks, b.pair(s[i], s[i+1]))
	}
	for len(s) > 1 {
		best, at := int32(noMerge), -1
		for i, r := range ranks {
			if r.rank < best {
				best, at = r.rank, i
			}
		}
		if at < 0 {
			break
		}
		s[at] = ranks[at].id
		s = append(s[:at+1], s[at+2:]...)
		ranks = append(ranks[:at], ranks[at+1:]...)
		if at > 0 {
			ranks[at-1] = b.pair(s[at-1], s[at])
		}
		if at < len(ranks) {
			ranks[at] = b.pair(s[at], s[at+1])
		}
	}
	return syms[:start+len(s)]
}

// pair is the merge of two ids, rank noMerge if there is none.
func (b *bpe) pair(a, c int32) merge {
	if m, ok := b.merges[pairKey(a, c)]; ok {
		return m
	}
	return merge{rank: noMerge}
}

// wordCacheShards splits the word cache so that concurrent requests rarely
// wait on each other.
const wordCacheShards = 32

// defaultWordCacheEntries bounds the word cache (about 10 MB).
const defaultWordCacheEntries = 1 << 17

// wordCache remembers the ids of recently seen multi-byte pieces. A shard
// that fills up is emptied.
type wordCache struct {
	seed   maphash.Seed
	max    int
	shards [wordCacheShards]struct {
		sync.RWMutex
		m map[string][]int32
	}
}

// newWordCache returns a cache of at most entries words.
func newWordCache(entries int) *wordCache {
	c := &wordCache{seed: maphash.MakeSeed(), max: max(entries/wordCacheShards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]int32)
	}
	return c
}

// encode appends word's ids, from the cache or from the model.
func (c *wordCache) encode(b *bpe, dst []int32, word string) []int32 {
	if len(word) == 1 {
		return append(dst, b.byteID[word[0]])
	}
	sh := &c.shards[maphash.String(c.seed, word)%wordCacheShards]
	sh.RLock()
	ids, ok := sh.m[word]
	sh.RUnlock()
	if ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = b.encodeWord(dst, word)
	ids = append([]int32(nil), dst[start:]...)
	sh.Lock()
	if len(sh.m) >= c.max {
		clear(sh.m)
	}
	sh.m[word] = ids
	sh.Unlock()
	return dst
}
