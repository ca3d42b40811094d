package prefix

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// modelIndex is a slow, obviously correct Index: one MRU-first slice of
// hashes per target, and Match by checking each target block by block.
type modelIndex struct {
	bound   int
	targets map[string][]uint64
}

func (m *modelIndex) insert(key string, blocks []uint64) {
	if len(blocks) > m.bound {
		blocks = blocks[:m.bound]
	}
	held := m.targets[key]
	for i := len(blocks) - 1; i >= 0; i-- {
		if j := slices.Index(held, blocks[i]); j >= 0 {
			held = slices.Delete(held, j, j+1)
		} else if len(held) >= m.bound {
			held = held[:len(held)-1]
		}
		held = slices.Insert(held, 0, blocks[i])
	}
	if len(blocks) > 0 {
		m.targets[key] = held
	}
}

func (m *modelIndex) match(blocks []uint64) map[string]int {
	out := map[string]int{}
	for key, held := range m.targets {
		n := 0
		for n < len(blocks) && slices.Contains(held, blocks[n]) {
			n++
		}
		if n > 0 {
			out[key] = n
		}
	}
	return out
}

// TestAgainstModel replays random workloads on the Index and on modelIndex
// and compares every Match and block count.
func TestAgainstModel(t *testing.T) {
	tests := []struct {
		name     string
		bound    int
		targets  int
		alphabet string
		maxLen   int
		ops      int
	}{
		{"tiny bound", 3, 4, "ab", 8, 3000},
		{"small bound", 8, 6, "abc", 14, 3000},
		{"large bound", 64, 5, "abcd", 20, 2000},
		{"many targets", 16, 40, "ab", 12, 3000},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			prompt := func() string {
				b := make([]byte, 1+rng.IntN(tt.maxLen))
				for j := range b {
					b[j] = tt.alphabet[rng.IntN(len(tt.alphabet))]
				}
				return string(b)
			}
			x := NewIndex[string](tt.bound)
			m := &modelIndex{bound: tt.bound, targets: map[string][]uint64{}}
			for op := range tt.ops {
				key := fmt.Sprint("t", rng.IntN(tt.targets))
				switch r := rng.IntN(100); {
				case r < 2:
					x.Remove(key)
					delete(m.targets, key)
				case r < 60:
					p := chain(prompt())
					x.Insert(key, p)
					m.insert(key, p)
				default:
					p := chain(prompt())
					if got, want := matches(t, x, p), m.match(p); !maps.Equal(got, want) {
						t.Fatalf("op %d: Match = %v, want %v", op, got, want)
					}
				}
				if x.Blocks(key) != len(m.targets[key]) {
					t.Fatalf("op %d: Blocks(%s) = %d, want %d", op, key, x.Blocks(key), len(m.targets[key]))
				}
			}
			checkInvariants(t, x)
			if x.Targets() != len(m.targets) {
				t.Errorf("Targets() = %d, want %d", x.Targets(), len(m.targets))
			}
		})
	}
}

func TestConcurrentUse(t *testing.T) {
	x := NewIndex[int](32)
	prompts := make([][]uint64, 16)
	for i := range prompts {
		prompts[i] = chain(fmt.Sprintf("system-prompt/%02d/%s", i%4, "conversation-turns"[:i+2]))
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for range 2000 {
				key := rng.IntN(20)
				p := prompts[rng.IntN(len(prompts))]
				switch r := rng.IntN(100); {
				case r < 3:
					x.Remove(key)
				case r < 40:
					x.Insert(key, p)
				case r < 45:
					_ = x.Blocks(key) + x.Targets()
				default:
					x.Match(p, func(k, matched int) {
						if matched < 1 || matched > len(p) {
							t.Errorf("target %d: matched %d out of range", k, matched)
						}
					})
				}
			}
		})
	}
	wg.Wait()
	checkInvariants(t, x)
}

// TestMisuseStaysSafe inserts slices that are not leading parts of a chain,
// which breaks the prefix closure Match relies on: results may then be
// approximate, but Match must not panic, must report each target once and
// must keep matched within 1..len(blocks).
func TestMisuseStaysSafe(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	x := NewIndex[string](6)
	for range 2000 {
		p := chain("abcdefghijklmnop"[:1+rng.IntN(16)])
		from := rng.IntN(len(p))
		key := fmt.Sprint("t", rng.IntN(8))
		if rng.IntN(2) == 0 {
			x.Insert(key, p[from:])
		} else {
			matches(t, x, p)
		}
	}
	checkInvariants(t, x)
}
