package sim

import (
	"strconv"
	"unicode/utf8"
)

// textTokens approximates the token count of text: ceil(chars/4).
func textTokens(text string) int {
	return (utf8.RuneCountInString(text) + 3) / 4
}

// tokenText is the text of generated token i; tokens after the first carry
// a leading space, so concatenated deltas read "tok0 tok1 tok2".
func tokenText(i int) string {
	if i == 0 {
		return "tok0"
	}
	return " tok" + strconv.Itoa(i)
}
