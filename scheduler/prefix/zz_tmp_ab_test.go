package prefix

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func streamText(prompt []byte, size int, dst []uint64) []uint64 {
	n := len(prompt) / size
	dst = dst[:0]
	var d xxhash.Digest
	var prev [8]byte
	sum := textSeed
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

func BenchmarkZZAB(b *testing.B) {
	prompt := randomText(1, 32<<10)
	dst := make([]uint64, 0, 4096)
	for range 3 {
		b.Run("stream", func(b *testing.B) {
			for b.Loop() {
				dst = streamText(prompt, 64, dst)
			}
		})
		b.Run("oneshot", func(b *testing.B) {
			for b.Loop() {
				dst = Hasher{}.Text(prompt, dst)
			}
		})
	}
}
