package tokenize

import (
	"errors"
	"fmt"
	"os"
	"slices"
)

// Model is one served model's tokenizer and chat template, applied as
// SGLang applies them to the requests it receives.
type Model struct {
	// Tokenizer is the model's tokenizer.json.
	Tokenizer *Tokenizer
	// Chat is the model's chat template; nil when tokenizer_config.json
	// has none.
	Chat *ChatTemplate
	// textPrefix and textSuffix go around a text prompt's ids (SGLang
	// encodes text prompts with special tokens).
	textPrefix, textSuffix []int64
}

// llamaClasses are the tokenizer classes whose add_bos_token and
// add_eos_token SGLang applies on top of tokenizer.json's post-processor
// (its fix for transformers 5, which ignores them).
var llamaClasses = []string{
	"LlamaTokenizer", "LlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast",
	"CodeLlamaTokenizer", "CodeLlamaTokenizerFast", "CohereTokenizerFast",
}

// LoadModel reads a model's tokenizer.json and tokenizer_config.json. A
// chat template file (chat_template.jinja, as newer models ship it), when
// given, replaces the config's template. Every error names its file; a
// tokenizer_config.json given as the tokenizer file, or a tokenizer.json
// as the config file, is an error that names the configuration keys of
// both (tokenizer.file and tokenizer.config) and which file each wants.
func LoadModel(tokenizerFile, configFile, chatTemplateFile string) (*Model, error) {
	tok, err := Load(tokenizerFile)
	if errors.Is(err, errConfigFile) {
		return nil, swappedError(tokenizerFile, configFile)
	}
	if err != nil {
		return nil, err
	}
	cfg, err := readConfig(configFile)
	if errors.Is(err, errTokenizerFile) {
		return nil, fmt.Errorf("tokenizer.config: %s looks like %s; tokenizer.config wants %s and tokenizer.file wants tokenizer.json",
			configFile, aboutTokenizerFile, aboutConfigFile)
	}
	if err != nil {
		return nil, err
	}
	var override string
	if chatTemplateFile != "" {
		b, err := os.ReadFile(chatTemplateFile)
		if err != nil {
			return nil, fmt.Errorf("chat template %s: %w", chatTemplateFile, err)
		}
		override = string(b)
	}
	m := &Model{Tokenizer: tok, textPrefix: tok.prefix, textSuffix: tok.suffix}
	if m.Chat, err = newChatTemplate(cfg, override); err != nil {
		name := configFile
		if override != "" {
			name = chatTemplateFile
		}
		return nil, fmt.Errorf("chat template %s: %w", name, err)
	}
	if slices.Contains(llamaClasses, cfg.TokenizerClass) && (cfg.AddBOSToken != nil || cfg.AddEOSToken != nil) {
		m.textPrefix, m.textSuffix = nil, nil
		if cfg.AddBOSToken != nil && *cfg.AddBOSToken {
			id, err := tok.addedID(string(cfg.BOSToken))
			if err != nil {
				return nil, fmt.Errorf("tokenizer config %s: add_bos_token: %w", configFile, err)
			}
			m.textPrefix = []int64{id}
		}
		if cfg.AddEOSToken != nil && *cfg.AddEOSToken {
			id, err := tok.addedID(string(cfg.EOSToken))
			if err != nil {
				return nil, fmt.Errorf("tokenizer config %s: add_eos_token: %w", configFile, err)
			}
			m.textSuffix = []int64{id}
		}
	}
	return m, nil
}

// addedID is the id of an added token by its content.
func (t *Tokenizer) addedID(content string) (int64, error) {
	for id, c := range t.addedIDs {
		if c == content {
			return int64(id), nil
		}
	}
	if id, ok := t.bpe.vocab[content]; ok && content != "" {
		return int64(id), nil
	}
	return 0, fmt.Errorf("token %q is not in the vocabulary", content)
}

// EncodeText appends the ids of a text prompt (/v1/completions, /generate
// with text) to dst: the text with the special tokens SGLang adds.
func (m *Model) EncodeText(dst []int64, text string) []int64 {
	dst = append(dst, m.textPrefix...)
	dst = m.Tokenizer.Encode(dst, text, false)
	return append(dst, m.textSuffix...)
}

// EncodeChat renders a chat request with the chat template and appends
// its ids to dst (without special tokens: the template writes them); it
// returns the rendered prompt too.
func (m *Model) EncodeChat(dst []int64, req ChatRequest) ([]int64, string, error) {
	if m.Chat == nil {
		return dst, "", fmt.Errorf("%w: the tokenizer config has no chat_template", ErrTemplate)
	}
	text, err := m.Chat.Render(req)
	if err != nil {
		return dst, "", err
	}
	return m.Tokenizer.Encode(dst, text, false), text, nil
}

// swappedError is LoadModel's error for a tokenizer_config.json given as
// the tokenizer file; it says whether the config file is the tokenizer.json,
// that is whether the two are swapped.
func swappedError(tokenizerFile, configFile string) error {
	msg := fmt.Sprintf("tokenizer.file: %s looks like %s; tokenizer.file wants %s and tokenizer.config wants tokenizer_config.json",
		tokenizerFile, aboutConfigFile, aboutTokenizerFile)
	if _, err := readConfig(configFile); errors.Is(err, errTokenizerFile) {
		msg += fmt.Sprintf("; tokenizer.config names %s, which looks like tokenizer.json: the two are swapped", configFile)
	}
	return errors.New(msg)
}
