package prefix

import (
	"encoding/binary"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Defaults used by [Hasher] for fields left at zero (or set negative).
const (
	// DefaultBlockBytes is the text block size: 64 bytes, about 16 tokens.
	DefaultBlockBytes = 64
	// DefaultBlockTokens is the token block size, as SMG's --block-size.
	DefaultBlockTokens = 16
	// DefaultMaxBlocks caps the blocks hashed per prompt: 64 KiB of text
	// with the default block size, about 16k tokens. Beyond it a prompt's
	// prefix rarely tells targets apart, while every block costs the index
	// a map insert and, at its bound, an eviction on each pick: a new
	// prompt of 4096 blocks cost 3.6-4.3 ms per pick, one of 1024 blocks
	// 0.85-1.3 ms (BenchmarkInsert/fresh-longest, 6 runs each).
	DefaultMaxBlocks = 1024
)

// Chain seeds: the value that plays h[-1] for block 0. Text and token chains
// start from different seeds so that a text prompt and a token prompt with
// the same bytes never share hashes.
const (
	textSeed  uint64 = 0x7465787470726678 // "textprfx"
	tokenSeed uint64 = 0x746f6b6e70726678 // "toknprfx"
)

// smallBlock is the largest text block hashed from a stack copy in one
// call; larger blocks are streamed through a digest.
const smallBlock = 256

// tokenChunk is the largest token block hashed from a stack copy in one
// call, and the number of ids encoded at a time when larger blocks are
// streamed through a digest.
const tokenChunk = 32

// Hasher cuts a prompt into fixed-size blocks and returns chained hashes:
// h[i] = xxhash64(h[i-1] || block i), with h[i-1] as 8 little-endian bytes
// and a fixed per-kind seed standing in for h[-1]. A trailing partial block
// is ignored. Equal prefixes give equal leading hashes; a difference in
// block i changes h[i:]. The result is deterministic across runs and
// machines.
//
// The zero value is ready to use and takes the defaults. A Hasher is a plain
// value and is safe for concurrent use.
type Hasher struct {
	BlockBytes  int // text block size in bytes (default 64, about 16 tokens)
	BlockTokens int // token block size (default 16)
	MaxBlocks   int // cap on blocks per prompt (default 1024); later blocks ignored
}

// Text hashes the full BlockBytes-sized blocks of prompt, at most MaxBlocks
// of them. It appends the hashes to dst[:0] and returns the result, so a
// caller can reuse one slice across prompts.
func (h Hasher) Text(prompt []byte, dst []uint64) []uint64 {
	size := orDefault(h.BlockBytes, DefaultBlockBytes)
	n := min(len(prompt)/size, orDefault(h.MaxBlocks, DefaultMaxBlocks))
	dst = slices.Grow(dst[:0], n)

	sum := textSeed
	if size <= smallBlock {
		// One-shot hashing of a stack copy beats streaming for small blocks.
		var buf [8 + smallBlock]byte
		in := buf[:8+size]
		for i := range n {
			binary.LittleEndian.PutUint64(in, sum)
			copy(in[8:], prompt[i*size:(i+1)*size])
			sum = xxhash.Sum64(in)
			dst = append(dst, sum)
		}
		return dst
	}
	var d xxhash.Digest
	var prev [8]byte
	for i := range n {
		binary.LittleEndian.PutUint64(prev[:], sum)
		d.Reset()
		d.Write(prev[:])
		d.Write(prompt[i*size : (i+1)*size])
		sum = d.Sum64()
		dst = append(dst, sum)
	}
	return dst
}

// Tokens hashes the full BlockTokens-sized blocks of the token ids, at most
// MaxBlocks of them; each id is hashed as its 8 little-endian bytes. It
// appends the hashes to dst[:0] and returns the result.
func (h Hasher) Tokens(ids []int64, dst []uint64) []uint64 {
	size := orDefault(h.BlockTokens, DefaultBlockTokens)
	n := min(len(ids)/size, orDefault(h.MaxBlocks, DefaultMaxBlocks))
	dst = slices.Grow(dst[:0], n)

	var buf [8 + 8*tokenChunk]byte
	sum := tokenSeed
	if size <= tokenChunk {
		// One-shot hashing of a stack copy, as for small text blocks.
		in := buf[:8+8*size]
		for i := range n {
			binary.LittleEndian.PutUint64(in, sum)
			for j, id := range ids[i*size : (i+1)*size] {
				binary.LittleEndian.PutUint64(in[8+8*j:], uint64(id))
			}
			sum = xxhash.Sum64(in)
			dst = append(dst, sum)
		}
		return dst
	}
	for i := range n {
		sum = NextTokenBlock(sum, ids[i*size:(i+1)*size])
		dst = append(dst, sum)
	}
	return dst
}

// TokenChainSeed is h[-1] of a token chain: what a prompt's first token
// block is chained to.
const TokenChainSeed = tokenSeed

// NextTokenBlock returns the hash of a token block chained to the block
// whose hash is prev, exactly as [Hasher.Tokens] computes each block's:
// xxhash64(prev || the ids as 8 little-endian bytes each). It lets a
// chain be extended block by block, as engines report their pages.
func NextTokenBlock(prev uint64, block []int64) uint64 {
	var d xxhash.Digest
	var buf [8 * tokenChunk]byte
	binary.LittleEndian.PutUint64(buf[:8], prev)
	d.Reset()
	d.Write(buf[:8])
	for len(block) > 0 {
		k := min(len(block), tokenChunk)
		for j, id := range block[:k] {
			binary.LittleEndian.PutUint64(buf[8*j:], uint64(id))
		}
		d.Write(buf[:8*k])
		block = block[k:]
	}
	return d.Sum64()
}

// orDefault returns v, or def when v is not positive.
func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}
