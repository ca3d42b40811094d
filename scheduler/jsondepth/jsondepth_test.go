package jsondepth

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		limit int
		ok    bool
	}{
		{"flat", `{"a":1}`, 1, true},
		{"at the limit", `{"a":[[1]]}`, 3, true},
		{"over the limit", `{"a":[[[1]]]}`, 3, false},
		{"brackets in strings do not count", `{"a":"[[[[[[{{{{"}`, 1, true},
		{"escaped quote keeps the string open", `{"a":"\"[[[["}`, 1, true},
		{"sequential nesting", `[[1],[2],[3]]`, 2, true},
		{"megabytes of brackets", strings.Repeat("[", 6<<20), 64, false},
		{"escaped backslash closes the string", `{"a":"\\","b":[[1]]}`, 3, true},
		{"escaped backslash then too deep", `{"a":"\\","b":[[1]]}`, 2, false},
		{"odd backslash run keeps it open", `{"a":"\\\"[[[["}`, 1, true},
		{"unterminated string", `{"a":"[[[[`, 1, true},
		{"brackets after a string", `{"a":"x","b":[[1]]}`, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Check([]byte(tt.body), tt.limit); (err == nil) != tt.ok {
				t.Errorf("Check = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func BenchmarkCheck(b *testing.B) {
	body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat(`lorem ipsum \"dolor\" sit amet `, 1<<10) + `"}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := Check(body, 256); err != nil {
			b.Fatal(err)
		}
	}
}
