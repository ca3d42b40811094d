package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// chunk is the union of the streaming payload shapes used below.
type chunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Index        int               `json:"index"`
		Delta        map[string]string `json:"delta"`
		Text         string            `json:"text"`
		FinishReason *string           `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	// /generate
	Text     string `json:"text"`
	Index    *int   `json:"index"`
	MetaInfo *struct {
		CompletionTokens int `json:"completion_tokens"`
		FinishReason     *struct {
			Type   string `json:"type"`
			Length int    `json:"length"`
		} `json:"finish_reason"`
	} `json:"meta_info"`
	// /v1/responses
	Type  string `json:"type"`
	Delta string `json:"delta"`
}

func TestStreamingFraming(t *testing.T) {
	ts := startTest(t, Config{Mode: ModeNull, DPSize: 2})
	tests := []struct {
		name  string
		path  string
		body  string
		check func(t *testing.T, chunks []chunk)
	}{
		{name: "chat with usage", path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"12345678"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
			check: func(t *testing.T, cs []chunk) {
				if len(cs) != 6 {
					t.Fatalf("got %d chunks, want role + 3 tokens + finish + usage", len(cs))
				}
				if cs[0].Choices[0].Delta["role"] != "assistant" {
					t.Fatalf("first chunk %+v is not the role chunk", cs[0])
				}
				var text string
				for _, c := range cs[:5] {
					if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 {
						t.Fatalf("bad chunk %+v", c)
					}
					text += c.Choices[0].Delta["content"]
				}
				if text != "tok0 tok1 tok2" {
					t.Fatalf("text %q", text)
				}
				if fr := cs[4].Choices[0].FinishReason; fr == nil || *fr != "length" {
					t.Fatalf("finish chunk %+v", cs[4])
				}
				u := cs[5].Usage
				if len(cs[5].Choices) != 0 || u == nil || u.PromptTokens != 2 || u.CompletionTokens != 3 || u.TotalTokens != 5 {
					t.Fatalf("usage chunk %+v", cs[5])
				}
			}},
		{name: "completions batch without usage", path: "/v1/completions",
			body: `{"prompt":["a","bb"],"max_tokens":2,"stream":true}`,
			check: func(t *testing.T, cs []chunk) {
				texts := map[int]string{}
				finished := map[int]bool{}
				for _, c := range cs {
					if c.Usage != nil || c.Object != "text_completion" {
						t.Fatalf("unexpected chunk %+v", c)
					}
					ch := c.Choices[0]
					texts[ch.Index] += ch.Text
					if ch.FinishReason != nil {
						finished[ch.Index] = true
					}
				}
				if texts[0] != "tok0 tok1" || texts[1] != "tok0 tok1" || !finished[0] || !finished[1] {
					t.Fatalf("texts %v finished %v", texts, finished)
				}
			}},
		{name: "generate cumulative text", path: "/generate",
			body: `{"text":"hello","sampling_params":{"max_new_tokens":3},"stream":true}`,
			check: func(t *testing.T, cs []chunk) {
				want := []string{"tok0", "tok0 tok1", "tok0 tok1 tok2"}
				if len(cs) != len(want) {
					t.Fatalf("got %d events", len(cs))
				}
				for i, c := range cs {
					if c.Text != want[i] || c.Index != nil || c.MetaInfo.CompletionTokens != i+1 {
						t.Fatalf("event %d: %+v", i, c)
					}
					if last := i == len(cs)-1; last != (c.MetaInfo.FinishReason != nil) {
						t.Fatalf("event %d finish_reason %+v", i, c.MetaInfo.FinishReason)
					}
				}
				if fr := cs[2].MetaInfo.FinishReason; fr.Type != "length" || fr.Length != 3 {
					t.Fatalf("finish_reason %+v", fr)
				}
			}},
		{name: "generate batch carries index", path: "/generate",
			body: `{"input_ids":[[1,2],[3]],"sampling_params":{"max_new_tokens":2},"stream":true}`,
			check: func(t *testing.T, cs []chunk) {
				last := map[int]string{}
				for _, c := range cs {
					if c.Index == nil {
						t.Fatalf("batch event without index: %+v", c)
					}
					last[*c.Index] = c.Text
				}
				if len(cs) != 4 || last[0] != "tok0 tok1" || last[1] != "tok0 tok1" {
					t.Fatalf("events %+v", cs)
				}
			}},
		{name: "responses events", path: "/v1/responses",
			body: `{"input":[{"role":"user","content":"hi"}],"max_output_tokens":2,"stream":true}`,
			check: func(t *testing.T, cs []chunk) {
				var types []string
				var text string
				for _, c := range cs {
					types = append(types, c.Type)
					text += c.Delta
				}
				if strings.Join(types, ",") != "response.created,response.output_text.delta,response.output_text.delta,response.completed" ||
					text != "tok0 tok1" {
					t.Fatalf("types %v text %q", types, text)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, ts.api.URL+tc.path, tc.body)
			if resp.status != 200 || resp.header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d content-type %q", resp.status, resp.header.Get("Content-Type"))
			}
			events := sseEvents(t, resp.body)
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream does not end with [DONE]: %q", events)
			}
			var cs []chunk
			for _, e := range events[:len(events)-1] {
				var c chunk
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("event %q: %v", e, err)
				}
				cs = append(cs, c)
			}
			tc.check(t, cs)
		})
	}
}

// TestStreamingFlushesPerToken reads the first token long before the last
// one is generated.
func TestStreamingFlushesPerToken(t *testing.T) {
	ts := startTest(t, Config{Mode: ModeNull, DecodePerToken: 20 * time.Millisecond})
	start := time.Now()
	resp, err := http.Post(ts.api.URL+"/generate", "application/json",
		strings.NewReader(`{"text":"hi","sampling_params":{"max_new_tokens":50},"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(line, `data: {`) || !strings.Contains(line, `"text":"tok0"`) {
		t.Fatalf("first line %q", line)
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Fatalf("first token after %s; 50 tokens take 1s, so it was not flushed", el)
	}
}

// --stream-interval batches tokens like SGLang: the first token alone, then
// one chunk per interval tokens, the rest at the end; no token is lost.
func TestStreamInterval(t *testing.T) {
	tests := []struct {
		interval, tokens int
		wantChunks       int
	}{
		{1, 10, 10},
		{4, 10, 4}, // 1, 2-5, 6-9, 10
		{4, 9, 3},  // 1, 2-5, 6-9
		{16, 5, 2}, // 1, 2-5
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("interval=%d/tokens=%d", tt.interval, tt.tokens), func(t *testing.T) {
			ts := startTest(t, Config{Mode: ModeNull, DPSize: 1, StreamInterval: tt.interval})
			resp := post(t, ts.api.URL+"/v1/chat/completions",
				fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"stream":true}`, tt.tokens))
			var text strings.Builder
			chunks := 0
			for _, ev := range sseEvents(t, resp.body) {
				if ev == "[DONE]" {
					continue
				}
				var c struct {
					Choices []struct {
						Delta struct {
							Content string `json:"content"`
						} `json:"delta"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatal(err)
				}
				if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
					chunks++
					text.WriteString(c.Choices[0].Delta.Content)
				}
			}
			if chunks != tt.wantChunks {
				t.Errorf("%d content chunks, want %d", chunks, tt.wantChunks)
			}
			want := tokenText(0)
			for i := 1; i < tt.tokens; i++ {
				want += tokenText(i)
			}
			if text.String() != want {
				t.Errorf("streamed text %q, want %q", text.String(), want)
			}
		})
	}
}
