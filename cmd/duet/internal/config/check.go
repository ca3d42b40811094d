package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// positions maps the key paths of a configuration file, as its errors name
// them ("listen.grpc", "pools[0].policy.decode", "pools[0].decode[1]"), to
// the line each starts on.
type positions map[string]int

// line returns the line of field, or of the nearest enclosing key the file
// has (a defaulted field has none of its own), and whether there was one.
func (p positions) line(field string) (int, bool) {
	for field != "" {
		if n, ok := p[field]; ok {
			return n, true
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			return 0, false
		}
		field = field[:i]
	}
	return 0, false
}

// fieldPath matches the key path an error message starts with.
var fieldPath = regexp.MustCompile(`^[a-z0-9_]+(\[\d+\]|\.[a-z0-9_]+)*`)

// annotate prefixes each error that starts with a key path the file has
// ("pools[0].decode[0].url: ...") with that key's line.
func (p positions) annotate(errs []error) []error {
	out := make([]error, len(errs))
	for i, err := range errs {
		out[i] = err
		field := fieldPath.FindString(err.Error())
		if field == "" || !strings.HasPrefix(err.Error()[len(field):], ":") {
			continue
		}
		if n, ok := p.line(field); ok {
			out[i] = fmt.Errorf("line %d: %w", n, err)
		}
	}
	return out
}

var (
	durationType   = reflect.TypeFor[time.Duration]()
	policySpecType = reflect.TypeFor[PolicySpec]()
)

// checkNode walks node, the YAML of a value of type t at key path path,
// recording each key's line in pos. It reports, each naming its line and
// key path, the keys t does not have (with the nearest one it has) and the
// scalars that cannot be t's: a duration without a unit, a word where a
// number or a boolean goes. What it does not catch, the decoder still does.
func checkNode(node *yaml.Node, t reflect.Type, path string, pos positions) []error {
	if node.Kind == yaml.AliasNode && node.Alias != nil {
		node = node.Alias
	}
	where := path
	if where == "" {
		where = "the configuration"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if node.Kind == yaml.ScalarNode {
		if node.Tag == "!!null" {
			return nil
		}
		if err := checkScalar(node, t); err != nil {
			return []error{fmt.Errorf("line %d: %s: %w", node.Line, where, err)}
		}
		return nil
	}
	want := map[reflect.Kind]yaml.Kind{reflect.Struct: yaml.MappingNode, reflect.Map: yaml.MappingNode, reflect.Slice: yaml.SequenceNode}
	if k, ok := want[t.Kind()]; ok && node.Kind != k {
		return []error{fmt.Errorf("line %d: %s: %s goes here, not %s", node.Line, where, describe(t), describeNode(node))}
	}
	if _, ok := want[t.Kind()]; !ok && t != policySpecType {
		return []error{fmt.Errorf("line %d: %s: a single value goes here, not %s", node.Line, where, describeNode(node))}
	}
	var errs []error
	switch t.Kind() {
	case reflect.Struct:
		keys := structKeys(t)
		for i := 0; i+1 < len(node.Content); i += 2 {
			k, v := node.Content[i], node.Content[i+1]
			if k.Value == "<<" { // a merge key: its mapping's keys are checked where defined
				continue
			}
			field := join(path, k.Value)
			f, ok := keys[k.Value]
			if !ok {
				errs = append(errs, fmt.Errorf("line %d: %s: %s", k.Line, field, unknownKey(k.Value, path, keys)))
				continue
			}
			pos[field] = k.Line
			errs = append(errs, checkNode(v, f.Type, field, pos)...)
		}
	case reflect.Slice:
		for i, item := range node.Content {
			field := fmt.Sprintf("%s[%d]", path, i)
			pos[field] = item.Line
			errs = append(errs, checkNode(item, t.Elem(), field, pos)...)
		}
	case reflect.Map:
		for i := 0; i+1 < len(node.Content); i += 2 {
			k, v := node.Content[i], node.Content[i+1]
			field := join(path, k.Value)
			pos[field] = k.Line
			errs = append(errs, checkNode(v, t.Elem(), field, pos)...)
		}
	}
	return errs
}

// checkScalar reports why a scalar node cannot be a value of type t, or
// nil. Only durations, numbers and booleans are checked.
func checkScalar(node *yaml.Node, t reflect.Type) error {
	v := node.Value
	switch {
	case t == durationType:
		if node.Tag == "!!int" || node.Tag == "!!float" {
			return fmt.Errorf("%s is not a duration: write %q (a number with a unit: ms, s, m or h)", v, v+"s")
		}
		if _, err := time.ParseDuration(v); err != nil {
			return fmt.Errorf("%q is not a duration: write a number with a unit, such as 500ms, 5s, 2m or 1h", v)
		}
		return nil
	case t == policySpecType:
		return nil // a bare policy name
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if node.Tag != "!!int" {
			return fmt.Errorf("%q is not a whole number", v)
		}
	case reflect.Float32, reflect.Float64:
		if node.Tag != "!!int" && node.Tag != "!!float" {
			return fmt.Errorf("%q is not a number", v)
		}
	case reflect.Bool:
		if node.Tag != "!!bool" {
			return fmt.Errorf("%q is not true or false", v)
		}
	case reflect.Struct, reflect.Slice, reflect.Map:
		return fmt.Errorf("%s goes here, not %q", describe(t), v)
	}
	return nil
}

// describe says what YAML a value of type t (a struct, slice or map) is.
func describe(t reflect.Type) string {
	switch {
	case t == policySpecType:
		return "a policy name or a mapping (name and parameters)"
	case t.Kind() == reflect.Slice:
		return "a list"
	default:
		return "a mapping of keys to values"
	}
}

// describeNode says what YAML node is: a list, a mapping or a value.
func describeNode(node *yaml.Node) string {
	switch node.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	default:
		return fmt.Sprintf("%q", node.Value)
	}
}

// structKeys maps the YAML keys of struct type t to their fields.
func structKeys(t reflect.Type) map[string]reflect.StructField {
	keys := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		keys[name] = f
	}
	return keys
}

// unknownKey says that key is not one of keys, the keys of the mapping at
// path, and suggests the nearest, or lists them all when none is near.
func unknownKey(key, path string, keys map[string]reflect.StructField) string {
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names)
	if near := nearest(key, names); near != "" {
		return fmt.Sprintf("unknown key: did you mean %q? (docs/configuration.md lists every key)", near)
	}
	where := "the top level"
	if path != "" {
		where = path
	}
	return fmt.Sprintf("unknown key; %s takes %s (docs/configuration.md)", where, strings.Join(names, ", "))
}

// nearest returns the name closest to s by edit distance, if it is close
// (at most a third of s's length, and at least 1 and at most 3, edits
// away), else the shortest name that starts with s or that s starts with
// (for s of 3 or more letters), else "".
func nearest(s string, names []string) string {
	best, bestD := "", min(max(len(s)/3, 1), 3)+1
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	if best != "" || len(s) < 3 {
		return best
	}
	for _, n := range names {
		if (strings.HasPrefix(n, s) || strings.HasPrefix(s, n) && len(n) >= 3) && (best == "" || len(n) < len(best)) {
			best = n
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, counting an
// adjacent transposition as one edit.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// join appends key to the key path path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// typeErrorLine matches the line a yaml.v3 type error starts with.
var typeErrorLine = regexp.MustCompile(`^line (\d+): `)

// nameDecodeErrors adds the key path to each message of a yaml.v3 type
// error whose line holds exactly one key, so that what checkNode let
// through still names its key.
func nameDecodeErrors(err error, pos positions) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	byLine := map[int][]string{}
	for field, n := range pos {
		byLine[n] = append(byLine[n], field)
	}
	msgs := make([]error, 0, len(te.Errors))
	for _, m := range te.Errors {
		if sub := typeErrorLine.FindStringSubmatch(m); sub != nil {
			n, _ := strconv.Atoi(sub[1])
			if fields := deepest(byLine[n]); fields != "" {
				m = fmt.Sprintf("line %d: %s: %s", n, fields, m[len(sub[0]):])
			}
		}
		msgs = append(msgs, errors.New(m))
	}
	return errors.Join(msgs...)
}

// deepest returns the one key path of fields that every other one is a
// prefix of (the innermost key on a line), or "" when there is none.
func deepest(fields []string) string {
	best := ""
	for _, f := range fields {
		if len(f) > len(best) {
			best = f
		}
	}
	for _, f := range fields {
		if !strings.HasPrefix(best, f) {
			return ""
		}
	}
	return best
}
