package bench

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/extproc/tokenize"
)

// The vocabulary is distinct three-letter lowercase words.
func TestTokenWordList(t *testing.T) {
	words := tokenWordList()
	if len(words) < 1000 {
		t.Fatalf("%d words", len(words))
	}
	seen := map[string]bool{}
	for _, w := range words {
		if len(w) != 3 || seen[w] {
			t.Fatalf("word %q: not three letters, or twice", w)
		}
		for _, c := range w {
			if c < 'a' || c > 'z' {
				t.Fatalf("word %q: not lowercase letters", w)
			}
		}
		seen[w] = true
	}
	rng := rand.New(rand.NewPCG(1, 2))
	if got := tokenText(rng, words, 250); len(got) != 250*charsPerToken {
		t.Fatalf("%d characters for 250 tokens", len(got))
	}
}

// Every word of the vocabulary is one token after a space for each
// tokenizer family `make tokenizers` installs, and a multi-tenant request,
// rendered by the family's chat template as duet and duet-sim
// (--tokenizer-path) render it, is its planned tokens plus the template's
// few: the workload's sizes hold for engines that tokenize.
func TestTokenTextIsOneTokenPerWord(t *testing.T) {
	root := os.Getenv("DUET_TOKENIZERS_DIR")
	if root == "" {
		t.Skip("DUET_TOKENIZERS_DIR is not set: run through make (make test), which installs the tokenizer fixtures")
	}
	w, err := Generate(WorkloadMultiTenant, 1, 5*time.Second, 1, Params{})
	if err != nil || len(w.Sessions) == 0 {
		t.Fatalf("workload: %v, %d sessions", err, len(w.Sessions))
	}
	s := w.Sessions[0]
	body, err := ChatRequest{Model: "m", MaxTokens: 8, Messages: []Message{{Role: "system", Content: s.System}, {Role: "user", Content: s.Turns[0].User}}}.Body()
	if err != nil {
		t.Fatal(err)
	}
	for _, family := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		t.Run(family, func(t *testing.T) {
			dir := filepath.Join(root, family)
			m, err := tokenize.LoadModel(filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json"), "")
			if err != nil {
				t.Fatal(err)
			}
			// EncodeText adds the BOS a Llama-class tokenizer asks for: count
			// the word's own tokens after a word and a space.
			base := len(m.EncodeText(nil, "the"))
			for _, word := range tokenWordList() {
				if n := len(m.EncodeText(nil, "the "+word)) - base; n != 1 {
					t.Fatalf("%q is %d tokens", " "+word, n)
				}
			}
			ids, _, err := extproc.PromptTokens(m, extproc.RouteChat, body)
			if err != nil {
				t.Fatal(err)
			}
			if planned := s.Turns[0].PromptTokens; len(ids) < planned || len(ids) > planned+40 {
				t.Fatalf("%d token ids for a prompt planned at %d tokens", len(ids), planned)
			}
		})
	}
}
