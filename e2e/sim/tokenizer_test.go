package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/scheduler/prefix"
)

// tokenizerDir returns a fixture tokenizer directory, or skips.
func tokenizerDir(t *testing.T, name string) string {
	t.Helper()
	root := os.Getenv("DUET_TOKENIZERS_DIR")
	if root == "" {
		t.Skip("DUET_TOKENIZERS_DIR is not set: run through make (make unit, make test), which installs the tokenizer fixtures")
	}
	return filepath.Join(root, name)
}

// TestTokenizedPromptsOverZMQ: with a tokenizer, chat, completions and
// /generate text prompts are keyed by the token ids duet computes for
// them (extproc.PromptTokens), count those tokens, and their blocks are
// published with their ids: a RankView fed the events matches each
// conversation's next turn, keyed by duet, as far as the cache holds it.
func TestTokenizedPromptsOverZMQ(t *testing.T) {
	dir := tokenizerDir(t, "qwen3")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := startKVSim(t, Config{Profile: "dense-8b-h100", DPSize: 1, TimeScale: 20, Tokenizer: dir}, 1000)
	feeds := k.subscribe(t, ctx)
	k.settle(t, feeds)
	tok, err := loadTokenizer(dir)
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	get(t, k.url+"/server_info").json(t, &info)
	if info["tokenizer_path"] != dir {
		t.Fatalf("tokenizer_path %v", info["tokenizer_path"])
	}
	long := ""
	for i := range 60 {
		long += fmt.Sprintf("Paragraph %d of the shared system prompt, long enough to fill pages. ", i)
	}
	type turn struct {
		route extproc.Route
		path  string
		body  map[string]any
	}
	var turns []turn
	for c := range 3 {
		msgs := []map[string]any{{"role": "system", "content": long}, {"role": "user", "content": fmt.Sprintf("question %d", c)}}
		turns = append(turns, turn{extproc.RouteChat, "/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 3}})
	}
	turns = append(turns,
		turn{extproc.RouteCompletions, "/v1/completions", map[string]any{"model": "m", "prompt": long + " completion", "max_tokens": 2}},
		turn{extproc.RouteGenerate, "/generate", map[string]any{"text": long + " generate", "sampling_params": map[string]any{"max_new_tokens": 2}}})
	hasher := prefix.Hasher{BlockTokens: 16, MaxBlocks: 1 << 20}
	for i, tc := range turns {
		raw, _ := json.Marshal(tc.body)
		ids, _, err := extproc.PromptTokens(tok, tc.route, raw)
		if err != nil {
			t.Fatal(err)
		}
		r := post(t, k.url+tc.path, string(raw))
		if r.status != 200 {
			t.Fatalf("turn %d: %d %s", i, r.status, r.body)
		}
		var usage struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			}
			MetaInfo struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"meta_info"`
		}
		r.json(t, &usage)
		if got := max(usage.Usage.PromptTokens, usage.MetaInfo.PromptTokens); got != len(ids) {
			t.Fatalf("turn %d: %d prompt tokens, duet computes %d", i, got, len(ids))
		}
		want := (len(ids) / 16) * 16
		deadline := time.Now().Add(5 * time.Second)
		for {
			gpu, _ := feeds[0].view.Match(hasher.Tokens(ids, nil), 0)
			if gpu*16 == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("turn %d: the view holds %d of its %d tokens' blocks", i, gpu*16, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if st := k.srv.KVEventStats()[0]; st.Unpublished != 0 {
		t.Fatalf("stats %+v: tokenized blocks left out", st)
	}
}

// TestTokenizerConfigErrors: a missing tokenizer directory fails New.
func TestTokenizerConfigErrors(t *testing.T) {
	_, err := New(Config{Profile: "dense-8b-h100", Tokenizer: t.TempDir()}, nil)
	if err == nil {
		t.Fatal("a directory without tokenizer.json accepted")
	}
}
