package prefix

import (
	"maps"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	type insert struct{ key, prompt string }
	alphabet := "abcdefghijklmnopqrst"
	var staircase []insert
	wantStairs := map[string]int{}
	for i := range alphabet {
		key := "t" + alphabet[i:i+1]
		staircase = append(staircase, insert{key, alphabet[:i+1]})
		wantStairs[key] = i + 1
	}
	tests := []struct {
		name    string
		inserts []insert
		query   string
		want    map[string]int
	}{
		{
			name:    "overlapping prefixes",
			inserts: []insert{{"A", "abcdefghij"}, {"B", "abcde"}, {"C", "abcxyz"}, {"D", "zzzz"}},
			query:   "abcdefghijkl",
			want:    map[string]int{"A": 10, "B": 5, "C": 3},
		},
		{
			name:    "overlapping prefixes, other branch",
			inserts: []insert{{"A", "abcdefghij"}, {"B", "abcde"}, {"C", "abcxyz"}, {"D", "zzzz"}},
			query:   "abcxy",
			want:    map[string]int{"A": 3, "B": 3, "C": 5},
		},
		{
			name:    "query shorter than held prefix",
			inserts: []insert{{"A", "abcdefghij"}, {"B", "abc"}},
			query:   "ab",
			want:    map[string]int{"A": 2, "B": 2},
		},
		{
			name:    "no match",
			inserts: []insert{{"A", "abc"}},
			query:   "xbc",
			want:    map[string]int{},
		},
		{
			name:    "empty query",
			inserts: []insert{{"A", "abc"}},
			query:   "",
			want:    map[string]int{},
		},
		{
			name:  "empty index",
			query: "abc",
			want:  map[string]int{},
		},
		{
			name:    "one target, two branches",
			inserts: []insert{{"A", "abcd"}, {"A", "abxy"}},
			query:   "abcz",
			want:    map[string]int{"A": 3},
		},
		{
			name:    "reinsert longer",
			inserts: []insert{{"A", "ab"}, {"A", "abcdef"}},
			query:   "abcdefg",
			want:    map[string]int{"A": 6},
		},
		{
			name:    "same prefix everywhere",
			inserts: []insert{{"A", "abcd"}, {"B", "abcd"}, {"C", "abcd"}},
			query:   "abcd",
			want:    map[string]int{"A": 4, "B": 4, "C": 4},
		},
		{
			name:    "every length distinct",
			inserts: staircase,
			query:   alphabet + "xyz",
			want:    wantStairs,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewIndex[string](0)
			for _, in := range tt.inserts {
				x.Insert(in.key, chain(in.prompt))
			}
			checkInvariants(t, x)
			if got := matches(t, x, chain(tt.query)); !maps.Equal(got, tt.want) {
				t.Errorf("Match(%q) = %v, want %v", tt.query, got, tt.want)
			}
		})
	}
}

func TestMatchCallbackMayUseIndex(t *testing.T) {
	x := NewIndex[string](0)
	x.Insert("A", chain("abc"))
	x.Match(chain("abc"), func(key string, matched int) {
		x.Insert("B", chain("abc")) // would deadlock if fn ran under the lock
		_ = x.Blocks(key)
	})
	if got := matches(t, x, chain("abc")); len(got) != 2 {
		t.Errorf("Match = %v, want A and B", got)
	}
}

func TestEvictionAndRemove(t *testing.T) {
	type op struct {
		key    string
		prompt string // "" removes key
	}
	tests := []struct {
		name    string
		bound   int
		ops     []op
		want    map[string]map[string]int // query -> matches
		blocks  map[string]int
		targets int
	}{
		{
			name:  "oldest chain is trimmed from its tail",
			bound: 4,
			ops:   []op{{"A", "abc"}, {"A", "xyz"}},
			want: map[string]map[string]int{
				"abc": {"A": 1},
				"xyz": {"A": 3},
			},
			blocks:  map[string]int{"A": 4},
			targets: 1,
		},
		{
			name:  "touched blocks survive",
			bound: 6,
			ops:   []op{{"A", "abc"}, {"A", "def"}, {"A", "abc"}, {"A", "ghi"}},
			want: map[string]map[string]int{
				"abc": {"A": 3},
				"def": {},
				"ghi": {"A": 3},
			},
			blocks:  map[string]int{"A": 6},
			targets: 1,
		},
		{
			name:  "shared prefix is touched by a sibling",
			bound: 5,
			ops:   []op{{"A", "abcd"}, {"A", "abxy"}},
			want: map[string]map[string]int{
				"abcd": {"A": 3},
				"abxy": {"A": 4},
			},
			blocks:  map[string]int{"A": 5},
			targets: 1,
		},
		{
			name:  "prompt longer than the bound",
			bound: 3,
			ops:   []op{{"A", "abcdef"}},
			want: map[string]map[string]int{
				"abcdef": {"A": 3},
			},
			blocks:  map[string]int{"A": 3},
			targets: 1,
		},
		{
			name:  "bound is per target",
			bound: 2,
			ops:   []op{{"A", "ab"}, {"B", "ab"}, {"B", "cd"}},
			want: map[string]map[string]int{
				"ab": {"A": 2},
				"cd": {"B": 2},
			},
			blocks:  map[string]int{"A": 2, "B": 2},
			targets: 2,
		},
		{
			name:  "remove",
			bound: 10,
			ops:   []op{{"A", "abc"}, {"B", "abd"}, {"A", ""}},
			want: map[string]map[string]int{
				"abc": {"B": 2},
				"abd": {"B": 3},
			},
			blocks:  map[string]int{"A": 0, "B": 3},
			targets: 1,
		},
		{
			name:  "remove then insert reuses the slot",
			bound: 10,
			ops:   []op{{"A", "abc"}, {"A", ""}, {"B", "abc"}, {"A", "ab"}},
			want: map[string]map[string]int{
				"abc": {"A": 2, "B": 3},
			},
			blocks:  map[string]int{"A": 2, "B": 3},
			targets: 2,
		},
		{
			name:    "remove unknown",
			bound:   10,
			ops:     []op{{"A", "abc"}, {"Z", ""}},
			want:    map[string]map[string]int{"abc": {"A": 3}},
			blocks:  map[string]int{"A": 3, "Z": 0},
			targets: 1,
		},
		{
			name:    "remove everything",
			bound:   10,
			ops:     []op{{"A", "abc"}, {"B", "abc"}, {"B", ""}, {"A", ""}},
			want:    map[string]map[string]int{"abc": {}},
			blocks:  map[string]int{"A": 0, "B": 0},
			targets: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewIndex[string](tt.bound)
			for _, o := range tt.ops {
				if o.prompt == "" {
					x.Remove(o.key)
				} else {
					x.Insert(o.key, chain(o.prompt))
				}
				checkInvariants(t, x)
			}
			for q, want := range tt.want {
				if got := matches(t, x, chain(q)); !maps.Equal(got, want) {
					t.Errorf("Match(%q) = %v, want %v", q, got, want)
				}
			}
			for key, want := range tt.blocks {
				if got := x.Blocks(key); got != want {
					t.Errorf("Blocks(%q) = %d, want %d", key, got, want)
				}
			}
			if got := x.Targets(); got != tt.targets {
				t.Errorf("Targets() = %d, want %d", got, tt.targets)
			}
		})
	}
}

func TestRemoveDropsNodes(t *testing.T) {
	x := NewIndex[int](0)
	for k := range 10 {
		x.Insert(k, chain(strings.Repeat("ab", 50)))
	}
	for k := range 10 {
		x.Remove(k)
	}
	checkInvariants(t, x)
	if n := x.nodes.len(); n != 0 {
		t.Errorf("%d nodes left after removing every target", n)
	}
}

func TestNewIndexBound(t *testing.T) {
	tests := []struct {
		in, want int
	}{
		{0, DefaultMaxBlocksPerTarget},
		{-5, DefaultMaxBlocksPerTarget},
		{1, 1},
		{1000, 1000},
	}
	for _, tt := range tests {
		if got := NewIndex[int](tt.in).bound; got != tt.want {
			t.Errorf("NewIndex(%d).bound = %d, want %d", tt.in, got, tt.want)
		}
	}
}
