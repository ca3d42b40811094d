package harness

// Dig walks a decoded YAML or JSON document, nested maps
// (map[string]any) and lists ([]any): a string step indexes a map, an int
// step a list. It returns nil where the path leads nowhere.
func Dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k < 0 || k >= len(l) {
				return nil
			}
			v = l[k]
		default:
			return nil
		}
	}
	return v
}

// Walk calls f on every map within a decoded YAML or JSON document, v
// itself included, depth first.
func Walk(v any, f func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		f(x)
		for _, e := range x {
			Walk(e, f)
		}
	case []any:
		for _, e := range x {
			Walk(e, f)
		}
	}
}
