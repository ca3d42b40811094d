package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// DeepSeek-V3's three split patterns, applied in sequence, which the
// scanners below reproduce.
const (
	deepseekDigits = `\p{N}{1,3}`
	deepseekCJK    = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	deepseekWords  = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// matcher returns the length of a pattern's match at the start of s, or 0
// when it does not match there.
type matcher func(s string) int

// scanSplitter isolates the matches of a pattern that a matcher
// reproduces; the text between matches forms pieces too, as in
// regexpSplitter.
type scanSplitter struct {
	match matcher
}

// split implements splitter.
func (sc scanSplitter) split(s string, dst []int) []int {
	gap := false
	for i := 0; i < len(s); {
		if n := sc.match(s[i:]); n > 0 {
			if gap {
				dst = append(dst, i)
				gap = false
			}
			i += n
			dst = append(dst, i)
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		gap = true
	}
	if gap {
		dst = append(dst, len(s))
	}
	return dst
}

// matchDigits is \p{N}{1,3}.
func matchDigits(s string) int {
	end := 0
	for k := 0; k < 3 && end < len(s); k++ {
		r, size := utf8.DecodeRuneInString(s[end:])
		if !unicode.IsNumber(r) {
			break
		}
		end += size
	}
	return end
}

// isKanaOrHan is [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff].
func isKanaOrHan(r rune) bool {
	return r >= 0x4e00 && r <= 0x9fa5 || r >= 0x3040 && r <= 0x309f || r >= 0x30a0 && r <= 0x30ff
}

// matchCJK is [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+.
func matchCJK(s string) int {
	return runOf(s, isKanaOrHan)
}

// runOf is the length of the run of runes at the start of s that in
// accepts.
func runOf(s string, in func(rune) bool) int {
	end := 0
	for end < len(s) {
		r, size := utf8.DecodeRuneInString(s[end:])
		if !in(r) {
			break
		}
		end += size
	}
	return end
}

func isLetterOrMark(r rune) bool  { return unicode.IsLetter(r) || unicode.Is(unicode.M, r) }
func isPunctOrSymbol(r rune) bool { return unicode.IsPunct(r) || unicode.IsSymbol(r) }
func isNewline(r rune) bool       { return r == '\r' || r == '\n' }
func isASCIILetter(r rune) bool   { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }

// isASCIIPunct is [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~].
func isASCIIPunct(r rune) bool {
	return r >= '!' && r <= '/' || r >= ':' && r <= '@' || r >= '[' && r <= '`' || r >= '{' && r <= '~'
}

// matchDeepseekWords is DeepSeek-V3's third pattern, its alternatives
// tried in order as a backtracking engine does:
//
//	[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
//	 ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
func matchDeepseekWords(s string) int {
	c, n := utf8.DecodeRuneInString(s)
	next, _ := utf8.DecodeRuneInString(s[n:])
	hasNext := n < len(s)
	// [ASCII punctuation][A-Za-z]+
	if isASCIIPunct(c) && hasNext && isASCIILetter(next) {
		return n + runOf(s[n:], isASCIILetter)
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if !isNewline(c) && !unicode.IsLetter(c) && !isPunctOrSymbol(c) && hasNext && isLetterOrMark(next) {
		return n + runOf(s[n:], isLetterOrMark)
	}
	if isLetterOrMark(c) {
		return runOf(s, isLetterOrMark)
	}
	// ' '?[\p{P}\p{S}]+[\r\n]*
	if c == ' ' && hasNext && isPunctOrSymbol(next) {
		end := 1 + runOf(s[1:], isPunctOrSymbol)
		return end + runOf(s[end:], isNewline)
	}
	if isPunctOrSymbol(c) {
		end := runOf(s, isPunctOrSymbol)
		return end + runOf(s[end:], isNewline)
	}
	if !unicode.IsSpace(c) {
		return 0
	}
	// \s*[\r\n]+ | \s+(?!\S) | \s+
	end, lastNewline, lastStart := 0, -1, 0
	for end < len(s) {
		r, size := utf8.DecodeRuneInString(s[end:])
		if !unicode.IsSpace(r) {
			break
		}
		if isNewline(r) {
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
