package tokenize

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// parseValue turns a JSON document (already validated by the caller's
// parse of the body) into template values, as Python's json module would
// load it: objects keep their key order, integers stay integers (beyond
// 64 bits they become floats, where Python keeps them exact). Strings
// without escapes share the document's memory, and escaped ones are
// unescaped a run at a time: chat contents are most of a body, so this is
// most of what rendering a chat costs before the template runs.
func parseValue(doc string) (jinja.Value, error) {
	p := jsonParser{s: doc}
	v, err := p.value(0)
	if err != nil {
		return jinja.Value{}, err
	}
	p.space()
	if p.i != len(p.s) {
		return jinja.Value{}, fmt.Errorf("JSON: trailing data at offset %d", p.i)
	}
	return v, nil
}

// maxJSONDepth bounds nesting (the body passed duet's own bound already).
const maxJSONDepth = 512

// jsonParser reads one JSON document.
type jsonParser struct {
	s string
	i int
}

// errJSON is a malformed document.
var errJSON = errors.New("malformed JSON")

// space skips whitespace.
func (p *jsonParser) space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value reads any value.
func (p *jsonParser) value(depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, fmt.Errorf("%w: nested deeper than %d", errJSON, maxJSONDepth)
	}
	p.space()
	if p.i >= len(p.s) {
		return jinja.Value{}, fmt.Errorf("%w: unexpected end", errJSON)
	}
	switch c := p.s[p.i]; {
	case c == '"':
		s, err := p.str()
		return jinja.NewString(s), err
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == 't' && strings.HasPrefix(p.s[p.i:], "true"):
		p.i += 4
		return jinja.NewBool(true), nil
	case c == 'f' && strings.HasPrefix(p.s[p.i:], "false"):
		p.i += 5
		return jinja.NewBool(false), nil
	case c == 'n' && strings.HasPrefix(p.s[p.i:], "null"):
		p.i += 4
		return jinja.None(), nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	}
	return jinja.Value{}, fmt.Errorf("%w: unexpected %q at offset %d", errJSON, p.s[p.i], p.i)
}

// object reads an object, keys in order (a repeated key keeps its first
// place and its last value, as Python's dict does).
func (p *jsonParser) object(depth int) (jinja.Value, error) {
	p.i++ // {
	d := jinja.NewDict()
	dict := d.AsDict()
	p.space()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return d, nil
	}
	for {
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return jinja.Value{}, fmt.Errorf("%w: an object key expected at offset %d", errJSON, p.i)
		}
		key, err := p.str()
		if err != nil {
			return jinja.Value{}, err
		}
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return jinja.Value{}, fmt.Errorf("%w: ':' expected at offset %d", errJSON, p.i)
		}
		p.i++
		v, err := p.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		dict.Set(key, v)
		p.space()
		if p.i >= len(p.s) {
			return jinja.Value{}, fmt.Errorf("%w: unexpected end in an object", errJSON)
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return d, nil
		default:
			return jinja.Value{}, fmt.Errorf("%w: ',' or '}' expected at offset %d", errJSON, p.i)
		}
	}
}

// array reads an array.
func (p *jsonParser) array(depth int) (jinja.Value, error) {
	p.i++ // [
	var items []jinja.Value
	p.space()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return jinja.NewList(items), nil
	}
	for {
		v, err := p.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		items = append(items, v)
		p.space()
		if p.i >= len(p.s) {
			return jinja.Value{}, fmt.Errorf("%w: unexpected end in an array", errJSON)
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return jinja.NewList(items), nil
		default:
			return jinja.Value{}, fmt.Errorf("%w: ',' or ']' expected at offset %d", errJSON, p.i)
		}
	}
}

// number reads a number: an integer if it has no fraction or exponent and
// fits in 64 bits, else a float.
func (p *jsonParser) number() (jinja.Value, error) {
	start := p.i
	float := false
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c >= '0' && c <= '9' || c == '-' || c == '+':
		case c == '.' || c == 'e' || c == 'E':
			float = true
		default:
			goto done
		}
		p.i++
	}
done:
	lit := p.s[start:p.i]
	if !float {
		if n, err := strconv.ParseInt(lit, 10, 64); err == nil {
			return jinja.NewInt(n), nil
		}
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.Value{}, fmt.Errorf("%w: number %q", errJSON, lit)
	}
	return jinja.NewFloat(f), nil
}

// str reads a string at p.i (which is '"').
func (p *jsonParser) str() (string, error) {
	p.i++ // opening quote
	start := p.i
	for p.i < len(p.s) {
		switch c := p.s[p.i]; c {
		case '"':
			s := p.s[start:p.i]
			p.i++
			return s, nil
		case '\\':
			return p.escaped(start)
		}
		p.i++
	}
	return "", fmt.Errorf("%w: unterminated string", errJSON)
}

// escaped reads the rest of a string that has escapes, from start; p.i is
// at the first backslash.
func (p *jsonParser) escaped(start int) (string, error) {
	// The closing quote: the first one after an even run of backslashes.
	end := p.i
	for {
		q := strings.IndexByte(p.s[end:], '"')
		if q < 0 {
			return "", fmt.Errorf("%w: unterminated string", errJSON)
		}
		end += q
		n := 0
		for k := end - 1; k >= start && p.s[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			break
		}
		end++
	}
	// The unescaped string is no longer than the escaped one: one
	// allocation holds it.
	var b strings.Builder
	b.Grow(end - start)
	b.WriteString(p.s[start:p.i])
	for p.i < end {
		j := strings.IndexByte(p.s[p.i:end], '\\')
		if j < 0 {
			b.WriteString(p.s[p.i:end])
			break
		}
		b.WriteString(p.s[p.i : p.i+j])
		p.i += j
		if p.i+1 >= end {
			return "", fmt.Errorf("%w: bad escape at offset %d", errJSON, p.i)
		}
		switch e := p.s[p.i+1]; e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			r, n := unicodeEscape(p.s[p.i:end])
			if n == 0 {
				return "", fmt.Errorf("%w: bad \\u escape at offset %d", errJSON, p.i)
			}
			b.WriteRune(r)
			p.i += n
			continue
		default:
			return "", fmt.Errorf("%w: bad escape at offset %d", errJSON, p.i)
		}
		p.i += 2
	}
	p.i = end + 1
	return b.String(), nil
}

// unicodeEscape reads \uXXXX at the start of s, with the low half of a
// surrogate pair after it: the rune and the bytes read (0: malformed). A
// lone surrogate is U+FFFD, as Go's and gjson's decoders make it.
func unicodeEscape(s string) (rune, int) {
	if len(s) < 6 {
		return 0, 0
	}
	u, err := strconv.ParseUint(s[2:6], 16, 16)
	if err != nil {
		return 0, 0
	}
	r := rune(u)
	if !utf16.IsSurrogate(r) {
		return r, 6
	}
	if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
		if u2, err := strconv.ParseUint(s[8:12], 16, 16); err == nil {
			if dec := utf16.DecodeRune(r, rune(u2)); dec != utf8.RuneError {
				return dec, 12
			}
		}
	}
	return utf8.RuneError, 6
}
