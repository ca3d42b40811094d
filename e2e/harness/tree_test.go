package harness

import (
	"reflect"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestDigAndWalk(t *testing.T) {
	var doc any
	if err := yaml.Unmarshal([]byte("a: {b: [x, {c: 1}]}\nd: [[{e: 2}]]\n"), &doc); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path []any
		want any
	}{
		{[]any{"a", "b", 0}, "x"},
		{[]any{"a", "b", 1, "c"}, 1},
		{[]any{"d", 0, 0, "e"}, 2},
		{nil, doc},
		{[]any{"a", "missing"}, nil},
		{[]any{"a", "b", 2}, nil},
		{[]any{"a", "b", -1}, nil},
		{[]any{"a", 0}, nil},
		{[]any{"a", "b", "c"}, nil},
		{[]any{"a", 1.5}, nil},
	} {
		if got := Dig(doc, tt.path...); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Dig(%v) = %v, want %v", tt.path, got, tt.want)
		}
	}
	var keys []string
	Walk(doc, func(m map[string]any) {
		for k := range m {
			keys = append(keys, k)
		}
	})
	if len(keys) != 5 { // the root's a and d, then b, c and e
		t.Errorf("Walk saw keys %v, want a, b, c, d and e", keys)
	}
}
