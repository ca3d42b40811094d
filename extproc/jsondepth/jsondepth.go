// Package jsondepth bounds how deeply a JSON document nests before gjson
// reads it. gjson recurses once per nesting level, so a few megabytes of
// brackets overflow the goroutine stack, and a stack overflow kills the
// whole process (it is not a recoverable panic). Every body duet parses
// from a client or an engine passes through Check first.
package jsondepth

import "fmt"

// Check returns an error if the arrays and objects of body nest deeper than
// limit. It looks only at brackets outside strings and validates nothing
// else; it is linear in len(body) and allocates nothing.
func Check(body []byte, limit int) error {
	depth := 0
	inString, escaped := false, false
	for _, c := range body {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > limit {
				return fmt.Errorf("JSON nested deeper than %d levels", limit)
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return nil
}
