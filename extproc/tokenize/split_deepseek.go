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
// regexpSplitter. next, when set, skips to where a match may start: the
// first byte of the rest that could begin one.
type scanSplitter struct {
	match matcher
	next  func(s string) int
}

// split implements splitter.
func (sc scanSplitter) split(s string, dst []int) []int {
	gap := false
	for i := 0; i < len(s); {
		if sc.next != nil {
			if j := sc.next(s[i:]); j > 0 {
				i += j
				gap = true
				if i >= len(s) {
					break
				}
			}
		}
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
		f, size := flagsAt(s[end:])
		if f&flagN == 0 {
			break
		}
		end += size
	}
	return end
}

// nextDigit skips to the first \p{N}.
func nextDigit(s string) int {
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= '0' && c <= '9' {
				return i
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if unicode.IsNumber(r) {
			return i
		}
		i += size
	}
	return len(s)
}

// isKanaOrHan is [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff].
func isKanaOrHan(r rune) bool {
	return r >= 0x4e00 && r <= 0x9fa5 || r >= 0x3040 && r <= 0x309f || r >= 0x30a0 && r <= 0x30ff
}

// matchCJK is [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+.
func matchCJK(s string) int {
	end := 0
	for end < len(s) {
		r, size := utf8.DecodeRuneInString(s[end:])
		if !isKanaOrHan(r) {
			break
		}
		end += size
	}
	return end
}

// nextCJK skips to the first rune of matchCJK's ranges: they are encoded
// with lead bytes 0xE3 to 0xE9, which no other byte of UTF-8 equals.
func nextCJK(s string) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0xE3 && c <= 0xE9 {
			if r, _ := utf8.DecodeRuneInString(s[i:]); isKanaOrHan(r) {
				return i
			}
		}
	}
	return len(s)
}

// matchDeepseekWords is DeepSeek-V3's third pattern, its alternatives
// tried in order as a backtracking engine does:
//
//	[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
//	 ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
func matchDeepseekWords(s string) int {
	c, n := flagsAt(s)
	next, _ := flagsAt(s[n:])
	// [ASCII punctuation][A-Za-z]+
	if c&flagASCIIPunct != 0 && n < len(s) && isASCIILetter(s[n]) {
		end := n
		for end < len(s) && isASCIILetter(s[end]) {
			end++
		}
		return end
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if c&(flagNewline|flagL|flagP|flagS) == 0 && next&(flagL|flagM) != 0 {
		return n + runFlags(s[n:], flagL|flagM)
	}
	if c&(flagL|flagM) != 0 {
		return runFlags(s, flagL|flagM)
	}
	// ' '?[\p{P}\p{S}]+[\r\n]*
	if s[0] == ' ' && next&(flagP|flagS) != 0 {
		end := 1 + runFlags(s[1:], flagP|flagS)
		return end + runFlags(s[end:], flagNewline)
	}
	if c&(flagP|flagS) != 0 {
		end := runFlags(s, flagP|flagS)
		return end + runFlags(s[end:], flagNewline)
	}
	if c&flagSpace == 0 {
		return 0
	}
	return matchSpaces(s)
}

// isASCIILetter is [A-Za-z].
func isASCIILetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
