package sim

import (
	"strings"
	"testing"
)

func TestNonStreamingShapes(t *testing.T) {
	ts := startTest(t, Config{Mode: ModeNull, DPSize: 2})
	type genResult struct {
		Text     string `json:"text"`
		MetaInfo struct {
			ID               string `json:"id"`
			PromptTokens     int    `json:"prompt_tokens"`
			CompletionTokens int    `json:"completion_tokens"`
			FinishReason     struct {
				Type   string `json:"type"`
				Length int    `json:"length"`
			} `json:"finish_reason"`
		} `json:"meta_info"`
	}
	type openAI struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Model   string `json:"model"`
		Created int64  `json:"created"`
		Choices []struct {
			Index   int    `json:"index"`
			Text    string `json:"text"`
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		} `json:"usage"`
	}
	tests := []struct {
		name  string
		path  string
		body  string
		check func(t *testing.T, r response)
	}{
		{name: "generate single", path: "/generate", body: `{"text":"abcdefghi","sampling_params":{"max_new_tokens":2}}`,
			check: func(t *testing.T, r response) {
				var g genResult
				r.json(t, &g)
				m := g.MetaInfo
				if g.Text != "tok0 tok1" || m.ID == "" || m.PromptTokens != 3 || m.CompletionTokens != 2 ||
					m.FinishReason.Type != "length" || m.FinishReason.Length != 2 {
					t.Fatalf("%+v", g)
				}
			}},
		{name: "generate text batch", path: "/generate",
			body: `{"text":["abcd","abcdefgh","a"],"sampling_params":{"max_new_tokens":1}}`,
			check: func(t *testing.T, r response) {
				var gs []genResult
				r.json(t, &gs)
				if len(gs) != 3 || gs[0].MetaInfo.PromptTokens != 1 || gs[1].MetaInfo.PromptTokens != 2 || gs[2].Text != "tok0" {
					t.Fatalf("%+v", gs)
				}
			}},
		{name: "generate input_ids batch with per-item params", path: "/generate",
			body: `{"input_ids":[[1,2,3],[4]],"sampling_params":[{"max_new_tokens":1},{"max_new_tokens":3}]}`,
			check: func(t *testing.T, r response) {
				var gs []genResult
				r.json(t, &gs)
				if len(gs) != 2 || gs[0].MetaInfo.PromptTokens != 3 || gs[0].Text != "tok0" ||
					gs[1].MetaInfo.PromptTokens != 1 || gs[1].Text != "tok0 tok1 tok2" {
					t.Fatalf("%+v", gs)
				}
			}},
		{name: "generate single input_ids default length", path: "/generate", body: `{"input_ids":[1,2,3,4,5]}`,
			check: func(t *testing.T, r response) {
				var g genResult
				r.json(t, &g)
				if g.MetaInfo.PromptTokens != 5 || g.MetaInfo.CompletionTokens != defaultMaxNewTokens {
					t.Fatalf("%+v", g)
				}
			}},
		{name: "chat n=2", path: "/v1/chat/completions",
			body: `{"model":"m1","messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efgh"}]}],"n":2,"max_completion_tokens":2}`,
			check: func(t *testing.T, r response) {
				var o openAI
				r.json(t, &o)
				if o.Object != "chat.completion" || o.Model != "m1" || o.ID == "" || o.Created == 0 || len(o.Choices) != 2 {
					t.Fatalf("%+v", o)
				}
				for i, c := range o.Choices {
					if c.Index != i || c.Message.Role != "assistant" || c.Message.Content != "tok0 tok1" || c.FinishReason != "length" {
						t.Fatalf("choice %d: %+v", i, c)
					}
				}
				if o.Usage.PromptTokens != 2 || o.Usage.CompletionTokens != 4 || o.Usage.TotalTokens != 6 {
					t.Fatalf("usage %+v", o.Usage)
				}
			}},
		{name: "completions prompt list", path: "/v1/completions", body: `{"prompt":["abcd","abcdefgh"],"max_tokens":1}`,
			check: func(t *testing.T, r response) {
				var o openAI
				r.json(t, &o)
				if o.Object != "text_completion" || len(o.Choices) != 2 || o.Choices[1].Index != 1 || o.Choices[1].Text != "tok0" {
					t.Fatalf("%+v", o)
				}
				if o.Usage.PromptTokens != 3 || o.Usage.CompletionTokens != 2 {
					t.Fatalf("usage %+v", o.Usage)
				}
			}},
		{name: "completions default model and max_tokens", path: "/v1/completions", body: `{"prompt":[1,2,3]}`,
			check: func(t *testing.T, r response) {
				var o openAI
				r.json(t, &o)
				if o.Model != "sim-model" || o.Usage.PromptTokens != 3 || o.Usage.CompletionTokens != defaultMaxNewTokens {
					t.Fatalf("%+v", o)
				}
			}},
		{name: "responses", path: "/v1/responses", body: `{"input":"abcd","max_output_tokens":2}`,
			check: func(t *testing.T, r response) {
				var o struct {
					Object string `json:"object"`
					Status string `json:"status"`
					Output []struct {
						Type    string `json:"type"`
						Role    string `json:"role"`
						Content []struct {
							Type string `json:"type"`
							Text string `json:"text"`
						} `json:"content"`
					} `json:"output"`
					Usage struct {
						InputTokens  int `json:"input_tokens"`
						OutputTokens int `json:"output_tokens"`
					} `json:"usage"`
				}
				r.json(t, &o)
				if o.Object != "response" || o.Status != "completed" || len(o.Output) != 1 || o.Output[0].Type != "message" ||
					o.Output[0].Content[0].Text != "tok0 tok1" || o.Usage.InputTokens != 1 || o.Usage.OutputTokens != 2 {
					t.Fatalf("%+v", o)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, ts.api.URL+tc.path, tc.body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if r.header.Get("X-Sim-Mode") != "null" || r.header.Get("X-Sim-Server") == "" || r.header.Get("X-Sim-DP-Rank") == "" {
				t.Fatalf("missing observability headers: %v", r.header)
			}
			tc.check(t, r)
		})
	}
}

func TestValidationErrors(t *testing.T) {
	ts := startTest(t, Config{Mode: ModeNull})
	tests := []struct {
		name, path, body, want string
	}{
		{"generate without input", "/generate", `{"sampling_params":{}}`,
			`{"error":{"message":"Either text, input_ids or input_embeds should be provided."}}`},
		{"generate with both", "/generate", `{"text":"a","input_ids":[1]}`,
			`{"error":{"message":"Either text or input_ids should be provided."}}`},
		{"chat without messages", "/v1/chat/completions", `{"model":"x"}`, `"type":"BadRequestError"`},
		{"negative max_tokens", "/v1/completions", `{"prompt":"a","max_tokens":-1}`, "max_tokens must be non-negative"},
		{"non-object body", "/v1/completions", `[1,2]`, "must be a JSON object"},
		{"string routed_dp_rank", "/generate", `{"text":"a","routed_dp_rank":"1"}`, "routed_dp_rank: Input should be a valid integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, ts.api.URL+tc.path, tc.body)
			if r.status != 400 || !strings.Contains(string(r.body), tc.want) {
				t.Fatalf("got %d %s, want 400 with %s", r.status, r.body, tc.want)
			}
		})
	}
}
