package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/scheduler"
)

// qwen3Dir is the Qwen3 tokenizer fixture (make tokenizers).
func qwen3Dir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("DUET_TOKENIZERS_DIR")
	if root == "" {
		t.Skip("DUET_TOKENIZERS_DIR is not set: run through make (make unit, make test), which installs the tokenizer fixtures")
	}
	return filepath.Join(root, "qwen3")
}

// TestTokenizeCommand: `duet tokenize` prints the ids duet routes on and
// their page blocks, as text and as JSON.
func TestTokenizeCommand(t *testing.T) {
	dir := qwen3Dir(t)
	cfg := writeConfig(t, "decode: [{url: \"http://10.0.0.2:30000\"}]\ntokenizer: {file: "+dir+"/tokenizer.json, config: "+dir+"/tokenizer_config.json, page_size: 8}\n")
	body := `{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Explain prefill and decode disaggregation, please."}]}`

	var out, errOut bytes.Buffer
	if err := runTokenize([]string{"-config", cfg, "-json"}, strings.NewReader(body), &out, &errOut); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	var got tokenizeOutput
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := loadTokenizer(c.Tokenizer)
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := extproc.PromptTokens(m, extproc.RouteChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.IDs, want) || got.Tokens != len(want) {
		t.Fatalf("ids %v, want %v", got.IDs, want)
	}
	if got.PageSize != 8 || got.BlockTokens != 16 || len(got.Blocks) != len(want)/16 {
		t.Errorf("page size %d, blocks of %d, %d blocks: want 8, 16 and %d", got.PageSize, got.BlockTokens, len(got.Blocks), len(want)/16)
	}
	if !strings.HasPrefix(got.Rendered, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>") || got.Blocks[0].Text != m.Tokenizer.Decode(want[:16]) {
		t.Errorf("rendered %q, first block %q", got.Rendered, got.Blocks[0].Text)
	}

	out.Reset()
	if err := runTokenize([]string{"-config", cfg}, strings.NewReader(`{"prompt":"Hello world, hello tokens."}`), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if text := out.String(); !strings.Contains(text, "route completions") || !strings.Contains(text, "tail  [0,") {
		t.Errorf("text output:\n%s", text)
	}

	for _, bad := range []struct {
		args       []string
		body, want string
	}{
		{[]string{"-config", cfg}, `{"model":"m"}`, "no messages, prompt, text or input_ids"},
		{[]string{"-config", cfg, "-pool", "other"}, `{"prompt":"x"}`, `no pool is named "other"`},
		{[]string{"-config", cfg, "-path", "/v1/embeddings"}, `{"prompt":"x"}`, "-path /v1/embeddings"},
		{[]string{"-config", cfg}, `{"messages":[{"role":"wizard","content":"x"}]}`, "unknown role"},
	} {
		err := runTokenize(bad.args, strings.NewReader(bad.body), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v %s: got %v, want %q", bad.args, bad.body, err, bad.want)
		}
	}
}

// TestTokenizerFailsStart: a missing or corrupt tokenizer file stops
// duet's start with the file's name and the reason.
func TestTokenizerFailsStart(t *testing.T) {
	dir := qwen3Dir(t)
	tmp := t.TempDir()
	corrupt := filepath.Join(tmp, "tokenizer.json")
	if err := os.WriteFile(corrupt, []byte(`{"model": {"type": "BPE", "vocab": `), 0o644); err != nil {
		t.Fatal(err)
	}
	wordPiece := filepath.Join(tmp, "wordpiece.json")
	if err := os.WriteFile(wordPiece, []byte(`{"normalizer":null,"pre_tokenizer":{"type":"BertPreTokenizer"},"model":{"type":"WordPiece","vocab":{"a":0}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, config, want string }{
		{filepath.Join(tmp, "missing.json"), dir + "/tokenizer_config.json", "missing.json: open"},
		{corrupt, dir + "/tokenizer_config.json", corrupt + ": not a tokenizer.json: unexpected end of JSON input"},
		{wordPiece, dir + "/tokenizer_config.json", `wordpiece.json: pre_tokenizer: type "BertPreTokenizer": not supported`},
		{dir + "/tokenizer.json", filepath.Join(tmp, "no_config.json"), "no_config.json: open"},
	} {
		cfg, err := config.Parse([]byte("decode: [{url: \"http://10.0.0.2:30000\"}]\ntokenizer: {file: " + tc.file + ", config: " + tc.config + "}\n"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = newPools(cfg, scheduler.Config{}, zap.NewNop(), prometheus.NewRegistry())
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "pool default") {
			t.Errorf("got %v, want an error naming the pool and %q", err, tc.want)
		}
	}
}
