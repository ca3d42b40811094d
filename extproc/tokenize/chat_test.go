package tokenize

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
	"github.com/tidwall/gjson"
)

// chatCase is a chat request as a client sends it, and the messages and
// tools SGLang hands to the template for it (its rewrites, read from
// SGLang 0.5.23's serving_chat.py), which the reference renders.
type chatCase struct {
	name string
	// body holds messages, tools, chat_template_kwargs and
	// reasoning_effort as the client sends them.
	body string
	// refMessages and refTools are what SGLang passes to
	// apply_chat_template; empty means the body's own.
	refMessages, refTools string
	refKwargs             string
	noGenerationPrompt    bool
}

// weatherTool is a tool as clients send it, and as SGLang dumps it.
const (
	weatherTool    = `{"type":"function","function":{"name":"get_weather","description":"Get the weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string","description":"城市 name"},"days":{"type":"integer"}},"required":["city"]}}}`
	weatherToolRef = `{"type":"function","function":{"name":"get_weather","description":"Get the weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string","description":"城市 name"},"days":{"type":"integer"}},"required":["city"]}},"defer_loading":null}`
)

// chatCases cover system, user, assistant and tool turns, tools, content
// parts and template arguments.
func chatCases() []chatCase {
	return []chatCase{
		{name: "user", body: `{"messages":[{"role":"user","content":"Hello there!"}]}`},
		{name: "system", body: `{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi 你好 😀"}]}`},
		{name: "multi-turn", body: `{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2\n\n  code:\n\tdef f():\n\t\treturn 1"}]}`},
		{name: "no generation prompt", noGenerationPrompt: true, body: `{"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}`},
		{name: "lookalikes", body: `{"messages":[{"role":"user","content":"print <|im_start|> and <|begin_of_text|> and <｜end▁of▁sentence｜> literally"}]}`},
		{
			name:        "tools",
			body:        `{"tools":[` + weatherTool + `],"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 2}"}}]},{"role":"tool","tool_call_id":"c1","content":"{\"temp\": 21.5}"},{"role":"user","content":"thanks"}]}`,
			refTools:    `[` + weatherToolRef + `]`,
			refMessages: `[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris","days":2}}}]},{"role":"tool","tool_call_id":"c1","content":"{\"temp\": 21.5}"},{"role":"user","content":"thanks"}]`,
		},
		{
			name:     "tool choice names a tool",
			body:     `{"tools":[` + weatherTool + `,{"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}},"messages":[{"role":"user","content":"Weather?"}]}`,
			refTools: `[` + weatherToolRef + `]`,
		},
		{
			name:     "tool choice none",
			body:     `{"tools":[` + weatherTool + `],"tool_choice":"none","messages":[{"role":"user","content":"Weather?"}]}`,
			refTools: `null`,
		},
		{
			name:        "content parts",
			body:        `{"messages":[{"role":"user","content":[{"type":"text","text":"first part"},{"type":"text","text":"second part"}]}]}`,
			refMessages: `[{"role":"user","content":"first part second part"}]`,
		},
		{
			name:        "last assistant",
			body:        `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"partial answer"}]}`,
			refMessages: `[{"role":"user","content":"q"},{"role":"user","content":"partial answer"}]`,
		},
		{
			name:      "template kwargs",
			body:      `{"messages":[{"role":"user","content":"think?"}],"chat_template_kwargs":{"enable_thinking":false}}`,
			refKwargs: `{"enable_thinking":false}`,
		},
		{
			name:      "reasoning effort",
			body:      `{"messages":[{"role":"user","content":"think?"}],"reasoning_effort":"none"}`,
			refKwargs: `{"reasoning_effort":"none","thinking":false,"enable_thinking":false}`,
		},
		{name: "long history", body: longChat(41, 2000)},
	}
}

// longChat is a conversation of turns messages of about size bytes each.
func longChat(turns, size int) string {
	var msgs []map[string]string
	msgs = append(msgs, map[string]string{"role": "system", "content": "You are a helpful assistant for routing questions."})
	for i := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		text := strings.Repeat("Turn "+string(rune('A'+i%26))+" talks about prefill, decode and 数据并行 ranks. ", size/60+1)
		msgs = append(msgs, map[string]string{"role": role, "content": text[:size]})
	}
	b, _ := json.Marshal(map[string]any{"messages": msgs})
	return string(b)
}

// request turns a case's body into a ChatRequest.
func (c chatCase) request() ChatRequest {
	b := gjson.Parse(c.body)
	return ChatRequest{
		Messages: b.Get("messages"), Tools: b.Get("tools"), ToolChoice: b.Get("tool_choice"),
		ChatTemplateKwargs: b.Get("chat_template_kwargs"), ReasoningEffort: b.Get("reasoning_effort"),
		NoGenerationPrompt: c.noGenerationPrompt,
	}
}

// reference is the golden request for a case.
func (c chatCase) reference() goldenCase {
	b := gjson.Parse(c.body)
	g := goldenCase{Kind: "chat", Name: c.name, AddGenerationPrompt: !c.noGenerationPrompt}
	g.Messages = json.RawMessage(b.Get("messages").Raw)
	if c.refMessages != "" {
		g.Messages = json.RawMessage(c.refMessages)
	}
	if t := b.Get("tools"); t.Exists() {
		g.Tools = json.RawMessage(t.Raw)
	}
	if c.refTools != "" {
		g.Tools = json.RawMessage(c.refTools)
	}
	if c.refKwargs != "" {
		g.Kwargs = json.RawMessage(c.refKwargs)
	}
	return g
}

// TestGoldenChat holds the chat template's rendering to transformers'
// apply_chat_template, and its ids to tokenizers, for every family.
func TestGoldenChat(t *testing.T) {
	for _, family := range families {
		t.Run(family, func(t *testing.T) {
			m := loadModel(t, family)
			cases := chatCases()
			refs := make([]goldenCase, len(cases))
			for i, c := range cases {
				refs[i] = c.reference()
			}
			want := golden(t, family, refs)
			for i, c := range cases {
				text, err := m.Chat.Render(c.request())
				if want[i].Error != "" {
					if err == nil {
						t.Errorf("%s: the reference fails (%s), duet renders %q", c.name, want[i].Error, clip(text, 0))
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", c.name, err)
					continue
				}
				if text != *want[i].Text {
					at := commonPrefix(text, *want[i].Text)
					t.Errorf("%s: rendering differs from transformers at byte %d:\n got %q\nwant %q", c.name, at, clip(text, at), clip(*want[i].Text, at))
					continue
				}
				ids, _, err := m.EncodeChat(nil, c.request())
				if err != nil {
					t.Fatal(err)
				}
				if d := firstDiff(ids, want[i].IDs); d != "" {
					t.Errorf("%s: %s", c.name, d)
				}
			}
		})
	}
}

// TestChatBadInput: bodies SGLang refuses are template errors.
func TestChatBadInput(t *testing.T) {
	m := loadModel(t, "qwen3")
	for _, body := range []string{
		`{"messages":"hi"}`,
		`{"messages":[{"role":"wizard","content":"hi"}]}`,
		`{"messages":[{"content":"hi"}]}`,
		`{"messages":[{"role":"user","content":42}]}`,
		`{"messages":[{"role":"user","content":[{"type":"hologram"}]}]}`,
		`{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"not json"}}]}]}`,
	} {
		_, _, err := m.EncodeChat(nil, chatCase{body: body}.request())
		if !errors.Is(err, ErrInvalidMessages) {
			t.Errorf("%s: got %v, want invalid messages", body, err)
		}
	}
}

// TestParseValue holds the JSON reader to gjson on strings and to Python's
// json module on numbers and key order.
func TestParseValue(t *testing.T) {
	for _, raw := range []string{
		`"plain"`, `""`, `"a\nb\tc\\d\"e\/f"`, `"\u00e9\u4f60"`, `"\ud83d\ude00 emoji"`, `"lone \ud800 x"`,
		`"\b\f\r"`, `"end\\"`, `"` + strings.Repeat(`code\n\tline `, 100) + `"`,
	} {
		v, err := parseValue(raw)
		if want := gjson.Parse(raw).Str; err != nil || v.AsString() != want {
			t.Errorf("%s: got %q (%v), want %q", raw, v.AsString(), err, want)
		}
	}
	v, err := parseValue(`{"b": 1, "a": [1.0, -2, 3e2, 12345678901234567890, true, null], "b": 2}`)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := pyToJSON([]jinja.Value{v}, nil)
	if want := `{"b": 2, "a": [1.0, -2, 300.0, 1.2345678901234567e+19, true, null]}`; got.AsString() != want {
		t.Errorf("got %s, want %s", got.AsString(), want)
	}
	for _, bad := range []string{`{"a" 1}`, `[1,]`, `"open`, `{"a":1}x`, `tru`, `"\x"`} {
		if _, err := parseValue(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
