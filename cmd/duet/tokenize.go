package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/extproc/tokenize"
	"github.com/duet-router/duet/scheduler/prefix"
)

// tokenizeOutput is what `duet tokenize -json` prints.
type tokenizeOutput struct {
	Pool        string `json:"pool"`
	Route       string `json:"route"`
	PageSize    int    `json:"page_size"`
	BlockTokens int    `json:"block_tokens"`
	// Rendered is a chat request's prompt as the chat template writes it.
	Rendered string  `json:"rendered,omitempty"`
	Tokens   int     `json:"tokens"`
	IDs      []int64 `json:"ids"`
	// Blocks are duet's hashed token blocks (whole pages, at most
	// prefix.DefaultMaxBlocks): the prefix index's keys. The tail after the
	// last is not hashed (nor cached by the engine's radix tree, which
	// keeps whole pages).
	Blocks []tokenizeBlock `json:"blocks"`
}

// tokenizeBlock is one hashed block.
type tokenizeBlock struct {
	Start int    `json:"start"`
	End   int    `json:"end"`
	Hash  string `json:"hash"`
	Text  string `json:"text"`
}

// runTokenize implements `duet tokenize`: a request body on stdin, its
// token ids and blocks as the pool's tokenizer and page size make them on
// stdout.
func runTokenize(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("duet tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "duet.yaml", "path of duet's YAML configuration")
	poolName := fs.String("pool", "", "the pool whose tokenizer to use (default: the only pool)")
	route := fs.String("path", "", "the request path: /v1/chat/completions, /v1/completions or /generate (default: from the body: messages, prompt, or text and input_ids)")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	setUsage(fs, "duet tokenize [-config FILE] [-pool NAME] [-path PATH] [-json] < body.json",
		"Tokenize reads a request body on stdin and prints its token ids and prefix blocks as the pool's\n"+
			"tokenizer and page size make them: what duet routes on (docs/tokenizer.md).")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	cfg, err := loadConfig(*path, false)
	if err != nil {
		return err
	}
	pools := cfg.PoolList()
	var pc *config.Pool
	for i := range pools {
		if pools[i].Name == *poolName || *poolName == "" && len(pools) == 1 {
			pc = &pools[i]
		}
	}
	switch {
	case pc == nil && *poolName == "":
		return fmt.Errorf("the configuration has %d pools: name one with -pool", len(pools))
	case pc == nil:
		return fmt.Errorf("no pool is named %q", *poolName)
	case pc.Tokenizer == nil:
		return fmt.Errorf("pool %s has no tokenizer section (docs/tokenizer.md)", pc.Name)
	}
	m, err := loadTokenizer(pc.Tokenizer)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(stdin)
	if err != nil {
		return fmt.Errorf("read the body: %w", err)
	}
	r, err := tokenizeRoute(*route, body)
	if err != nil {
		return err
	}
	ids, prompt, err := extproc.PromptTokens(m, r, body)
	if err != nil {
		return err
	}
	out := tokenizeOutput{Pool: pc.Name, Route: r.String(), PageSize: max(pc.Tokenizer.PageSize, 1),
		BlockTokens: pc.Tokenizer.BlockTokens(cfg.Prefix.BlockTokens), Tokens: len(ids), IDs: ids}
	if r == extproc.RouteChat {
		out.Rendered = prompt
	}
	hashes := prefix.Hasher{BlockTokens: out.BlockTokens}.Tokens(ids, nil)
	for i, h := range hashes {
		start, end := i*out.BlockTokens, (i+1)*out.BlockTokens
		out.Blocks = append(out.Blocks, tokenizeBlock{Start: start, End: end, Hash: fmt.Sprintf("%016x", h),
			Text: m.Tokenizer.Decode(ids[start:end])})
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return printTokenize(stdout, &out, m)
}

// tokenizeRoute is the route named by path, or the one the body's fields
// imply.
func tokenizeRoute(path string, body []byte) (extproc.Route, error) {
	if path != "" {
		r := extproc.ClassifyRoute("POST", path)
		if r == extproc.RouteOther || r == extproc.RouteResponses {
			return r, fmt.Errorf("-path %s: want /v1/chat/completions, /v1/completions or /generate", path)
		}
		return r, nil
	}
	b := gjson.ParseBytes(body)
	switch {
	case b.Get("messages").Exists():
		return extproc.RouteChat, nil
	case b.Get("prompt").Exists():
		return extproc.RouteCompletions, nil
	case b.Get("text").Exists() || b.Get("input_ids").Exists():
		return extproc.RouteGenerate, nil
	}
	return extproc.RouteOther, errors.New("the body has no messages, prompt, text or input_ids: name the route with -path")
}

// printTokenize writes the text form: a header, then one line per block.
func printTokenize(w io.Writer, out *tokenizeOutput, m *tokenize.Model) error {
	var b strings.Builder
	fmt.Fprintf(&b, "pool %s, route %s: %d tokens; page size %d, blocks of %d tokens: %d hashed, %d tokens after them\n",
		out.Pool, out.Route, out.Tokens, out.PageSize, out.BlockTokens, len(out.Blocks), out.Tokens-len(out.Blocks)*out.BlockTokens)
	if out.Rendered != "" {
		fmt.Fprintf(&b, "rendered: %q\n", out.Rendered)
	}
	for i, blk := range out.Blocks {
		fmt.Fprintf(&b, "block %d [%d,%d) %s %v %q\n", i, blk.Start, blk.End, blk.Hash, out.IDs[blk.Start:blk.End], blk.Text)
	}
	if tail := len(out.Blocks) * out.BlockTokens; tail < out.Tokens {
		fmt.Fprintf(&b, "tail  [%d,%d) unhashed %v %q\n", tail, out.Tokens, out.IDs[tail:], m.Tokenizer.Decode(out.IDs[tail:]))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
