package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTokenizerSection: the tokenizer section per pool and at the top
// level, its errors, relative paths and block size.
func TestTokenizerSection(t *testing.T) {
	for _, tt := range []struct {
		name    string
		yaml    string
		wantErr string
	}{
		{name: "top level", yaml: "decode: [{url: \"http://10.0.0.2:30000\"}]\ntokenizer: {file: /m/tokenizer.json, config: /m/tokenizer_config.json, page_size: 64}\n"},
		{name: "no file", yaml: "decode: [{url: \"http://10.0.0.2:30000\"}]\ntokenizer: {config: /m/tokenizer_config.json}\n", wantErr: "tokenizer.file"},
		{name: "no config", yaml: "decode: [{url: \"http://10.0.0.2:30000\"}]\ntokenizer: {file: /m/tokenizer.json}\n", wantErr: "tokenizer.config"},
		{name: "negative page size", yaml: "decode: [{url: \"http://10.0.0.2:30000\"}]\ntokenizer: {file: a, config: b, page_size: -1}\n", wantErr: "tokenizer.page_size"},
		{name: "top level with pools", yaml: "tokenizer: {file: a, config: b}\npools: [{name: q, models: [q], decode: [{url: \"http://10.0.0.2:30000\"}]}]\n", wantErr: "pools[].tokenizer"},
		{name: "pool", yaml: "pools: [{name: q, models: [q], decode: [{url: \"http://10.0.0.2:30000\"}], tokenizer: {file: a}}]\n", wantErr: "pools[0].tokenizer.config"},
		{name: "unknown key", yaml: "decode: [{url: \"http://10.0.0.2:30000\"}]\ntokenizer: {file: a, config: b, vocab: c}\n", wantErr: "vocab"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatal(err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("got %v, want an error naming %s", err, tt.wantErr)
			}
		})
	}
}

// TestTokenizerPathsAndBlocks: relative paths are relative to the file;
// blocks are whole pages of at least prefix.block_tokens.
func TestTokenizerPathsAndBlocks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "duet.yaml")
	yaml := "decode: [{url: \"http://10.0.0.2:30000\"}]\ntokenizer: {file: model/tokenizer.json, config: /abs/tokenizer_config.json}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	tok := cfg.PoolList()[0].Tokenizer
	if tok == nil || tok.File != filepath.Join(dir, "model/tokenizer.json") || tok.Config != "/abs/tokenizer_config.json" {
		t.Fatalf("tokenizer %+v: want the relative file under %s", tok, dir)
	}
	for _, tc := range []struct{ page, blockTokens, want int }{
		{0, 0, 16}, {1, 0, 16}, {16, 0, 16}, {64, 0, 64}, {5, 16, 20}, {1, 32, 32}, {32, 48, 64},
	} {
		if got := (&Tokenizer{PageSize: tc.page}).BlockTokens(tc.blockTokens); got != tc.want {
			t.Errorf("page %d, block_tokens %d: %d, want %d", tc.page, tc.blockTokens, got, tc.want)
		}
	}
}
