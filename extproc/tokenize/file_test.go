package tokenize

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// byteVocab is a vocab entry for every byte, as byte-level files have.
func byteVocab() string {
	var b strings.Builder
	for c := range 256 {
		if c > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(string(byteChars[c])) + `":` + strconv.Itoa(c))
	}
	return b.String()
}

// TestParseRefuses: what the package cannot reproduce is refused with the
// construct named, never approximated.
func TestParseRefuses(t *testing.T) {
	byteLevel := `{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}`
	model := `{"type":"BPE","vocab":{` + byteVocab() + `},"merges":[]}`
	for _, tc := range []struct {
		name, file, want string
	}{
		{"ok", `{"pre_tokenizer":` + byteLevel + `,"model":` + model + `}`, ""},
		{"metaspace", `{"pre_tokenizer":{"type":"Metaspace"},"model":` + model + `}`, `type "Metaspace"`},
		{"no byte level", `{"pre_tokenizer":null,"model":` + model + `}`, "no ByteLevel pre-tokenizer"},
		{"prefix space", `{"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":true},"model":` + model + `}`, "add_prefix_space"},
		{"wordpiece", `{"pre_tokenizer":` + byteLevel + `,"model":{"type":"WordPiece","vocab":{"a":0}}}`, `type "WordPiece"`},
		{"dropout", `{"pre_tokenizer":` + byteLevel + `,"model":{"type":"BPE","dropout":0.1,"vocab":{"a":0}}}`, "dropout"},
		{"lstrip", `{"added_tokens":[{"id":300,"content":"<x>","lstrip":true}],"pre_tokenizer":` + byteLevel + `,"model":` + model + `}`, "lstrip"},
		{"missing byte", `{"pre_tokenizer":` + byteLevel + `,"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, "no token for byte 0x00"},
		{"lowercase", `{"normalizer":{"type":"Lowercase"},"pre_tokenizer":` + byteLevel + `,"model":` + model + `}`, `type "Lowercase"`},
		{"split merged with previous", `{"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"a"},"behavior":"MergedWithPrevious"},` + byteLevel + `]},"model":` + model + `}`, "MergedWithPrevious"},
		{"not json", `{"model":`, "not a tokenizer.json"},
		{"tokenizer_config.json", `{"tokenizer_class":"Qwen2Tokenizer","chat_template":"{{ messages }}","added_tokens_decoder":{}}`, "looks like tokenizer_config.json"},
	} {
		_, err := Parse([]byte(tc.file))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error naming %q", tc.name, err, tc.want)
		case tc.want != "" && tc.name != "not json" && tc.name != "missing byte" && tc.name != "tokenizer_config.json" && !errors.Is(err, errUnsupported) && tc.name != "no byte level":
			t.Errorf("%s: %v is not marked unsupported", tc.name, err)
		}
	}
}

// TestAddedVocabFind: leftmost-longest, with one first byte (IndexByte)
// and with several.
func TestAddedVocabFind(t *testing.T) {
	for _, specs := range [][]addedTokenSpec{
		{{ID: 1, Content: "<a>"}, {ID: 2, Content: "<a><b>"}, {ID: 3, Content: "<b>"}},
		{{ID: 1, Content: "<a>"}, {ID: 2, Content: "<a><b>"}, {ID: 3, Content: "<b>"}, {ID: 4, Content: "[c]"}},
	} {
		v := buildAddedVocab(specs)
		type hit struct{ start, end, id int }
		var got []hit
		s := "x<a><b>y<b>z[c]<a"
		for from := 0; ; {
			start, end, id := v.find(s, from)
			if start < 0 {
				break
			}
			got = append(got, hit{start, end, int(id)})
			from = end
		}
		want := []hit{{1, 7, 2}, {8, 11, 3}}
		if len(specs) == 4 {
			want = append(want, hit{12, 15, 4})
		}
		if len(got) != len(want) {
			t.Fatalf("%d tokens: got %v, want %v", len(specs), got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%d tokens: got %v, want %v", len(specs), got, want)
			}
		}
	}
}

// TestByteLevelAlphabet: every byte's character maps back to it, and no
// other character below 512 does.
func TestByteLevelAlphabet(t *testing.T) {
	seen := map[rune]bool{}
	for b, c := range byteChars {
		if got, ok := charByte(c); !ok || got != byte(b) {
			t.Errorf("byte %#x: character %q maps back to %#x, %v", b, c, got, ok)
		}
		seen[c] = true
	}
	for r := rune(-1); r < 600; r++ {
		if _, ok := charByte(r); ok != seen[r] {
			t.Errorf("character %q: in the alphabet %v, want %v", r, ok, seen[r])
		}
	}
}

// TestLoadModelSwappedFiles: a tokenizer_config.json given as the tokenizer
// file, or a tokenizer.json as the config file, is refused with both keys
// named and which file each wants, and a full swap is called one (issue
// 37); not a pre-tokenizer the package does not support.
func TestLoadModelSwappedFiles(t *testing.T) {
	dir := t.TempDir()
	tokJSON := filepath.Join(dir, "tokenizer.json")
	cfgJSON := filepath.Join(dir, "tokenizer_config.json")
	files := map[string]string{
		tokJSON: `{"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":false},"model":{"type":"BPE","vocab":{` + byteVocab() + `},"merges":[]}}`,
		cfgJSON: `{"tokenizer_class":"Qwen2Tokenizer","added_tokens_decoder":{"151643":{"content":"<|endoftext|>","special":true}},` +
			`"chat_template":"{% for m in messages %}{{ m.content }}{% endfor %}","eos_token":"<|endoftext|>"}`,
	}
	for path, text := range files {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wantsFile := "tokenizer.file wants tokenizer.json (the vocabulary and merges) and tokenizer.config wants tokenizer_config.json"
	for _, tc := range []struct {
		name, file, config string
		want               string // the whole message; "" loads
	}{
		{name: "right", file: tokJSON, config: cfgJSON},
		{name: "config as file", file: cfgJSON, config: cfgJSON,
			want: "tokenizer.file: " + cfgJSON + " looks like tokenizer_config.json (the chat template and special tokens); " + wantsFile},
		{name: "swapped", file: cfgJSON, config: tokJSON,
			want: "tokenizer.file: " + cfgJSON + " looks like tokenizer_config.json (the chat template and special tokens); " + wantsFile +
				"; tokenizer.config names " + tokJSON + ", which looks like tokenizer.json: the two are swapped"},
		{name: "file as config", file: tokJSON, config: tokJSON,
			want: "tokenizer.config: " + tokJSON + " looks like tokenizer.json (the vocabulary and merges); " +
				"tokenizer.config wants tokenizer_config.json (the chat template and special tokens) and tokenizer.file wants tokenizer.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadModel(tc.file, tc.config, "")
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("LoadModel(%s, %s) = %v\nwant %s", filepath.Base(tc.file), filepath.Base(tc.config), err, tc.want)
			}
		})
	}
}
