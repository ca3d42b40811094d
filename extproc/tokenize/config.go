package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
)

// tokenizerConfig is the part of a Hugging Face tokenizer_config.json that
// duet reads: the chat template, the special tokens the template sees, and
// the BOS/EOS flags SGLang applies to Llama-class tokenizers.
type tokenizerConfig struct {
	ChatTemplate   json.RawMessage `json:"chat_template"`
	TokenizerClass string          `json:"tokenizer_class"`
	AddBOSToken    *bool           `json:"add_bos_token"`
	AddEOSToken    *bool           `json:"add_eos_token"`
	BOSToken       specialToken    `json:"bos_token"`
	EOSToken       specialToken    `json:"eos_token"`
	UnkToken       specialToken    `json:"unk_token"`
	SepToken       specialToken    `json:"sep_token"`
	PadToken       specialToken    `json:"pad_token"`
	ClsToken       specialToken    `json:"cls_token"`
	MaskToken      specialToken    `json:"mask_token"`
	// Model is a tokenizer.json's section, never a tokenizer_config.json
	// key: read to tell a tokenizer.json given in the config's place.
	Model json.RawMessage `json:"model"`
}

// specialToken is a special token written as a string or as an AddedToken
// object; empty when absent or null.
type specialToken string

// UnmarshalJSON reads both forms.
func (s *specialToken) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch t := v.(type) {
	case string:
		*s = specialToken(t)
	case map[string]any:
		c, _ := t["content"].(string)
		*s = specialToken(c)
	case nil:
		*s = ""
	default:
		return fmt.Errorf("special token %s is neither a string nor an object", b)
	}
	return nil
}

// specials are the template variables transformers passes from the
// special tokens map (only those that are set).
func (c *tokenizerConfig) specials() map[string]string {
	out := map[string]string{}
	for name, v := range map[string]specialToken{
		"bos_token": c.BOSToken, "eos_token": c.EOSToken, "unk_token": c.UnkToken,
		"sep_token": c.SepToken, "pad_token": c.PadToken, "cls_token": c.ClsToken, "mask_token": c.MaskToken,
	} {
		if v != "" {
			out[name] = string(v)
		}
	}
	return out
}

// templates returns the config's chat templates by name: a single string
// is "default"; a list names each.
func (c *tokenizerConfig) templates() (map[string]string, error) {
	if isNull(c.ChatTemplate) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(c.ChatTemplate, &one); err == nil {
		return map[string]string{"default": one}, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(c.ChatTemplate, &named); err != nil {
		return nil, fmt.Errorf("chat_template is neither a string nor a list of named templates: %w", err)
	}
	out := map[string]string{}
	for _, n := range named {
		out[n.Name] = n.Template
	}
	return out, nil
}

// readConfig reads a tokenizer_config.json.
func readConfig(path string) (*tokenizerConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer config %s: %w", path, err)
	}
	var c tokenizerConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("tokenizer config %s: not a tokenizer_config.json: %w", path, err)
	}
	if !isNull(c.Model) {
		return nil, fmt.Errorf("tokenizer config %s: %w", path, errTokenizerFile)
	}
	return &c, nil
}
