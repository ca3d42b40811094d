package prefix

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// refChain is a straightforward reference for the chained hash:
// xxhash64(le64(prev) || block), starting from seed.
func refChain(seed uint64, blocks [][]byte) []uint64 {
	out := []uint64{}
	prev := seed
	for _, b := range blocks {
		buf := binary.LittleEndian.AppendUint64(nil, prev)
		prev = xxhash.Sum64(append(buf, b...))
		out = append(out, prev)
	}
	return out
}

// commonPrefix returns how many leading elements a and b share.
func commonPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestHasherTextPrefixes(t *testing.T) {
	base := []byte(strings.Repeat("0123456789abcdef", 64)) // 1 KiB, 16 blocks of 64
	with := func(at int, c byte) []byte {
		p := bytes.Clone(base)
		p[at] = c
		return p
	}
	tests := []struct {
		name       string
		h          Hasher
		a, b       []byte
		lenA, lenB int
		shared     int
	}{
		{"equal", Hasher{}, base, bytes.Clone(base), 16, 16, 16},
		{"differ in first byte", Hasher{}, base, with(0, 'x'), 16, 16, 0},
		{"differ at end of block 0", Hasher{}, base, with(63, 'x'), 16, 16, 0},
		{"differ at start of block 5", Hasher{}, base, with(5*64, 'x'), 16, 16, 5},
		{"differ in last block", Hasher{}, base, with(1023, 'x'), 16, 16, 15},
		{"one is a prefix", Hasher{}, base, base[:640], 16, 10, 10},
		{"partial block ignored", Hasher{}, base[:640], append(bytes.Clone(base[:640]), "tail"...), 10, 10, 10},
		{"difference in partial block ignored", Hasher{}, base[:650], with(645, 'x')[:650], 10, 10, 10},
		{"shorter than a block", Hasher{}, base[:63], base[:10], 0, 0, 0},
		{"empty", Hasher{}, nil, []byte{}, 0, 0, 0},
		{"MaxBlocks cap", Hasher{MaxBlocks: 4}, base, with(5*64, 'x'), 4, 4, 4},
		{"custom block size", Hasher{BlockBytes: 100}, base, with(250, 'x'), 10, 10, 2},
		{"negative fields take defaults", Hasher{BlockBytes: -1, MaxBlocks: -1}, base, with(64, 'x'), 16, 16, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.h.Text(tt.a, nil)
			b := tt.h.Text(tt.b, nil)
			if len(a) != tt.lenA || len(b) != tt.lenB {
				t.Fatalf("lengths = %d, %d; want %d, %d", len(a), len(b), tt.lenA, tt.lenB)
			}
			if got := commonPrefix(a, b); got != tt.shared {
				t.Errorf("shared leading hashes = %d, want %d", got, tt.shared)
			}
			// After the first difference every hash differs.
			for i := tt.shared; i < min(len(a), len(b)); i++ {
				if a[i] == b[i] {
					t.Errorf("hash %d equal after divergence at %d", i, tt.shared)
				}
			}
		})
	}
}

func TestHasherMatchesReference(t *testing.T) {
	text := []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40))
	ids := make([]int64, 300)
	for i := range ids {
		ids[i] = int64(i*7919) - 1000 // includes negative ids
	}
	textBlocks := func(size int) [][]byte {
		var out [][]byte
		for i := 0; i+size <= len(text); i += size {
			out = append(out, text[i:i+size])
		}
		return out
	}
	tokenBlocks := func(size int) [][]byte {
		var out [][]byte
		for i := 0; i+size <= len(ids); i += size {
			var b []byte
			for _, id := range ids[i : i+size] {
				b = binary.LittleEndian.AppendUint64(b, uint64(id))
			}
			out = append(out, b)
		}
		return out
	}
	tests := []struct {
		name string
		got  []uint64
		want []uint64
	}{
		{"text default", Hasher{}.Text(text, nil), refChain(textSeed, textBlocks(64))},
		{"text 7 bytes", Hasher{BlockBytes: 7}.Text(text, nil), refChain(textSeed, textBlocks(7))},
		{"text 256 bytes (largest one-shot)", Hasher{BlockBytes: 256}.Text(text, nil), refChain(textSeed, textBlocks(256))},
		{"text 300 bytes (streamed)", Hasher{BlockBytes: 300}.Text(text, nil), refChain(textSeed, textBlocks(300))},
		{"tokens default", Hasher{}.Tokens(ids, nil), refChain(tokenSeed, tokenBlocks(16))},
		{"tokens 1", Hasher{BlockTokens: 1}.Tokens(ids, nil), refChain(tokenSeed, tokenBlocks(1))},
		{"tokens 32 (largest one-shot)", Hasher{BlockTokens: 32}.Tokens(ids, nil), refChain(tokenSeed, tokenBlocks(32))},
		{"tokens 100 (streamed in chunks)", Hasher{BlockTokens: 100}.Tokens(ids, nil), refChain(tokenSeed, tokenBlocks(100))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.got) != len(tt.want) || commonPrefix(tt.got, tt.want) != len(tt.want) {
				t.Errorf("got %x\nwant %x", tt.got, tt.want)
			}
		})
	}
}

// TestHasherStable pins hash values so that a change in the hashing scheme
// (seeds, encoding) is noticed: an index shared across processes or kept
// across restarts depends on them.
func TestHasherStable(t *testing.T) {
	tests := []struct {
		name string
		got  uint64
		want uint64
	}{
		{"text", Hasher{BlockBytes: 4}.Text([]byte("abcdefgh"), nil)[1], 0xa1db5e1109f05bd3},
		{"tokens", Hasher{BlockTokens: 2}.Tokens([]int64{1, 2, 3, 4}, nil)[1], 0x7d2af7d8c4f3f19e},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("hash = %#x, want %#x", tt.got, tt.want)
			}
		})
	}
}

func TestHasherTokens(t *testing.T) {
	seq := func(n int, from int64) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = from + int64(i)
		}
		return out
	}
	changed := func(ids []int64, at int) []int64 {
		out := append([]int64(nil), ids...)
		out[at] = -out[at] - 1
		return out
	}
	base := seq(100, 1)
	tests := []struct {
		name       string
		h          Hasher
		a, b       []int64
		lenA, lenB int
		shared     int
	}{
		{"equal", Hasher{}, base, seq(100, 1), 6, 6, 6},
		{"differ in block 3", Hasher{}, base, changed(base, 3*16+15), 6, 6, 3},
		{"partial block ignored", Hasher{}, base[:96], base, 6, 6, 6},
		{"shorter than a block", Hasher{}, base[:15], nil, 0, 0, 0},
		{"MaxBlocks cap", Hasher{MaxBlocks: 2}, base, changed(base, 40), 2, 2, 2},
		{"block of 10", Hasher{BlockTokens: 10}, base, changed(base, 55), 10, 10, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.h.Tokens(tt.a, nil)
			b := tt.h.Tokens(tt.b, nil)
			if len(a) != tt.lenA || len(b) != tt.lenB {
				t.Fatalf("lengths = %d, %d; want %d, %d", len(a), len(b), tt.lenA, tt.lenB)
			}
			if got := commonPrefix(a, b); got != tt.shared {
				t.Errorf("shared leading hashes = %d, want %d", got, tt.shared)
			}
		})
	}
}

func TestHasherTextVersusTokens(t *testing.T) {
	// 16 ids whose little-endian bytes are exactly a 128-byte text block:
	// the two kinds of chain must still not collide.
	text := []byte(strings.Repeat("abcdefgh", 16))
	ids := make([]int64, 16)
	for i := range ids {
		ids[i] = int64(binary.LittleEndian.Uint64(text[8*i:]))
	}
	th := Hasher{BlockBytes: 128}.Text(text, nil)
	kh := Hasher{BlockTokens: 16}.Tokens(ids, nil)
	if len(th) != 1 || len(kh) != 1 {
		t.Fatalf("lengths = %d, %d; want 1, 1", len(th), len(kh))
	}
	if th[0] == kh[0] {
		t.Errorf("text and token chains collide: %#x", th[0])
	}
}

func TestHasherReusesDst(t *testing.T) {
	dst := make([]uint64, 3, 64)
	dst[0] = 42
	out := Hasher{}.Text(bytes.Repeat([]byte("x"), 64*5), dst)
	if len(out) != 5 || &out[0] != &dst[0] {
		t.Errorf("Text did not append to dst[:0]: len %d", len(out))
	}
	out = Hasher{}.Tokens(make([]int64, 16*2), out)
	if len(out) != 2 || &out[0] != &dst[0] {
		t.Errorf("Tokens did not append to dst[:0]: len %d", len(out))
	}
	prompt := bytes.Repeat([]byte("y"), 64*60)
	ids := make([]int64, 16*60)
	allocs := testing.AllocsPerRun(100, func() {
		out = Hasher{}.Text(prompt, out)
		out = Hasher{}.Tokens(ids, out)
	})
	if allocs != 0 {
		t.Errorf("hashing allocates %v times with a large enough dst", allocs)
	}
}

// TestNextTokenBlockChainsAsTokens: extending a chain block by block
// gives Hasher.Tokens' hashes, for small and streamed block sizes.
func TestNextTokenBlockChainsAsTokens(t *testing.T) {
	ids := make([]int64, 1000)
	for i := range ids {
		ids[i] = int64(i*7919%151000) - 3
	}
	for _, size := range []int{1, 16, 32, 33, 64, 100} {
		want := Hasher{BlockTokens: size}.Tokens(ids, nil)
		sum := TokenChainSeed
		for i := range want {
			sum = NextTokenBlock(sum, ids[i*size:(i+1)*size])
			if sum != want[i] {
				t.Fatalf("block size %d: block %d: %x, want %x", size, i, sum, want[i])
			}
		}
	}
}
