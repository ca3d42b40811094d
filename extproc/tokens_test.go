package extproc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/duet-router/duet/extproc/tokenize"
)

// qwen3 loads the Qwen3 tokenizer fixture (make tokenizers), with
// chatTemplate (a file's contents) in place of its own when set.
func qwen3(t testing.TB, chatTemplate string) *tokenize.Model {
	t.Helper()
	root := os.Getenv("DUET_TOKENIZERS_DIR")
	if root == "" {
		t.Skip("DUET_TOKENIZERS_DIR is not set: run through make (make unit, make test), which installs the tokenizer fixtures")
	}
	dir := filepath.Join(root, "qwen3")
	var tmpl string
	if chatTemplate != "" {
		tmpl = filepath.Join(t.TempDir(), "chat_template.jinja")
		if err := os.WriteFile(tmpl, []byte(chatTemplate), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := tokenize.LoadModel(filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json"), tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTokenizedRouting: a pool with a tokenizer hands the picker the
// prompt's token ids for chat, completions and generate; ids the client
// sent stay as sent; bodies SGLang refuses get a 400 in OpenAI's shape; a
// template that fails leaves the request to the text estimate.
func TestTokenizedRouting(t *testing.T) {
	m := qwen3(t, "")
	failing := qwen3(t, "{{ raise_exception('this template refuses everything') }}")
	chat := []byte(`{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello, 你好!"}]}`)
	wantChat, _, err := PromptTokens(m, RouteChat, chat)
	if err != nil {
		t.Fatal(err)
	}
	rendered := "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello, 你好!<|im_end|>\n<|im_start|>assistant\n"
	if got := m.Tokenizer.Decode(wantChat); got != rendered {
		t.Fatalf("chat ids decode to %q, want %q", got, rendered)
	}
	for _, tt := range []struct {
		name    string
		model   *tokenize.Model
		path    string
		body    string
		want    []int64 // nil: no ids (the text estimate)
		status  int     // an immediate response's status, or 0
		outcome string
	}{
		{name: "chat", model: m, path: "/v1/chat/completions", body: string(chat), want: wantChat, outcome: tokenizeOK},
		{name: "completions", model: m, path: "/v1/completions", body: `{"model":"m","prompt":"Hello world"}`, want: m.EncodeText(nil, "Hello world"), outcome: tokenizeOK},
		{name: "completions batch", model: m, path: "/v1/completions", body: `{"model":"m","prompt":["first one","second"]}`, want: m.EncodeText(nil, "first one"), outcome: tokenizeOK},
		{name: "generate text", model: m, path: "/generate", body: `{"text":"Hello world","sampling_params":{"max_new_tokens":4}}`, want: m.EncodeText(nil, "Hello world"), outcome: tokenizeOK},
		{name: "generate ids", model: m, path: "/generate", body: `{"input_ids":[1,2,3,4],"sampling_params":{"max_new_tokens":4}}`, want: []int64{1, 2, 3, 4}, outcome: tokenizeGiven},
		{name: "unknown role", model: m, path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"wizard","content":"hi"}]}`, status: 400, outcome: tokenizeRejected},
		{name: "content of the wrong type", model: m, path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":{"a":1}}]}`, status: 400, outcome: tokenizeRejected},
		{name: "template fails", model: failing, path: "/v1/chat/completions", body: string(chat), want: nil, outcome: tokenizeFallback},
		{name: "responses", model: m, path: "/v1/responses", body: `{"model":"m","input":"hi"}`, want: nil, outcome: tokenizeSkipped},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &fakePicker{decision: pdPick}
			metrics := NewMetrics(prometheus.NewRegistry())
			core, logs := observer.New(zap.WarnLevel)
			c := clientFor(t, Options{Pools: []Pool{{Name: "qwen", Picker: p, PrefillCluster: "duet_prefill", Tokenizer: tt.model}},
				MaxBodyBytes: 1 << 20, Metrics: metrics, Logger: zap.New(core)})
			resp := exchange(t, c, "POST", tt.path, map[string]string{"content-type": "application/json"}, []byte(tt.body))
			if got := testutil.ToFloat64(metrics.tokenize.WithLabelValues("qwen", tt.outcome)); got != 1 {
				t.Errorf("duet_tokenize_requests_total{outcome=%q} = %v, want 1", tt.outcome, got)
			}
			if tt.status != 0 {
				ir := resp.GetImmediateResponse()
				if ir == nil || int(ir.GetStatus().GetCode()) != tt.status {
					t.Fatalf("got %v, want an immediate %d", resp, tt.status)
				}
				var e struct {
					Error struct{ Message, Type string }
				}
				if err := json.Unmarshal(ir.GetBody(), &e); err != nil || !strings.Contains(e.Error.Message, "invalid chat messages") {
					t.Errorf("body %s: want OpenAI's error object naming the invalid messages (%v)", ir.GetBody(), err)
				}
				return
			}
			req := p.last.Load()
			if req == nil {
				t.Fatalf("not routed: %v", resp)
			}
			if !slices.Equal(req.TokenIDs, tt.want) {
				t.Errorf("picker got ids %v, want %v", req.TokenIDs, tt.want)
			}
			// docs/troubleshooting.md quotes the fallback's warning.
			warned := logs.FilterMessage("chat template failed; routing by the text estimate").Len() == 1
			if warned != (tt.outcome == tokenizeFallback) {
				t.Errorf("fallback warning logged: %v, want %v", warned, tt.outcome == tokenizeFallback)
			}
		})
	}
}

// BenchmarkPromptPath is what the request path spends on a chat body's
// prompt before the pick: without a tokenizer, parsing and the text form
// (Describe; the scheduler then hashes text blocks); with one, also the
// chat template and the token ids (PromptTokens, which parses as well),
// for a new prompt and for the next turn of a conversation whose history
// was seen. go test ./extproc -run X -bench PromptPath -count 6, then
// benchstat -col /variant.
func BenchmarkPromptPath(b *testing.B) {
	m := qwen3(b, "")
	for _, size := range []int{1 << 10, 32 << 10, 256 << 10} {
		body := multiTurnChat(size)
		turns := make([][]byte, 64)
		for i := range turns {
			turns[i] = []byte(strings.Replace(string(body), `"Next question?"`, fmt.Sprintf(`"Next question %d?"`, i), 1))
		}
		b.Run(fmt.Sprintf("%dKiB/text", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := Describe(RouteChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
		// A fresh model per variant: its caches start empty.
		fresh := qwen3(b, "")
		fresh.Tokenizer.SetPieceCacheBytes(0)
		if _, _, err := PromptTokens(fresh, RouteChat, body); err != nil { // the word cache warm
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%dKiB/tokens-new", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, _, err := PromptTokens(fresh, RouteChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
		if _, _, err := PromptTokens(m, RouteChat, body); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%dKiB/tokens-seen-history", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			i := 0
			for b.Loop() {
				nb := turns[i%len(turns)]
				i++
				if _, _, err := PromptTokens(m, RouteChat, nb); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// multiTurnChat is a chat body of about size bytes: turns of about 1.5 KiB
// of prose and code, ending with a short user question.
func multiTurnChat(size int) []byte {
	msgs := []map[string]string{{"role": "system", "content": "You are a helpful assistant."}}
	para := "The scheduler picks a prefill and a decode rank for each request; ranks that hold the prefix win unless they are loaded.\n```go\nfunc pick(r *Request) Target {\n\treturn best(r)\n}\n```\n"
	total := 0
	for i := 0; total < size; i++ {
		role := map[bool]string{true: "user", false: "assistant"}[i%2 == 0]
		text := fmt.Sprintf("Turn %d. ", i) + strings.Repeat(para, 1500/len(para)+1)[:1500]
		msgs = append(msgs, map[string]string{"role": role, "content": text})
		total += len(text) + 40
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": "Next question?"})
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}
