package tokenize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// pyToJSON is the tojson filter as transformers defines it for chat
// templates: Python's json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=False). It replaces the engine's own
// filter, whose floats, escapes and indented form differ from Python's.
func pyToJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	e := pyEncoder{item: ", ", key: ": "}
	if ind, ok := kwargs["indent"]; ok && !ind.IsNone() && !ind.IsUndefined() {
		switch {
		case ind.IsInt():
			e.indent = strings.Repeat(" ", int(max(ind.AsInt(), 0)))
		case ind.IsString():
			e.indent = ind.AsString()
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an integer or a string")
		}
		e.indented, e.item = true, ","
	}
	if sep, ok := kwargs["separators"]; ok && !sep.IsNone() && !sep.IsUndefined() {
		if !sep.IsList() || sep.AsList().Len() != 2 || !sep.AsList().Items[0].IsString() || !sep.AsList().Items[1].IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		e.item, e.key = sep.AsList().Items[0].AsString(), sep.AsList().Items[1].AsString()
	}
	if err := e.encode(args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(e.sb.String()), nil
}

// pyEncoder writes values as Python's json.dumps does.
type pyEncoder struct {
	sb        strings.Builder
	item, key string
	indented  bool
	indent    string
}

// newline starts a line at depth when indenting.
func (e *pyEncoder) newline(depth int) {
	if e.indented {
		e.sb.WriteByte('\n')
		for range depth {
			e.sb.WriteString(e.indent)
		}
	}
}

// encode writes v.
func (e *pyEncoder) encode(v jinja.Value, depth int) error {
	switch {
	case v.IsNone() || v.IsUndefined():
		e.sb.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			e.sb.WriteString("true")
		} else {
			e.sb.WriteString("false")
		}
	case v.IsInt():
		e.sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		e.sb.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		pyString(&e.sb, v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			e.sb.WriteString("[]")
			return nil
		}
		e.sb.WriteByte('[')
		for i, x := range items {
			if i > 0 {
				e.sb.WriteString(e.item)
			}
			e.newline(depth + 1)
			if err := e.encode(x, depth+1); err != nil {
				return err
			}
		}
		e.newline(depth)
		e.sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			e.sb.WriteString("{}")
			return nil
		}
		e.sb.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				e.sb.WriteString(e.item)
			}
			e.newline(depth + 1)
			pyString(&e.sb, k)
			e.sb.WriteString(e.key)
			if err := e.encode(d.Data[k], depth+1); err != nil {
				return err
			}
		}
		e.newline(depth)
		e.sb.WriteByte('}')
	default:
		return fmt.Errorf("tojson: a %s is not JSON serializable", v.String())
	}
	return nil
}

// pyFloat formats f as Python's float repr (what json.dumps writes):
// the shortest digits that round-trip, fixed-point from 1e-4 to 1e16,
// else an exponent of at least two digits.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp >= -4 && exp < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if exp < 0 {
		sign, exp = "-", -exp
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, exp)
}

// pyString writes s as a JSON string with ensure_ascii=False: only the
// quote, the backslash and control characters are escaped.
func pyString(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				sb.WriteString(`\ufffd`)
			} else {
				sb.WriteString(s[i : i+size])
			}
			i += size
			continue
		}
		switch c {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			if c < 0x20 {
				fmt.Fprintf(sb, `\u%04x`, c)
			} else {
				sb.WriteByte(c)
			}
		}
		i++
	}
	sb.WriteByte('"')
}
