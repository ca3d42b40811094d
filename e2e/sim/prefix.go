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
}

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
func (b *blockHasher) ids(v []gjson.Result) {
	for _, id := range v {
		n := uint64(id.Int())
		for i := 0; i < 8; i++ {
			b.mix(byte(n >> (8 * i)))
		}
		b.unit()
	}
}

// textBlocks returns the block hashes of a text prompt.
func textBlocks(s string, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return nil
	}
	b := newBlockHasher(4 * blockTokens)
	b.text(s)
	return b.blocks
}

// idBlocks returns the block hashes of a token-id prompt.
func idBlocks(ids []gjson.Result, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return nil
	}
	b := newBlockHasher(blockTokens)
	b.ids(ids)
	return b.blocks
}

// messageBlocks returns the block hashes of chat messages (chat) or of
// Responses input items: each element contributes its role as a marker and
// the same text textTokens counts for it.
func messageBlocks(msgs gjson.Result, blockTokens int, chat bool) []uint64 {
	if blockTokens <= 0 {
		return nil
	}
	b := newBlockHasher(4 * blockTokens)
	if !msgs.IsArray() {
		b.text(contentText(msgs))
		return b.blocks
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
	return b.blocks
}
