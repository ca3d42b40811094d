package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// charFlags are the character classes the split patterns distinguish.
type charFlags uint16

// The classes.
const (
	flagL          charFlags = 1 << iota // \p{L}
	flagM                                // \p{M}
	flagP                                // \p{P}
	flagS                                // \p{S}
	flagN                                // \p{N}
	flagSpace                            // \s
	flagNewline                          // \r, \n
	flagASCIIPunct                       // [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]
	flagRest                             // [^\s\p{L}\p{N}]
)

// asciiFlags are the ASCII characters' flags.
var asciiFlags = func() (t [utf8.RuneSelf]charFlags) {
	for c := range t {
		r := rune(c)
		t[c] = unicodeFlags(r)
		if r >= '!' && r <= '/' || r >= ':' && r <= '@' || r >= '[' && r <= '`' || r >= '{' && r <= '~' {
			t[c] |= flagASCIIPunct
		}
	}
	return t
}()

// unicodeFlags classifies r with Unicode's tables.
func unicodeFlags(r rune) charFlags {
	var f charFlags
	switch {
	case unicode.IsLetter(r):
		f |= flagL
	case unicode.Is(unicode.M, r):
		f |= flagM
	case unicode.IsPunct(r):
		f |= flagP
	case unicode.IsSymbol(r):
		f |= flagS
	case unicode.IsNumber(r):
		f |= flagN
	}
	if unicode.IsSpace(r) {
		f |= flagSpace
	}
	if r == '\r' || r == '\n' {
		f |= flagNewline
	}
	if f&(flagL|flagN|flagSpace) == 0 {
		f |= flagRest
	}
	return f
}

// flagsAt returns the flags of the rune at the start of s and its size
// (0 at the end).
func flagsAt(s string) (charFlags, int) {
	if len(s) == 0 {
		return 0, 0
	}
	if c := s[0]; c < utf8.RuneSelf {
		return asciiFlags[c], 1
	}
	r, size := utf8.DecodeRuneInString(s)
	return unicodeFlags(r), size
}

// runFlags is the length of the run of runes at the start of s that have
// one of the flags in mask.
func runFlags(s string, mask charFlags) int {
	end := 0
	for end < len(s) {
		f, size := flagsAt(s[end:])
		if f&mask == 0 {
			break
		}
		end += size
	}
	return end
}
