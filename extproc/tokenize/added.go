package tokenize

import (
	"fmt"
	"iter"
	"strings"
)

// addedVocab finds added tokens in text, leftmost-longest, as Hugging
// Face's Aho-Corasick matcher does.
type addedVocab struct {
	// first marks the bytes that start some token, so most positions
	// are passed over at once.
	first [256]bool
	// single is the one byte every token starts with (they all start
	// with '<' in the supported families), found with IndexByte; -1 when
	// they start with several.
	single int
	root   *trieNode
}

// trieNode is one byte of the token trie.
type trieNode struct {
	next map[byte]*trieNode
	id   int32 // the token ending here, or -1
}

// newAddedVocab builds the matchers of the tokens matched in raw text and
// of those matched after normalization, and the set of all added ids.
func newAddedVocab(specs []addedTokenSpec) (raw, normalized *addedVocab, ids map[int32]string, err error) {
	ids = make(map[int32]string, len(specs))
	var rawToks, normToks []addedTokenSpec
	for _, s := range specs {
		switch {
		case s.Content == "":
			return nil, nil, nil, fmt.Errorf("token %d is empty", s.ID)
		case s.LStrip || s.RStrip || s.SingleWord:
			return nil, nil, nil, fmt.Errorf("token %q has lstrip, rstrip or single_word: %w", s.Content, errUnsupported)
		case s.ID < 0 || s.ID > 1<<31-1:
			return nil, nil, nil, fmt.Errorf("token %q has id %d", s.Content, s.ID)
		}
		ids[int32(s.ID)] = s.Content
		if s.Normalized {
			normToks = append(normToks, s)
		} else {
			rawToks = append(rawToks, s)
		}
	}
	return buildAddedVocab(rawToks), buildAddedVocab(normToks), ids, nil
}

// buildAddedVocab builds a matcher; nil when there are no tokens.
func buildAddedVocab(specs []addedTokenSpec) *addedVocab {
	if len(specs) == 0 {
		return nil
	}
	v := &addedVocab{root: &trieNode{id: -1}, single: int(specs[0].Content[0])}
	for _, s := range specs {
		n := v.root
		for i := 0; i < len(s.Content); i++ {
			c := s.Content[i]
			if n.next == nil {
				n.next = map[byte]*trieNode{}
			}
			child, ok := n.next[c]
			if !ok {
				child = &trieNode{id: -1}
				n.next[c] = child
			}
			n = child
		}
		if n.id < 0 { // the first of two equal contents wins
			n.id = int32(s.ID)
		}
		v.first[s.Content[0]] = true
		if int(s.Content[0]) != v.single {
			v.single = -1
		}
	}
	return v
}

// find returns the leftmost-longest token in s at or after from: its
// start, end and id; start is -1 if there is none.
func (v *addedVocab) find(s string, from int) (start, end int, id int32) {
	if v == nil {
		return -1, 0, 0
	}
	for i := from; i < len(s); i++ {
		if v.single >= 0 {
			j := strings.IndexByte(s[i:], byte(v.single))
			if j < 0 {
				return -1, 0, 0
			}
			i += j
		} else if !v.first[s[i]] {
			continue
		}
		n, bestEnd, bestID := v.root, -1, int32(-1)
		for j := i; j < len(s); j++ {
			n = n.next[s[j]]
			if n == nil {
				break
			}
			if n.id >= 0 {
				bestEnd, bestID = j+1, n.id
			}
		}
		if bestEnd > 0 {
			return i, bestEnd, bestID
		}
	}
	return -1, 0, 0
}

// segment is a run of text between added tokens, or one added token.
type segment struct {
	text  string
	id    int32
	token bool
}

// segments yields s cut at its added tokens, in order: each run of text
// between them (never empty) and each token. A nil vocabulary yields s
// whole.
func (v *addedVocab) segments(s string) iter.Seq[segment] {
	return func(yield func(segment) bool) {
		for from := 0; from < len(s); {
			start, end, id := v.find(s, from)
			if start < 0 {
				start, end = len(s), len(s)
			}
			if start > from && !yield(segment{text: s[from:start]}) {
				return
			}
			if end > start && !yield(segment{id: id, token: true}) {
				return
			}
			from = end
		}
	}
}
