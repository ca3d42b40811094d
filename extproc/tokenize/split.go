package tokenize

import (
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// splitter cuts text into pieces that BPE sees one at a time. The pieces
// cover the text contiguously; split appends each piece's end offset (in
// bytes) to dst.
type splitter interface {
	split(s string, dst []int) []int
}

// preTokenizer is the pre_tokenizer section: splits applied in sequence,
// each to every piece of the one before.
type preTokenizer struct {
	splits []splitter
}

// preTokenizerSpec is one pre_tokenizer entry.
type preTokenizerSpec struct {
	Type          string            `json:"type"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Pattern       struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
}

// gpt2Pattern is the split ByteLevel applies with use_regex (GPT-2's).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// Llama-3's and Qwen's split patterns, which the scanner reproduces.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwenPattern   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// parsePreTokenizer reads the pre_tokenizer section. Byte-level BPE needs a
// ByteLevel entry (without add_prefix_space); Split entries must isolate
// their matches.
func parsePreTokenizer(raw json.RawMessage) (*preTokenizer, error) {
	p := &preTokenizer{}
	byteLevel, err := p.add(raw)
	if err != nil {
		return nil, err
	}
	if !byteLevel {
		return nil, fmt.Errorf("no ByteLevel pre-tokenizer (only byte-level BPE is supported): %w", errUnsupported)
	}
	return p, nil
}

// add appends the splits of one entry and reports whether it held a
// ByteLevel entry.
func (p *preTokenizer) add(raw json.RawMessage) (byteLevel bool, err error) {
	if isNull(raw) {
		return false, nil
	}
	var spec preTokenizerSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return false, err
	}
	switch spec.Type {
	case "Sequence":
		for i, r := range spec.Pretokenizers {
			bl, err := p.add(r)
			if err != nil {
				return false, fmt.Errorf("sequence entry %d: %w", i, err)
			}
			byteLevel = byteLevel || bl
		}
		return byteLevel, nil
	case "ByteLevel":
		if spec.AddPrefixSpace {
			return false, fmt.Errorf("ByteLevel with add_prefix_space: %w", errUnsupported)
		}
		if spec.UseRegex == nil || *spec.UseRegex {
			s, err := newSplitter(gpt2Pattern)
			if err != nil {
				return false, err
			}
			p.splits = append(p.splits, s)
		}
		return true, nil
	case "Split":
		if spec.Behavior != "Isolated" || spec.Invert {
			return false, fmt.Errorf("a Split with behavior %q, invert %v (only Isolated, not inverted): %w", spec.Behavior, spec.Invert, errUnsupported)
		}
		var pattern string
		switch {
		case spec.Pattern.Regex != nil:
			pattern = *spec.Pattern.Regex
		case spec.Pattern.String != nil:
			pattern = regexp2.Escape(*spec.Pattern.String)
		default:
			return false, fmt.Errorf("a Split without a pattern")
		}
		s, err := newSplitter(pattern)
		if err != nil {
			return false, err
		}
		p.splits = append(p.splits, s)
		return false, nil
	}
	return false, fmt.Errorf("type %q: %w", spec.Type, errUnsupported)
}

// newSplitter returns the scanner for a pattern it reproduces, else a
// regexp2 splitter.
func newSplitter(pattern string) (splitter, error) {
	switch pattern {
	case llama3Pattern:
		return llamaSplitter{maxDigits: 3}, nil
	case qwenPattern:
		return llamaSplitter{maxDigits: 1}, nil
	case deepseekDigits:
		return scanSplitter{match: matchDigits, next: nextDigit}, nil
	case deepseekCJK:
		return scanSplitter{match: matchCJK, next: nextCJK}, nil
	case deepseekWords:
		return scanSplitter{match: matchDeepseekWords}, nil
	}
	return newRegexpSplitter(pattern)
}

// pieces appends the end offsets of s's pieces after every split.
func (p *preTokenizer) pieces(s string, dst []int, scratch []int) ([]int, []int) {
	if len(p.splits) == 0 {
		return append(dst, len(s)), scratch
	}
	dst = p.splits[0].split(s, dst)
	for _, sp := range p.splits[1:] {
		scratch = append(scratch[:0], dst...)
		dst = dst[:0]
		start := 0
		for _, end := range scratch {
			from := len(dst)
			dst = sp.split(s[start:end], dst)
			for i := from; i < len(dst); i++ {
				dst[i] += start
			}
			start = end
		}
	}
	return dst, scratch
}

// regexpSplitter isolates the matches of a pattern; the text between them
// forms pieces too.
type regexpSplitter struct {
	re *regexp2.Regexp
}

// newRegexpSplitter compiles pattern with Oniguruma-like semantics.
func newRegexpSplitter(pattern string) (regexpSplitter, error) {
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return regexpSplitter{}, fmt.Errorf("split pattern %q: %w", pattern, err)
	}
	return regexpSplitter{re: re}, nil
}

// split implements splitter. regexp2 reports rune offsets; they are turned
// into byte offsets on the way.
func (r regexpSplitter) split(s string, dst []int) []int {
	runeAt, byteAt := 0, 0
	advance := func(toRune int) {
		for runeAt < toRune {
			_, size := utf8.DecodeRuneInString(s[byteAt:])
			byteAt += size
			runeAt++
		}
	}
	m, _ := r.re.FindStringMatch(s)
	for m != nil {
		if m.Length > 0 {
			if m.Index > runeAt {
				advance(m.Index)
				dst = append(dst, byteAt)
			}
			advance(m.Index + m.Length)
			dst = append(dst, byteAt)
		}
		m, _ = r.re.FindNextMatch(m)
	}
	if byteAt < len(s) {
		dst = append(dst, len(s))
	}
	return dst
}

// llamaSplitter scans Llama-3's split pattern (maxDigits 3) or Qwen's
// (maxDigits 1) without a regular expression engine:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// The alternatives are tried in order at each position, as a backtracking
// engine does; every character is matched by one of them.
type llamaSplitter struct {
	maxDigits int
}

// split implements splitter.
func (l llamaSplitter) split(s string, dst []int) []int {
	for i := 0; i < len(s); {
		i += l.match(s[i:])
		dst = append(dst, i)
	}
	return dst
}

// match returns the length of the pattern's match at the start of s
// (s is not empty).
func (l llamaSplitter) match(s string) int {
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[0] == '\'' {
		if n := contraction(s[1:]); n > 0 {
			return 1 + n
		}
	}
	c, n := flagsAt(s)
	next, _ := flagsAt(s[n:])
	switch {
	case c&flagL != 0:
		return n + runFlags(s[n:], flagL)
	case c&flagN != 0:
		end := n
		for d := 1; d < l.maxDigits; d++ {
			f, size := flagsAt(s[end:])
			if f&flagN == 0 {
				break
			}
			end += size
		}
		return end
	case c&flagNewline == 0:
		// [^\r\n\p{L}\p{N}]?\p{L}+
		if next&flagL != 0 {
			return n + runFlags(s[n:], flagL)
		}
		// ' '?[^\s\p{L}\p{N}]+[\r\n]*
		start := -1
		switch {
		case c&flagRest != 0:
			start = 0
		case s[0] == ' ' && next&flagRest != 0:
			start = 1
		}
		if start >= 0 {
			end := start + runFlags(s[start:], flagRest)
			return end + runFlags(s[end:], flagNewline)
		}
	}
	// c is a space or a newline.
	return matchSpaces(s)
}

// matchSpaces is \s*[\r\n]+ | \s+(?!\S) | \s+ at the start of s, which
// starts with whitespace: up to the run's last newline if it has one;
// else all of it before the end or a single character, or all but its
// last character (which \s+(?!\S) leaves to the next piece).
func matchSpaces(s string) int {
	end, lastNewline, lastStart := 0, -1, 0
	for end < len(s) {
		f, size := flagsAt(s[end:])
		if f&flagSpace == 0 {
			break
		}
		if f&flagNewline != 0 {
			lastNewline = end + size
		}
		lastStart = end
		end += size
	}
	switch {
	case lastNewline > 0:
		return lastNewline
	case end == len(s) || lastStart == 0:
		return end
	default:
		return lastStart
	}
}

// contraction returns the length of s's leading s, t, re, ve, m, ll or d
// (any case, with Unicode's case folding), or 0.
func contraction(s string) int {
	for _, suffix := range [...]string{"s", "t", "re", "ve", "m", "ll", "d"} {
		if n := foldPrefix(s, suffix); n > 0 {
			return n
		}
	}
	return 0
}

// foldPrefix returns the byte length of s's prefix that equals the ASCII
// word under simple case folding, or 0.
func foldPrefix(s, word string) int {
	at := 0
	for i := 0; i < len(word); i++ {
		if at >= len(s) {
			return 0
		}
		r, size := utf8.DecodeRuneInString(s[at:])
		if !foldsTo(r, rune(word[i])) {
			return 0
		}
		at += size
	}
	return at
}

// foldsTo reports whether r equals the lower-case ASCII letter w under
// Unicode simple case folding (so 'S' and 'ſ' fold to 's').
func foldsTo(r, w rune) bool {
	if r == w {
		return true
	}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		if f == w {
			return true
		}
	}
	return false
}
