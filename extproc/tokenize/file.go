package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
)

// tokenizerFile is the part of a Hugging Face tokenizer.json that duet
// reads. Fields it does not model are kept raw so that Load can refuse
// what it cannot reproduce.
type tokenizerFile struct {
	AddedTokens   []addedTokenSpec `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Model         modelSpec        `json:"model"`
	// Keys of a tokenizer_config.json, never of a tokenizer.json: read to
	// tell a config file given in the tokenizer file's place.
	TokenizerClass     json.RawMessage `json:"tokenizer_class"`
	ChatTemplate       json.RawMessage `json:"chat_template"`
	AddedTokensDecoder json.RawMessage `json:"added_tokens_decoder"`
}

// looksLikeConfig reports a tokenizer_config.json: no model section, and
// a key that only a tokenizer_config.json has.
func (f *tokenizerFile) looksLikeConfig() bool {
	noModel := f.Model.Type == "" && f.Model.Vocab == nil && f.Model.Merges == nil
	return noModel && (!isNull(f.TokenizerClass) || !isNull(f.ChatTemplate) || !isNull(f.AddedTokensDecoder))
}

// addedTokenSpec is one entry of added_tokens.
type addedTokenSpec struct {
	ID         int64  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// modelSpec is the model section; only BPE is supported.
type modelSpec struct {
	Type                    string           `json:"type"`
	Dropout                 *float64         `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Vocab                   map[string]int64 `json:"vocab"`
	Merges                  []mergeSpec      `json:"merges"`
}

// mergeSpec is one merge rule, written either as "left right" (older
// files) or as ["left", "right"].
type mergeSpec [2]string

// UnmarshalJSON reads both forms of a merge rule.
func (m *mergeSpec) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		left, right, ok := strings.Cut(s, " ")
		if !ok {
			return fmt.Errorf("merge %q has no space between its two parts", s)
		}
		m[0], m[1] = left, right
		return nil
	}
	var pair []string
	if err := json.Unmarshal(b, &pair); err != nil {
		return err
	}
	if len(pair) != 2 {
		return fmt.Errorf("merge %v does not have two parts", pair)
	}
	m[0], m[1] = pair[0], pair[1]
	return nil
}

// Load reads a Hugging Face tokenizer.json and builds its tokenizer. An
// unreadable file, malformed JSON or a construct the package cannot
// reproduce exactly is an error naming the file and the reason.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	return t, nil
}

// Parse builds a tokenizer from the contents of a tokenizer.json.
func Parse(data []byte) (*Tokenizer, error) {
	var f tokenizerFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	if f.looksLikeConfig() {
		return nil, errConfigFile
	}
	t := &Tokenizer{}
	var err error
	if t.normalizer, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	if t.bpe, err = newBPE(&f.Model); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if t.raw, t.normalized, t.addedIDs, err = newAddedVocab(f.AddedTokens); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	if t.prefix, t.suffix, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	t.words = newWordCache(defaultWordCacheEntries)
	t.pieces = newPieceCache(DefaultPieceCacheBytes)
	return t, nil
}

// isNull reports a missing or JSON null section.
func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// errUnsupported marks a construct the package refuses.
var errUnsupported = errors.New("not supported")

// What each of a model's two tokenizer files holds, for the errors of a
// file given in the other's place.
const (
	aboutTokenizerFile = "tokenizer.json (the vocabulary and merges)"
	aboutConfigFile    = "tokenizer_config.json (the chat template and special tokens)"
)

// errConfigFile is Parse's error for a tokenizer_config.json.
var errConfigFile = errors.New("looks like " + aboutConfigFile + ", not " + aboutTokenizerFile)

// errTokenizerFile is readConfig's error for a tokenizer.json.
var errTokenizerFile = errors.New("looks like " + aboutTokenizerFile + ", not " + aboutConfigFile)
