package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// families are the tokenizer fixtures `make tokenizers` installs.
var families = []string{"qwen3", "llama3_1", "deepseek_v3"}

// fixtureDir is a family's fixture directory; the test is skipped when the
// fixtures are not installed (`make unit` and `make test` install them).
func fixtureDir(t testing.TB, family string) string {
	t.Helper()
	root := os.Getenv("DUET_TOKENIZERS_DIR")
	if root == "" {
		t.Skip("DUET_TOKENIZERS_DIR is not set: run through make (make unit, make test), which installs the tokenizer fixtures")
	}
	dir := filepath.Join(root, family)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatalf("fixture %s: %v (make tokenizers installs it)", family, err)
	}
	return dir
}

// loaded caches the fixtures' tokenizers across tests.
var loaded sync.Map // family -> *Model

// loadModel loads a family's tokenizer and chat template once.
func loadModel(t testing.TB, family string) *Model {
	t.Helper()
	dir := fixtureDir(t, family)
	if m, ok := loaded.Load(family); ok {
		return m.(*Model)
	}
	m, err := LoadModel(filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json"), "")
	if err != nil {
		t.Fatal(err)
	}
	loaded.Store(family, m)
	return m
}

// goldenCase is one request to testdata/golden.py.
type goldenCase struct {
	Kind                string          `json:"kind"`
	Name                string          `json:"-"`
	Text                string          `json:"text"`
	AddSpecial          bool            `json:"add_special,omitempty"`
	Messages            json.RawMessage `json:"messages,omitempty"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Kwargs              json.RawMessage `json:"kwargs,omitempty"`
}

// goldenResult is the reference's answer to one case.
type goldenResult struct {
	IDs   []int64 `json:"ids"`
	Text  *string `json:"text"`
	Error string  `json:"error"`
}

// golden asks the reference implementation (Hugging Face's tokenizers and
// transformers in the project's venv) for the cases' ids.
func golden(t testing.TB, family string, cases []goldenCase) []goldenResult {
	t.Helper()
	python := os.Getenv("DUET_PYTHON")
	if python == "" {
		t.Skip("DUET_PYTHON is not set: run through make (make unit, make test)")
	}
	in, err := json.Marshal(map[string]any{"dir": fixtureDir(t, family), "cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "testdata/golden.py")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("golden.py: %v\n%s", err, stderr.String())
	}
	var res []goldenResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("golden.py output: %v", err)
	}
	if len(res) != len(cases) {
		t.Fatalf("golden.py answered %d cases of %d", len(res), len(cases))
	}
	return res
}

// firstDiff describes where two id lists first differ, or "".
func firstDiff(got, want []int64) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			lo, hi := max(i-3, 0), i+4
			return fmt.Sprintf("first difference at position %d: got %v, want %v (of %d and %d ids)",
				i, got[lo:min(hi, len(got))], want[lo:min(hi, len(want))], len(got), len(want))
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("got %d ids, want %d (equal up to the shorter)", len(got), len(want))
	}
	return ""
}

// commonPrefix is the length of the common prefix of a and b.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// clip is s around byte at, for messages.
func clip(s string, at int) string {
	lo, hi := max(at-60, 0), min(at+120, len(s))
	return s[lo:hi]
}
