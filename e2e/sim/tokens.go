package sim

import (
	"strconv"
	"strings"
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

// replyWordChars is the length of one ReplyText word with its space: one
// simulator token (textTokens counts ceil(chars/4)).
const replyWordChars = 4

// ReplyText is the answer duet-sim generates for a request carrying seed
// (the body's seed, or sampling_params.sampling_seed on /generate): tokens
// pseudo-random three-letter lowercase words, each followed by a space, so
// 4 characters per token like e2e/bench's Text. It is deterministic in
// (seed, tokens), and ReplyText(seed, n) is a prefix of ReplyText(seed,
// n+k): a client that sends a seed knows the answer it will get, and can
// send it back in the next turn's prompt as real multi-turn clients do.
func ReplyText(seed int64, tokens int) string {
	var b strings.Builder
	b.Grow(max(tokens, 0) * replyWordChars)
	for i := 0; i < tokens; i++ {
		b.WriteString(replyWord(seed, i))
	}
	return b.String()
}

// replyWord is word i of ReplyText(seed, ...), its trailing space
// included: three letters drawn from a splitmix64 hash of (seed, i).
func replyWord(seed int64, i int) string {
	x := splitmix64(uint64(seed)*0x9e3779b97f4a7c15 ^ splitmix64(uint64(i)))
	return string([]byte{'a' + byte(x%26), 'a' + byte(x/26%26), 'a' + byte(x/676%26), ' '})
}

// splitmix64 is one step of the splitmix64 mixer.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// genTokenText is the text of generated token i of an item: word i of
// ReplyText(seed, ...) when the request carried a seed, else tokenText(i).
func genTokenText(seed *int64, i int) string {
	if seed != nil {
		return replyWord(*seed, i)
	}
	return tokenText(i)
}

// answerText is the text of an item's first n generated tokens.
func answerText(seed *int64, n int) string {
	if seed != nil {
		return ReplyText(*seed, n)
	}
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(tokenText(i))
	}
	return b.String()
}
