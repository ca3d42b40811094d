// Package jsondepth bounds how deeply a JSON document nests before gjson
// reads it. gjson recurses once per nesting level, so a few megabytes of
// brackets overflow the goroutine stack, and a stack overflow kills the
// whole process (it is not a recoverable panic). Every body duet parses
// from a client or an engine passes through Check first.
package jsondepth

import (
	"bytes"
	"fmt"
)

// Check returns an error if the arrays and objects of body nest deeper than
// limit. It looks only at brackets outside strings and validates nothing
// else; it is linear in len(body) and allocates nothing.
func Check(body []byte, limit int) error {
	depth := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '"':
			// Jump to the closing quote: the first one not escaped by an odd
			// run of backslashes. Prompts make most of a body, and
			// bytes.IndexByte crosses them many bytes at a time.
			end, ok := stringEnd(body, i+1)
			if !ok {
				return nil // an unterminated string holds no more brackets
			}
			i = end
		case '[', '{':
			depth++
			if depth > limit {
				return fmt.Errorf("JSON nested deeper than %d levels", limit)
			}
		case ']', '}':
			depth--
		}
	}
	return nil
}

// stringEnd returns the index of the quote that closes the string whose
// contents start at from.
func stringEnd(body []byte, from int) (int, bool) {
	for {
		q := bytes.IndexByte(body[from:], '"')
		if q < 0 {
			return 0, false
		}
		q += from
		backslashes := 0
		for j := q - 1; j >= from && body[j] == '\\'; j-- {
			backslashes++
		}
		if backslashes%2 == 0 {
			return q, true
		}
		from = q + 1
	}
}
