package extproc

import (
	"bytes"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/scheduler"
)

func TestDescribe(t *testing.T) {
	tests := []struct {
		name      string
		route     Route
		body      string
		model     string
		prompt    string
		ids       []int64
		maxTokens int
		items     int
	}{
		{"chat", RouteChat, `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":" there"}]}],"max_tokens":9}`,
			"m", "system\nBe brief.\nuser\nHi there\n", nil, 9, 1},
		{"chat n", RouteChat, `{"messages":[{"role":"user","content":"x"}],"n":3,"max_completion_tokens":5}`, "", "user\nx\n", nil, 5, 3},
		{"completions text", RouteCompletions, `{"prompt":"Once","max_tokens":4}`, "", "Once", nil, 4, 1},
		{"completions batch", RouteCompletions, `{"prompt":["a","b"]}`, "", "a", nil, 0, 2},
		{"completions ids", RouteCompletions, `{"prompt":[1,2,3]}`, "", "", []int64{1, 2, 3}, 0, 1},
		{"generate text", RouteGenerate, `{"text":"hello","sampling_params":{"max_new_tokens":7}}`, "", "hello", nil, 7, 1},
		{"generate batch", RouteGenerate, `{"text":["a","b","c"]}`, "", "a", nil, 0, 3},
		{"generate ids batch", RouteGenerate, `{"input_ids":[[5,6],[7]]}`, "", "", []int64{5, 6}, 0, 2},
		{"responses", RouteResponses, `{"instructions":"I.","input":"hey","max_output_tokens":3}`, "", "I.hey", nil, 3, 1},
		{"responses messages", RouteResponses, `{"input":[{"role":"user","content":"q"}]}`, "", "user\nq\n", nil, 0, 1},
		{"missing prompt", RouteChat, `{"model":"m"}`, "m", "", nil, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ParseBody(tt.route, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			var req scheduler.Request
			describe(tt.route, b, &req)
			if req.Model != tt.model || string(req.Prompt) != tt.prompt || !slices.Equal(req.TokenIDs, tt.ids) ||
				req.MaxTokens != tt.maxTokens || req.Items != tt.items {
				t.Errorf("got model %q prompt %q ids %v max %d items %d", req.Model, req.Prompt, req.TokenIDs, req.MaxTokens, req.Items)
			}
		})
	}
}

// A growing conversation keeps its earlier rendering as a prefix: that is
// what lets the prefix index follow a multi-turn chat.
func TestRenderMessagesGrowsAsPrefix(t *testing.T) {
	turn1 := `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"one"}]}`
	turn2 := `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"one"},{"role":"assistant","content":"ok"},{"role":"user","content":"two"}]}`
	var r1, r2 scheduler.Request
	b1, _ := ParseBody(RouteChat, []byte(turn1))
	b2, _ := ParseBody(RouteChat, []byte(turn2))
	describe(RouteChat, b1, &r1)
	describe(RouteChat, b2, &r2)
	if !bytes.HasPrefix(r2.Prompt, r1.Prompt) {
		t.Errorf("turn 2 %q does not extend turn 1 %q", r2.Prompt, r1.Prompt)
	}
}

// The model name outlives the request (the ledger and the token estimator
// keep it); it must not keep the request's body alive.
func TestDescribeModelDoesNotPinBody(t *testing.T) {
	const size = 16 << 20
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", size) + `"}]}`)
	b, err := ParseBody(RouteChat, body)
	if err != nil {
		t.Fatal(err)
	}
	var req scheduler.Request
	describe(RouteChat, b, &req)
	model := req.Model
	b, body, req = nil, nil, scheduler.Request{}
	_, _ = b, body
	runtime.GC()
	runtime.GC() // and what earlier tests left in sync.Pools (kept one collection more)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if ms.HeapAlloc > size/2 {
		t.Errorf("heap holds %d MiB after the request: the model %q pins its body", ms.HeapAlloc>>20, model)
	}
	runtime.KeepAlive(model)
}

// describe writes a text prompt over the buffer it is handed, whatever that
// held before, and token ids leave Prompt empty.
func TestDescribeReusesPromptBuffer(t *testing.T) {
	tests := []struct {
		name   string
		route  Route
		body   string
		prompt string
	}{
		{"chat", RouteChat, `{"messages":[{"role":"user","content":"hi"}]}`, "user\nhi\n"},
		{"completions", RouteCompletions, `{"prompt":"Once"}`, "Once"},
		{"generate", RouteGenerate, `{"text":"hello"}`, "hello"},
		{"responses", RouteResponses, `{"instructions":"I.","input":[{"role":"user","content":"q"}]}`, "I.user\nq\n"},
		{"token ids", RouteGenerate, `{"input_ids":[1,2]}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ParseBody(tt.route, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 0, 64)
			buf = append(buf, "stale prompt of an earlier request"...)
			req := scheduler.Request{Prompt: buf}
			describe(tt.route, b, &req)
			if string(req.Prompt) != tt.prompt {
				t.Fatalf("prompt %q, want %q", req.Prompt, tt.prompt)
			}
			if len(req.Prompt) > 0 && &req.Prompt[0] != &buf[:1][0] {
				t.Error("the prompt did not reuse the buffer it was handed")
			}
		})
	}
}

// renderMessagesGJSON is renderMessages as gjson alone does it, a byte at
// a time: the reference FuzzRenderMessages holds the fast one to.
func renderMessagesGJSON(out []byte, msgs gjson.Result) []byte {
	msgs.ForEach(func(_, m gjson.Result) bool {
		out = append(out, m.Get("role").String()...)
		out = append(out, '\n')
		content := m.Get("content")
		if content.IsArray() {
			content.ForEach(func(_, part gjson.Result) bool {
				if t := part.Get("text"); t.Exists() {
					out = append(out, t.String()...)
				} else if t := part.Get("content"); t.Exists() {
					out = append(out, t.String()...)
				}
				return true
			})
		} else {
			out = append(out, content.String()...)
		}
		out = append(out, '\n')
		return true
	})
	return out
}

// FuzzRenderMessages checks that a chat body's prompt renders as gjson
// renders it, for every valid body whose messages are objects without
// duplicate keys (of duplicates, gjson takes the first and duet the last,
// as the engines do).
func FuzzRenderMessages(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"system","content":"a \"b\" \\ \u00e9\n"},{"content":"x","role":"user","name":"n"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},{"content":"c"}]}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"tool","content":"42"}]}`,
		`{"messages":[]}`,
		`{"messages": [ { "role" : "user" , "content" : "` + strings.Repeat("lorem ipsum ", 50) + `" } ] }`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := ParseBody(RouteChat, raw)
		if err != nil {
			return
		}
		msgs := b.field("messages")
		if !msgs.IsArray() {
			return
		}
		plain := true
		msgs.ForEach(func(_, m gjson.Result) bool {
			if !m.IsObject() {
				plain = false
				return false
			}
			seen := map[string]bool{}
			m.ForEach(func(k, _ gjson.Result) bool {
				if seen[k.String()] {
					plain = false
				}
				seen[k.String()] = true
				return plain
			})
			return plain
		})
		if !plain {
			return
		}
		if got, want := renderMessages(nil, msgs), renderMessagesGJSON(nil, msgs); string(got) != string(want) {
			t.Fatalf("renderMessages(%q) = %q, gjson renders %q", raw, got, want)
		}
	})
}
