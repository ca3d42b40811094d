package prefix

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func randomText(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return b
}

func BenchmarkHasherText(b *testing.B) {
	for _, size := range []int{1 << 10, 32 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			prompt := randomText(1, size)
			var dst []uint64
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				dst = Hasher{}.Text(prompt, dst)
			}
		})
	}
}

func BenchmarkHasherTokens(b *testing.B) {
	ids := make([]int64, 8192) // about 32 KiB of text
	for i := range ids {
		ids[i] = int64(i * 31)
	}
	var dst []uint64
	b.SetBytes(int64(8 * len(ids)))
	b.ReportAllocs()
	for b.Loop() {
		dst = Hasher{}.Tokens(ids, dst)
	}
}

// BenchmarkMatch matches a 32 KiB prompt (512 blocks) against an index in
// which every target holds the prompt's 4 KiB system prompt followed by a
// 4 KiB conversation of its own, and the first eight targets hold the
// prompt itself up to 4, 8, ..., 32 KiB: nine distinct match lengths, and
// every target matches. "staggered" is the adversarial case: the targets
// hold 512 distinct leading runs of the prompt, one length per 16 targets.
func BenchmarkMatch(b *testing.B) {
	const kib = 1 << 10
	query := randomText(2, 32*kib)
	blocks := Hasher{}.Text(query, nil)

	overlapping := func(targets int) *Index[int] {
		x := NewIndex[int](0)
		for t := range targets {
			own := append(append([]byte{}, query[:4*kib]...), randomText(uint64(100+t), 4*kib)...)
			x.Insert(t, Hasher{}.Text(own, nil))
			if t < 8 {
				x.Insert(t, blocks[:(t+1)*64])
			}
		}
		return x
	}
	staggered := func(targets int) *Index[int] {
		x := NewIndex[int](0)
		for t := range targets {
			x.Insert(t, blocks[:1+t*(len(blocks)-1)/(targets-1)])
		}
		return x
	}
	cases := []struct {
		name    string
		build   func(int) *Index[int]
		targets int
		want    int
	}{
		{"targets=64", overlapping, 64, 64},
		{"targets=8192", overlapping, 8192, 8192},
		{"targets=8192/staggered", staggered, 8192, 8192},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			x := c.build(c.targets)
			n := 0
			count := func(int, int) { n++ }
			b.ReportAllocs()
			for b.Loop() {
				n = 0
				x.Match(blocks, count)
			}
			if n != c.want {
				b.Fatalf("Match reported %d targets, want %d", n, c.want)
			}
		})
	}
}

// BenchmarkInsert inserts 32 KiB prompts (512 blocks) for 64 targets in
// turn. "hit" re-inserts prompts the target already holds (touch only);
// "miss" inserts a new prompt every time into targets already at their
// bound of 8192 blocks, so each op adds and evicts 512 blocks.
func BenchmarkInsert(b *testing.B) {
	const targets, prompts = 64, 256
	chains := make([][]uint64, prompts)
	for i := range chains {
		chains[i] = Hasher{}.Text(randomText(uint64(1000+i), 32<<10), nil)
	}
	b.Run("hit", func(b *testing.B) {
		x := NewIndex[int](0)
		for t := range targets {
			x.Insert(t, chains[t%prompts])
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			x.Insert(i%targets, chains[i%targets%prompts])
			i++
		}
	})
	b.Run("fresh", func(b *testing.B) {
		// Every prompt is new, as with independent user prompts: the
		// index's maps see a steady churn of inserts and deletes of keys
		// never seen before.
		benchFreshInserts(b, NewIndex[int](8192), targets, 512, 4*targets*16)
	})
	b.Run("fresh-longest", func(b *testing.B) {
		// A prompt at the hasher's cap (DefaultMaxBlocks blocks) never
		// seen before, into one of 4 targets at the default bound: what
		// one pick of a huge body costs the index at steady state.
		benchFreshInserts(b, NewIndex[int](0), 4, DefaultMaxBlocks, 4*2*DefaultMaxBlocksPerTarget/DefaultMaxBlocks)
	})
	b.Run("miss", func(b *testing.B) {
		x := NewIndex[int](8192)
		i := 0
		for ; i < targets*prompts; i++ { // warm up: every target at its bound
			x.Insert(i%targets, chains[(i/targets+i)%prompts])
		}
		b.ReportAllocs()
		for b.Loop() {
			x.Insert(i%targets, chains[(i/targets+i)%prompts])
			i++
		}
	})
}

// benchFreshInserts measures inserting prompts of blocks hashes never seen
// before into x, one target of targets in turn, after warm inserts (enough
// to fill every target past its bound).
func benchFreshInserts(b *testing.B, x *Index[int], targets, blocks, warm int) {
	chain := make([]uint64, blocks)
	next := uint64(1)
	insert := func(i int) {
		for j := range chain {
			chain[j] = next * 0x9e3779b97f4a7c15
			next++
		}
		x.Insert(i%targets, chain)
	}
	i := 0
	for ; i < warm; i++ {
		insert(i)
	}
	b.ReportAllocs()
	for b.Loop() {
		insert(i)
		i++
	}
}
