package sim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/extproc/tokenize"
)

// This file keys text prompts by the token ids a real engine computes
// (Config.Tokenizer), with the function duet itself tokenizes with
// (extproc.PromptTokens), so that the engine model's cache blocks, their KV
// events and duet's block keys agree.

// loadTokenizer loads the tokenizer of dir: tokenizer.json,
// tokenizer_config.json and, when present, chat_template.jinja (which
// replaces the config's template, as Hugging Face loads it).
func loadTokenizer(dir string) (*tokenize.Model, error) {
	tmpl := filepath.Join(dir, "chat_template.jinja")
	if _, err := os.Stat(tmpl); errors.Is(err, os.ErrNotExist) {
		tmpl = ""
	}
	m, err := tokenize.LoadModel(filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json"), tmpl)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", dir, err)
	}
	return m, nil
}

// tokenizeItems keys req's text items by token ids (engine model with a
// tokenizer): a single prompt's ids are what extproc.PromptTokens gives
// for the body, a batch's strings are each encoded as text, as SGLang
// does. Items whose ids cannot be computed (a chat template duet's engine
// cannot render, /v1/responses) keep their text keys. Tokenized items
// count their real tokens, and cache no answer blocks on a decode: the
// answer's token ids are unknown.
func tokenizeItems(tok *tokenize.Model, route routeKind, body []byte, req *inferRequest, blockTokens int) {
	set := func(it *itemInput, ids []int64) {
		if len(ids) == 0 {
			return
		}
		it.ids = ids
		it.promptTokens = len(ids)
		it.blocks = tokenBlocks(ids, blockTokens)
		it.tail = HashTail{}
	}
	if req.batch {
		field := "prompt"
		if route == routeGenerate {
			field = "text"
		}
		texts := gjson.GetBytes(body, field).Array()
		for i := range req.items {
			if i < len(texts) && texts[i].Type == gjson.String && req.items[i].ids == nil {
				set(&req.items[i], tok.EncodeText(nil, texts[i].Str))
			}
		}
		return
	}
	if len(req.items) == 0 || req.items[0].ids != nil {
		return
	}
	var r extproc.Route
	switch route {
	case routeChat:
		r = extproc.RouteChat
	case routeCompletions:
		r = extproc.RouteCompletions
	case routeGenerate:
		r = extproc.RouteGenerate
	default:
		return
	}
	ids, _, err := extproc.PromptTokens(tok, r, body)
	if err != nil {
		return
	}
	for i := range req.items {
		set(&req.items[i], ids)
	}
}

// WithTokenIDs returns p keyed by token ids, as a server with a tokenizer
// keys it: Tokens, Blocks (of blockTokens ids) and TokenIDs from ids, no
// answer blocks (Tail). Model callers tokenize with extproc.PromptTokens.
func (p Prompt) WithTokenIDs(ids []int64, blockTokens int) Prompt {
	p.Tokens = len(ids)
	p.Blocks = tokenBlocks(ids, blockTokens)
	p.TokenIDs = ids
	p.Tail = HashTail{}
	return p
}
