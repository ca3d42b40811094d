package sim

import (
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// FNV-1a 64-bit constants.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// blockHasher cuts a prompt into prefix-cache blocks and returns one
// chained hash per full block: block i's hash covers every block before
// it, so equal hashes mean equal prefixes. A block is blockSize tokens:
// 4·blockSize characters of text (the simulator counts ceil(chars/4)
// tokens) or blockSize token ids. Message boundaries and roles are mixed
// into the hash without counting as characters, so two chats with the
// same text but different roles do not share blocks.
type blockHasher struct {
	unitsPerBlock int
	units         int // units in the current block
	h             uint64
	blocks        []uint64
	// collect makes the hasher stand in token ids for text: every
	// unitTokenUnits units, the running hash of the block so far (see
	// ParsePromptTokens).
	collect bool
	tokens  []int64
}

// unitTokenUnits is how many text units (runes) one stand-in token id
// covers: the simulator counts ceil(chars/4) tokens.
const unitTokenUnits = 4

// unitTokenVocabulary bounds stand-in token ids, as a vocabulary does.
const unitTokenVocabulary = 1 << 20

// newBlockHasher returns a hasher for blocks of unitsPerBlock units.
func newBlockHasher(unitsPerBlock int) *blockHasher {
	return &blockHasher{unitsPerBlock: unitsPerBlock, h: fnvOffset}
}

// mix feeds one byte into the current block's hash.
func (b *blockHasher) mix(c byte) {
	b.h ^= uint64(c)
	b.h *= fnvPrime
}

// marker feeds a boundary marker that does not count as a unit.
func (b *blockHasher) marker(s string) {
	b.mix(0)
	for i := 0; i < len(s); i++ {
		b.mix(s[i])
	}
	b.mix(0)
}

// unit ends one unit; a full block is closed and chained into the next.
func (b *blockHasher) unit() {
	b.units++
	if b.collect && b.units%unitTokenUnits == 0 {
		b.tokens = append(b.tokens, int64(b.h%unitTokenVocabulary))
	}
	if b.units < b.unitsPerBlock {
		return
	}
	b.blocks = append(b.blocks, b.h)
	// The next block starts from this block's hash (the chain).
	prev := b.h
	b.h = fnvOffset
	for i := 0; i < 8; i++ {
		b.mix(byte(prev >> (8 * i)))
	}
	b.units = 0
}

// text feeds text, one unit per rune.
func (b *blockHasher) text(s string) {
	for _, r := range s {
		var buf [utf8.UTFMax]byte
		n := utf8.EncodeRune(buf[:], r)
		for i := 0; i < n; i++ {
			b.mix(buf[i])
		}
		b.unit()
	}
}

// ids feeds token ids, one unit per id.
func (b *blockHasher) ids(v []int64) {
	for _, id := range v {
		n := uint64(id)
		for i := 0; i < 8; i++ {
			b.mix(byte(n >> (8 * i)))
		}
		b.unit()
	}
}

// textBlocks returns the block hashes of a text prompt.
func textBlocks(s string, blockTokens int) []uint64 {
	blocks, _ := textBlocksTail(s, blockTokens)
	return blocks
}

// textBlocksTail returns the block hashes of a text prompt and the
// hasher's end state, which an answer continues as plain text.
func textBlocksTail(s string, blockTokens int) ([]uint64, HashTail) {
	if blockTokens <= 0 {
		return nil, HashTail{}
	}
	b := newBlockHasher(4 * blockTokens)
	b.text(s)
	return b.blocks, b.tail(tailText)
}

// idBlocks returns the block hashes and the token ids of a token-id
// prompt (both nil without blocks: the simple model keeps no cache).
func idBlocks(v []gjson.Result, blockTokens int) ([]uint64, []int64) {
	if blockTokens <= 0 {
		return nil, nil
	}
	ids := make([]int64, len(v))
	for i, id := range v {
		ids[i] = id.Int()
	}
	return tokenBlocks(ids, blockTokens), ids
}

// tokenBlocks returns the block hashes of token ids, blocks of
// blockTokens ids.
func tokenBlocks(ids []int64, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return nil
	}
	b := newBlockHasher(blockTokens)
	b.ids(ids)
	return b.blocks
}

// messageBlocksTail returns the block hashes of chat messages (chat) or of
// Responses input items, each element contributing its role as a marker and
// the same text textTokens counts for it, with the hasher's end state: a list
// of messages is continued by an assistant message (the answer), a single
// Responses input string by nothing (the next turn's input is a list,
// which hashes differently).
func messageBlocksTail(msgs gjson.Result, blockTokens int, chat bool) ([]uint64, HashTail) {
	blocks, tail, _ := messageBlocksTokens(msgs, blockTokens, chat, false)
	return blocks, tail
}

// messageBlocksTokens is messageBlocksTail, and with collect the stand-in
// token ids of every whole token (ParsePromptTokens).
func messageBlocksTokens(msgs gjson.Result, blockTokens int, chat, collect bool) ([]uint64, HashTail, []int64) {
	if blockTokens <= 0 {
		return nil, HashTail{}, nil
	}
	b := newBlockHasher(4 * blockTokens)
	b.collect = collect
	if !msgs.IsArray() {
		b.text(contentText(msgs))
		return b.blocks, HashTail{}, b.tokens
	}
	for _, m := range msgs.Array() {
		role := "user"
		if r := m.Get("role"); r.Type == gjson.String {
			role = strings.ToLower(r.String())
		}
		b.marker(role)
		if chat {
			b.text(contentText(m.Get("content")))
		} else {
			b.text(contentText(m))
		}
	}
	return b.blocks, b.tail(tailMessages), b.tokens
}

// tailKind says how an answer continues a prompt's block hashes.
type tailKind uint8

const (
	// tailNone: the answer's blocks are unknown (token-id prompts): only
	// the prompt's blocks are cached.
	tailNone tailKind = iota
	// tailText: the answer's text follows the prompt's text (completions
	// prompt string, /generate text).
	tailText
	// tailMessages: the answer is the next message, role "assistant"
	// (chat messages, Responses input lists): the next turn's prompt holds
	// the previous messages, the answer as an assistant message, then the
	// new ones.
	tailMessages
)

// HashTail is the end state of a prompt's prefix-block hasher (the hash of
// its unfinished last block and how many units it holds), so that the
// block hashes of prompt plus answer can be computed from the prompt's
// alone: they equal the blocks of the next turn's prompt when that prompt
// carries the answer back. The zero value computes no answer blocks.
type HashTail struct {
	kind          tailKind
	unitsPerBlock int
	units         int
	h             uint64
	// collect: the prompt's token ids are stand-ins, and so are the
	// answer's (answerTokens).
	collect bool
}

// tail returns the hasher's end state, continued as kind.
func (b *blockHasher) tail(kind tailKind) HashTail {
	return HashTail{kind: kind, unitsPerBlock: b.unitsPerBlock, units: b.units, h: b.h, collect: b.collect}
}

// answerTokens returns the full blocks that answer adds after the prompt
// whose hasher ended in t (none for the zero HashTail) and, for a prompt
// with stand-in token ids, the stand-in ids of the tokens the answer
// completes (the first one may have begun in the prompt), else nil.
func (t HashTail) answerTokens(answer string) ([]uint64, []int64) {
	if t.kind == tailNone || t.unitsPerBlock <= 0 {
		return nil, nil
	}
	b := &blockHasher{unitsPerBlock: t.unitsPerBlock, units: t.units, h: t.h, collect: t.collect}
	if t.kind == tailMessages {
		b.marker("assistant")
	}
	b.text(answer)
	return b.blocks, b.tokens
}
