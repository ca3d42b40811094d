// Package jsonscan checks and splits request bodies in one pass each,
// eight bytes at a time through string contents.
//
// duet reads every inference body: it must refuse malformed JSON and bodies
// nested deep enough to exhaust a recursive parser, and it needs the
// positions of the top-level members (to rewrite the body) and of each chat
// message's role and content (to render the prompt). gjson did all of it a
// byte at a time, in four passes over a prompt that is nearly all of the
// body: 32 KiB took 76 µs to validate alone. Strings are the bulk of a
// prompt, and a string's bytes need only one test (is it a quote, a
// backslash or a control character?), which a 64-bit word answers for eight
// bytes at once.
//
// [Validate] accepts exactly what gjson.ValidBytes accepts (RFC 8259 JSON;
// string bytes are not checked as UTF-8), which a differential fuzz test
// holds it to. [Members] and [Elements] split a document that [Validate]
// accepted; on other input they return an error or partial results, never
// panic.
package jsonscan

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrInvalid is returned for input that is not valid JSON.
var ErrInvalid = errors.New("not valid JSON")

// Span is a half-open byte range [Start, End) of the scanned input.
type Span struct{ Start, End int }

// Member is one member of an object: its key, quotes included, and its
// value.
type Member struct{ Key, Value Span }

// Validate reports whether data is one JSON value, surrounded by optional
// white space, nested at most maxDepth arrays and objects deep. The error
// wraps ErrInvalid, or says how deep the nesting went.
func Validate(data []byte, maxDepth int) error {
	v := validator{data: data, maxDepth: maxDepth}
	i, err := v.value(skipSpace(data, 0), 0)
	if err != nil {
		return err
	}
	if i = skipSpace(data, i); i != len(data) {
		return fmt.Errorf("%w: unexpected %s after the value at byte %d", ErrInvalid, describe(data, i), i)
	}
	return nil
}

// validator walks a document with an explicit loop per container, so that
// its recursion depth is the document's nesting, which it bounds.
type validator struct {
	data     []byte
	maxDepth int
}

// value validates the value starting at i, at the given depth, and
// returns the index just past it.
func (v *validator) value(i, depth int) (int, error) {
	d := v.data
	if i >= len(d) {
		return i, fmt.Errorf("%w: unexpected end of input", ErrInvalid)
	}
	switch c := d[i]; {
	case c == '"':
		return v.str(i)
	case c == '{' || c == '[':
		if depth >= v.maxDepth {
			return i, fmt.Errorf("JSON nested deeper than %d levels", v.maxDepth)
		}
		if c == '{' {
			return v.object(i, depth+1)
		}
		return v.array(i, depth+1)
	case c == '-' || c >= '0' && c <= '9':
		return v.number(i)
	case c == 't':
		return v.literal(i, "true")
	case c == 'f':
		return v.literal(i, "false")
	case c == 'n':
		return v.literal(i, "null")
	default:
		return i, fmt.Errorf("%w: unexpected %s at byte %d", ErrInvalid, describe(d, i), i)
	}
}

func (v *validator) object(i, depth int) (int, error) {
	d := v.data
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return i, fmt.Errorf("%w: expected a member name at byte %d", ErrInvalid, i)
		}
		var err error
		if i, err = v.str(i); err != nil {
			return i, err
		}
		if i = skipSpace(d, i); i >= len(d) || d[i] != ':' {
			return i, fmt.Errorf("%w: expected ':' at byte %d", ErrInvalid, i)
		}
		if i, err = v.value(skipSpace(d, i+1), depth); err != nil {
			return i, err
		}
		if i = skipSpace(d, i); i >= len(d) {
			return i, fmt.Errorf("%w: unterminated object", ErrInvalid)
		}
		switch d[i] {
		case ',':
			i = skipSpace(d, i+1)
		case '}':
			return i + 1, nil
		default:
			return i, fmt.Errorf("%w: expected ',' or '}' at byte %d", ErrInvalid, i)
		}
	}
}

func (v *validator) array(i, depth int) (int, error) {
	d := v.data
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		if i, err = v.value(i, depth); err != nil {
			return i, err
		}
		if i = skipSpace(d, i); i >= len(d) {
			return i, fmt.Errorf("%w: unterminated array", ErrInvalid)
		}
		switch d[i] {
		case ',':
			i = skipSpace(d, i+1)
		case ']':
			return i + 1, nil
		default:
			return i, fmt.Errorf("%w: expected ',' or ']' at byte %d", ErrInvalid, i)
		}
	}
}

// str validates the string whose opening quote is at i.
func (v *validator) str(i int) (int, error) {
	d := v.data
	for j := i + 1; ; {
		j = plainRun(d, j)
		if j >= len(d) {
			return j, fmt.Errorf("%w: unterminated string at byte %d", ErrInvalid, i)
		}
		switch c := d[j]; {
		case c == '"':
			return j + 1, nil
		case c < 0x20:
			return j, fmt.Errorf("%w: control character in a string at byte %d", ErrInvalid, j)
		default: // a backslash
			if j+1 >= len(d) {
				return j, fmt.Errorf("%w: unterminated string at byte %d", ErrInvalid, i)
			}
			switch d[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(d) || !isHex(d[j+2]) || !isHex(d[j+3]) || !isHex(d[j+4]) || !isHex(d[j+5]) {
					return j, fmt.Errorf("%w: bad \\u escape at byte %d", ErrInvalid, j)
				}
				j += 6
			default:
				return j, fmt.Errorf("%w: bad escape at byte %d", ErrInvalid, j)
			}
		}
	}
}

func (v *validator) number(i int) (int, error) {
	d := v.data
	start := i
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		i = digits(d, i)
	default:
		return i, fmt.Errorf("%w: bad number at byte %d", ErrInvalid, start)
	}
	if i < len(d) && d[i] == '.' {
		if i+1 >= len(d) || !isDigit(d[i+1]) {
			return i, fmt.Errorf("%w: bad number at byte %d", ErrInvalid, start)
		}
		i = digits(d, i+1)
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return i, fmt.Errorf("%w: bad number at byte %d", ErrInvalid, start)
		}
		i = digits(d, i)
	}
	return i, nil
}

func (v *validator) literal(i int, word string) (int, error) {
	if len(v.data)-i < len(word) || string(v.data[i:i+len(word)]) != word {
		return i, fmt.Errorf("%w: unexpected %s at byte %d", ErrInvalid, describe(v.data, i), i)
	}
	return i + len(word), nil
}

// Members returns the members of the object that is the whole of obj
// (white space around it allowed), in order, appended to dst. Duplicate
// keys are all returned. obj must have passed [Validate].
func Members(dst []Member, obj []byte) ([]Member, error) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return dst, fmt.Errorf("%w: not an object", ErrInvalid)
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return dst, nil
	}
	for i < len(obj) {
		if obj[i] != '"' {
			return dst, fmt.Errorf("%w: expected a member name at byte %d", ErrInvalid, i)
		}
		var m Member
		m.Key.Start = i
		m.Key.End = skipString(obj, i)
		i = skipSpace(obj, m.Key.End)
		if i >= len(obj) || obj[i] != ':' {
			return dst, fmt.Errorf("%w: expected ':' at byte %d", ErrInvalid, i)
		}
		m.Value.Start = skipSpace(obj, i+1)
		m.Value.End = skipValue(obj, m.Value.Start)
		if m.Value.End <= m.Value.Start || m.Value.End > len(obj) {
			return dst, fmt.Errorf("%w: bad value at byte %d", ErrInvalid, m.Value.Start)
		}
		dst = append(dst, m)
		if i = skipSpace(obj, m.Value.End); i < len(obj) && obj[i] == ',' {
			i = skipSpace(obj, i+1)
			continue
		}
		break
	}
	return dst, nil
}

// Elements returns the spans of the elements of the array that is the
// whole of arr (white space around it allowed), appended to dst. arr must
// have passed [Validate].
func Elements(dst []Span, arr []byte) ([]Span, error) {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return dst, fmt.Errorf("%w: not an array", ErrInvalid)
	}
	i = skipSpace(arr, i+1)
	if i < len(arr) && arr[i] == ']' {
		return dst, nil
	}
	for i < len(arr) {
		end := skipValue(arr, i)
		if end <= i || end > len(arr) {
			return dst, fmt.Errorf("%w: bad element at byte %d", ErrInvalid, i)
		}
		dst = append(dst, Span{i, end})
		if i = skipSpace(arr, end); i < len(arr) && arr[i] == ',' {
			i = skipSpace(arr, i+1)
			continue
		}
		break
	}
	return dst, nil
}

// Plain reports whether the string s (quotes included) has no escapes: its
// contents are then s[1:len(s)-1] as they stand.
func Plain(s []byte) bool {
	return len(s) >= 2 && plainRun(s[:len(s)-1], 1) == len(s)-1
}

// skipValue returns the index just past the valid value at i, or i when
// there is none.
func skipValue(d []byte, i int) int {
	if i >= len(d) {
		return i
	}
	switch d[i] {
	case '"':
		return skipString(d, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(d); {
			switch d[j] {
			case '"':
				j = skipString(d, j)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
			j++
		}
		return len(d)
	default: // a number or a literal: up to the next delimiter
		j := i
		for j < len(d) && d[j] != ',' && d[j] != '}' && d[j] != ']' && !isSpace(d[j]) {
			j++
		}
		return j
	}
}

// skipString returns the index just past the string whose opening quote is
// at i (len(d) when it is unterminated).
func skipString(d []byte, i int) int {
	for j := i + 1; ; {
		j = plainRun(d, j)
		if j >= len(d) {
			return len(d)
		}
		if d[j] == '"' {
			return j + 1
		}
		if d[j] == '\\' {
			j += 2
		} else {
			j++ // a control character: Validate refused it
		}
	}
}

// Word masks: every byte 0x01, every byte 0x80.
const (
	lows  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plainRun returns the index of the first byte at or after i that is a
// quote, a backslash or a control character (below 0x20), or len(d).
func plainRun(d []byte, i int) int {
	for ; i+8 <= len(d); i += 8 {
		w := binary.LittleEndian.Uint64(d[i:])
		// A byte is special when it is below 0x20 or equal to '"' or '\\':
		// the classic has-zero-byte test, exact for whether any byte of the
		// word is (bits above the first hit may be wrong, so the word is
		// then scanned a byte at a time).
		if (w-0x20*lows)&^w&highs != 0 || hasZero(w^('"'*lows)) || hasZero(w^('\\'*lows)) {
			break
		}
	}
	for ; i < len(d); i++ {
		if c := d[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return i
}

// hasZero reports whether any byte of w is zero.
func hasZero(w uint64) bool { return (w-lows)&^w&highs != 0 }

func skipSpace(d []byte, i int) int {
	for i < len(d) && isSpace(d[i]) {
		i++
	}
	return i
}

func digits(d []byte, i int) int {
	for i < len(d) && isDigit(d[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isHex(c byte) bool   { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// describe names the byte at i for an error message.
func describe(d []byte, i int) string {
	if i >= len(d) {
		return "end of input"
	}
	if c := d[i]; c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", c)
	}
	return fmt.Sprintf("byte 0x%02x", d[i])
}
