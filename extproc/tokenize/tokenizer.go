package tokenize

import (
	"fmt"
	"strings"
	"sync"
)

// Tokenizer turns text into token ids as the Hugging Face tokenizer of the
// same tokenizer.json does. It is safe for concurrent use.
type Tokenizer struct {
	normalizer normalizer
	pre        *preTokenizer
	bpe        *bpe
	// raw finds the added tokens matched in the text as it is; normalized
	// those matched after normalization.
	raw, normalized *addedVocab
	// addedIDs are the added tokens' ids and contents.
	addedIDs map[int32]string
	// prefix and suffix are the post-processor's tokens around a
	// sequence when special tokens are added.
	prefix, suffix []int64
	words          *wordCache
	pieces         *pieceCache
	scratch        sync.Pool // *encodeScratch
	// decode maps ids back to bytes, built on first use.
	decodeOnce sync.Once
	decode     map[int32]string
}

// encodeScratch is one encoding's reusable buffers.
type encodeScratch struct {
	ids      []int32
	ends     []int
	splitBuf []int
}

// Encode appends the ids of text to dst. With addSpecial, the
// post-processor's special tokens (a BOS, say) go around them, as
// Hugging Face's encode(text, add_special_tokens=True) does.
func (t *Tokenizer) Encode(dst []int64, text string, addSpecial bool) []int64 {
	if addSpecial {
		dst = append(dst, t.prefix...)
	}
	for seg := range t.raw.segments(text) {
		if seg.token {
			dst = append(dst, int64(seg.id))
		} else {
			dst = t.encodePiece(dst, seg.text)
		}
	}
	if addSpecial {
		dst = append(dst, t.suffix...)
	}
	return dst
}

// minCachedPiece is the shortest piece whose ids the piece cache keeps:
// shorter ones are cheap to redo.
const minCachedPiece = 256

// encodePiece appends the ids of text between two raw added tokens, from
// the piece cache when it was seen before.
func (t *Tokenizer) encodePiece(dst []int64, piece string) []int64 {
	if len(piece) >= minCachedPiece {
		if ids, ok := t.pieces.get(piece); ok {
			return appendIDs(dst, ids)
		}
	}
	sc, _ := t.scratch.Get().(*encodeScratch)
	if sc == nil {
		sc = &encodeScratch{}
	}
	ids := sc.ids[:0]
	for seg := range t.normalized.segments(t.normalizer.apply(piece)) {
		if seg.token {
			ids = append(ids, seg.id)
		} else {
			ids = t.encodeText(ids, seg.text, sc)
		}
	}
	dst = appendIDs(dst, ids)
	if len(piece) >= minCachedPiece {
		t.pieces.put(piece, ids)
	}
	sc.ids = ids
	t.scratch.Put(sc)
	return dst
}

// appendIDs appends ids to dst.
func appendIDs(dst []int64, ids []int32) []int64 {
	for _, id := range ids {
		dst = append(dst, int64(id))
	}
	return dst
}

// encodeText pre-tokenizes normalized text and runs BPE on each piece.
func (t *Tokenizer) encodeText(dst []int32, text string, sc *encodeScratch) []int32 {
	sc.ends, sc.splitBuf = t.pre.pieces(text, sc.ends[:0], sc.splitBuf)
	start := 0
	for _, end := range sc.ends {
		dst = t.words.encode(t.bpe, dst, text[start:end])
		start = end
	}
	return dst
}

// SetPieceCacheBytes bounds the piece cache (0 turns it off). Call it
// before the tokenizer is used.
func (t *Tokenizer) SetPieceCacheBytes(n int64) { t.pieces = newPieceCache(n) }

// Decode returns the text of ids: the bytes their tokens stand for (added
// tokens as their content). Ids outside the vocabulary are written as
// <id>. A slice that cuts a character in two decodes it as U+FFFD.
func (t *Tokenizer) Decode(ids []int64) string {
	t.decodeOnce.Do(func() {
		t.decode = make(map[int32]string, len(t.bpe.vocab)+len(t.addedIDs))
		for b, id := range t.bpe.vocab {
			t.decode[id] = b
		}
		for id, c := range t.addedIDs {
			t.decode[id] = c
		}
	})
	var b strings.Builder
	for _, id := range ids {
		if s, ok := t.decode[int32(id)]; ok && id == int64(int32(id)) {
			b.WriteString(s)
		} else {
			fmt.Fprintf(&b, "<%d>", id)
		}
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}
