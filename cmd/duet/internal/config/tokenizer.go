package config

import (
	"errors"
	"fmt"
)

// Tokenizer names a model's Hugging Face tokenizer files, so that duet
// routes on the token ids the engines compute (docs/tokenizer.md). Paths
// are as a Kubernetes volume or a compose bind mount places them; a
// relative path is relative to the configuration file.
type Tokenizer struct {
	// File is the model's tokenizer.json.
	File string `yaml:"file"`
	// Config is the model's tokenizer_config.json (its chat template and
	// special tokens).
	Config string `yaml:"config"`
	// ChatTemplate, when set, is a chat template file (chat_template.jinja)
	// that replaces the config's, as SGLang's --chat-template does.
	ChatTemplate string `yaml:"chat_template"`
	// PageSize is the engines' page size (SGLang --page-size, default 1):
	// duet's token blocks are the smallest multiple of it that holds
	// prefix.block_tokens, so that they end where the engines' pages end.
	PageSize int `yaml:"page_size"`
}

// validate checks one tokenizer section.
func (t *Tokenizer) validate(field string) []error {
	var errs []error
	if t.File == "" {
		errs = append(errs, fmt.Errorf("%s.file: the path of the model's tokenizer.json is required", field))
	}
	if t.Config == "" {
		errs = append(errs, fmt.Errorf("%s.config: the path of the model's tokenizer_config.json is required", field))
	}
	if t.PageSize < 0 {
		errs = append(errs, fmt.Errorf("%s.page_size: %d must not be negative", field, t.PageSize))
	}
	return errs
}

// BlockTokens is the token block size of a pool with this tokenizer:
// the smallest multiple of the page size that holds blockTokens (the
// prefix section's, 0 for its default of 16).
func (t *Tokenizer) BlockTokens(blockTokens int) int {
	if blockTokens <= 0 {
		blockTokens = 16
	}
	page := max(t.PageSize, 1)
	return (blockTokens + page - 1) / page * page
}

// validateTokenizers checks the top-level and every pool's tokenizer.
func (c *Config) validateTokenizers() []error {
	var errs []error
	if c.Tokenizer != nil {
		if len(c.Pools) > 0 {
			errs = append(errs, errors.New("tokenizer: with a pools section, name each pool's tokenizer under pools[].tokenizer"))
		}
		errs = append(errs, c.Tokenizer.validate("tokenizer")...)
	}
	for i := range c.Pools {
		if t := c.Pools[i].Tokenizer; t != nil {
			errs = append(errs, t.validate(fmt.Sprintf("pools[%d].tokenizer", i))...)
		}
	}
	return errs
}
