package accesslog

import (
	"slices"
	"testing"
)

func TestRecent(t *testing.T) {
	ids := func(cs []Completion) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.RequestID)
		}
		return out
	}
	tests := []struct {
		name string
		add  []string
		keep func(Completion) bool
		want []string
	}{
		{"empty", nil, nil, nil},
		{"not full", []string{"a", "b"}, nil, []string{"a", "b"}},
		{"exactly full", []string{"a", "b", "c"}, nil, []string{"a", "b", "c"}},
		{"wrapped, oldest first", []string{"a", "b", "c", "d", "e"}, nil, []string{"c", "d", "e"}},
		{"filtered after wrapping", []string{"a", "b", "a", "c"}, func(c Completion) bool { return c.RequestID == "a" }, []string{"a"}},
		{"filtered", []string{"a", "b", "a"}, func(c Completion) bool { return c.RequestID == "a" }, []string{"a", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRecent(3)
			for _, id := range tt.add {
				r.add(Completion{RequestID: id})
			}
			if got := ids(r.list(tt.keep)); !slices.Equal(got, tt.want) {
				t.Errorf("list() = %v, want %v", got, tt.want)
			}
		})
	}
}
