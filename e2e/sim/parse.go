package sim

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/extproc/tokenize"
)

// inferRequest is the part of an inference body the simulator acts on.
type inferRequest struct {
	route        routeKind
	model        string
	stream       bool
	includeUsage bool
	// items are the units SGLang schedules independently: batch prompts,
	// or chat samples when n > 1. Each has its own bootstrap room.
	items []itemInput
	// batch is true when /generate or /v1/completions got a list input, so
	// the response is list-shaped (/generate) or one choice per prompt.
	batch bool
	boot  bootstrapFields
	// bodyRank is routed_dp_rank, or the deprecated data_parallel_rank when
	// routed_dp_rank is absent.
	bodyRank *int
	// disaggPrefillRank is disagg_prefill_dp_rank.
	disaggPrefillRank *int
	// rids holds the request id of every item (see parseRIDs).
	rids []string
	// priority is the body's priority (one for all items), nil when
	// absent; always nil on /v1/responses, whose priority SGLang does not
	// hand to the engine, and with the vLLM flavour.
	priority *int64
}

// itemInput is one schedulable item.
type itemInput struct {
	promptTokens int
	maxTokens    int
	// blocks are the prompt's prefix-cache block hashes (engine model
	// only; nil otherwise).
	blocks []uint64
	// tail continues blocks over the answer (the decode radix cache
	// caches prompt and answer).
	tail HashTail
	// ids are the prompt's token ids (input_ids, or a completions prompt
	// of token ids), nil for text; the engine model only.
	ids []int64
	// seed is the request's sampling seed (chat and completions seed,
	// /generate sampling_params.sampling_seed); with one, the answer is
	// ReplyText(seed, ...).
	seed *int64
}

// promptInfo is one prompt's token count and prefix-cache blocks.
type promptInfo struct {
	tokens int
	blocks []uint64
	tail   HashTail
	// ids are the token ids of a token-id prompt (engine model only).
	ids []int64
}

// parseOptions tune parseInferRequest for the server's configuration.
type parseOptions struct {
	// blockTokens > 0 computes prefix-cache block hashes of that size.
	blockTokens int
	// vllm ignores SGLang's rank and bootstrap fields, like vLLM.
	vllm bool
	// tok, with blockTokens > 0, keys text prompts by their token ids
	// (Config.Tokenizer).
	tok *tokenize.Model
	// unitTokens gives chat prompts stand-in token ids
	// (ParsePromptTokens).
	unitTokens bool
}

// bootstrapFields holds the PD bootstrap fields, one entry per item; a nil
// entry means the field was absent or null for that item.
type bootstrapFields struct {
	rooms []*int64
	hosts []*string
	ports []*int
}

// parseInferRequest validates body for route and extracts what the
// simulator needs. Errors are 400s with SGLang-like messages.
func parseInferRequest(route routeKind, body []byte, servedModel string, opts parseOptions) (*inferRequest, *apiError) {
	if !gjson.ValidBytes(body) {
		return nil, badRequestf("Invalid JSON body")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, badRequestf("Request body must be a JSON object")
	}
	req := &inferRequest{route: route, model: servedModel}
	if m := root.Get("model"); m.Type == gjson.String && m.String() != "" {
		if opts.vllm && route.isOpenAI() && m.String() != servedModel {
			// vLLM's OpenAI server serves only its served model names
			// (SGLang answers whatever the request names).
			return nil, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", m.String())}
		}
		req.model = m.String()
	}
	req.stream = root.Get("stream").Bool()
	req.includeUsage = root.Get("stream_options.include_usage").Bool()

	var err *apiError
	switch route {
	case routeChat:
		err = parseChat(root, req, opts.blockTokens, opts.unitTokens && opts.tok == nil)
	case routeCompletions:
		err = parseCompletions(root, req, opts.blockTokens)
	case routeGenerate:
		err = parseGenerate(root, req, opts.blockTokens)
	case routeResponses:
		err = parseResponses(root, req, opts.blockTokens)
	default:
		err = badRequestf("unknown route")
	}
	if err != nil {
		return nil, err
	}
	if opts.tok != nil && opts.blockTokens > 0 {
		tokenizeItems(opts.tok, route, body, req, opts.blockTokens)
	}
	if req.rids, err = parseRIDs(root, req, opts.vllm); err != nil {
		return nil, err
	}
	if opts.vllm {
		// vLLM reads the rank from X-data-parallel-rank only and knows
		// nothing of SGLang's bootstrap fields.
		n := len(req.items)
		req.boot = bootstrapFields{rooms: make([]*int64, n), hosts: make([]*string, n), ports: make([]*int, n)}
		return req, nil
	}
	if req.bodyRank, err = optInt(root.Get("routed_dp_rank"), "routed_dp_rank"); err != nil {
		return nil, err
	}
	if req.bodyRank == nil {
		if req.bodyRank, err = optInt(root.Get("data_parallel_rank"), "data_parallel_rank"); err != nil {
			return nil, err
		}
	}
	if req.disaggPrefillRank, err = optInt(root.Get("disagg_prefill_dp_rank"), "disagg_prefill_dp_rank"); err != nil {
		return nil, err
	}
	if req.boot, err = parseBootstrap(root, len(req.items)); err != nil {
		return nil, err
	}
	if route != routeResponses {
		if req.priority, err = parsePriority(root.Get("priority")); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// parseChat reads /v1/chat/completions: messages, n, max tokens.
func parseChat(root gjson.Result, req *inferRequest, blockTokens int, unitTokens bool) *apiError {
	msgs := root.Get("messages")
	if !msgs.IsArray() || len(msgs.Array()) == 0 {
		return badRequestf("messages: Field required and must be a non-empty list")
	}
	var b strings.Builder
	for _, m := range msgs.Array() {
		b.WriteString(contentText(m.Get("content")))
	}
	maxTokens, err := maxTokensOf(root, "max_completion_tokens", "max_tokens")
	if err != nil {
		return err
	}
	n := 1
	if v := root.Get("n"); v.Exists() && v.Type != gjson.Null {
		nn, err := optInt(v, "n")
		if err != nil {
			return err
		}
		if *nn < 1 {
			return badRequestf("n must be at least 1, got %d", *nn)
		}
		n = *nn
	}
	blocks, tail, ids := messageBlocksTokens(msgs, blockTokens, true, unitTokens)
	item := itemInput{promptTokens: textTokens(b.String()), maxTokens: maxTokens, blocks: blocks, tail: tail, seed: optSeed(root.Get("seed")), ids: ids}
	for i := 0; i < n; i++ {
		req.items = append(req.items, item)
	}
	return nil
}

// parseCompletions reads /v1/completions: prompt (string, list of strings,
// token list or list of token lists) and max_tokens.
func parseCompletions(root gjson.Result, req *inferRequest, blockTokens int) *apiError {
	maxTokens, err := maxTokensOf(root, "max_tokens")
	if err != nil {
		return err
	}
	prompts, batch, err := promptsOf(root.Get("prompt"), "prompt", "prompt: Field required", blockTokens)
	if err != nil {
		return err
	}
	req.batch = batch
	seed := optSeed(root.Get("seed"))
	for _, p := range prompts {
		req.items = append(req.items, itemInput{promptTokens: p.tokens, maxTokens: maxTokens, blocks: p.blocks, tail: p.tail, ids: p.ids, seed: seed})
	}
	return nil
}

// parseGenerate reads native /generate: text or input_ids (single or
// batch) and sampling_params.max_new_tokens (an object, or one per item).
func parseGenerate(root gjson.Result, req *inferRequest, blockTokens int) *apiError {
	text, ids := root.Get("text"), root.Get("input_ids")
	hasText := text.Exists() && text.Type != gjson.Null
	hasIDs := ids.Exists() && ids.Type != gjson.Null
	if hasText && hasIDs {
		return badRequestf("Either text or input_ids should be provided.")
	}
	if !hasText && !hasIDs {
		return badRequestf("Either text, input_ids or input_embeds should be provided.")
	}
	var prompts []promptInfo
	var batch bool
	var err *apiError
	if hasText {
		prompts, batch, err = promptsOf(text, "text", "", blockTokens)
	} else {
		if !ids.IsArray() {
			return badRequestf("input_ids must be a list of integers or a list of lists")
		}
		prompts, batch, err = promptsOf(ids, "input_ids", "", blockTokens)
	}
	if err != nil {
		return err
	}
	req.batch = batch
	sp := root.Get("sampling_params")
	if sp.IsArray() && len(sp.Array()) != len(prompts) {
		return badRequestf("sampling_params list has %d entries for a batch of %d", len(sp.Array()), len(prompts))
	}
	for i, p := range prompts {
		params := sp
		if sp.IsArray() {
			params = sp.Array()[i]
		}
		maxTokens, err := maxTokensOf(params, "max_new_tokens")
		if err != nil {
			return err
		}
		req.items = append(req.items, itemInput{promptTokens: p.tokens, maxTokens: maxTokens, blocks: p.blocks, tail: p.tail, ids: p.ids,
			seed: optSeed(params.Get("sampling_seed"))})
	}
	return nil
}

// parseResponses reads /v1/responses: input (string or list of items) and
// max_output_tokens.
func parseResponses(root gjson.Result, req *inferRequest, blockTokens int) *apiError {
	in := root.Get("input")
	if !in.Exists() || in.Type == gjson.Null {
		return badRequestf("input: Field required")
	}
	if in.Type != gjson.String && !in.IsArray() {
		return badRequestf("input must be a string or a list")
	}
	maxTokens, err := maxTokensOf(root, "max_output_tokens")
	if err != nil {
		return err
	}
	blocks, tail := messageBlocksTail(in, blockTokens, false)
	req.items = []itemInput{{promptTokens: textTokens(contentText(in)), maxTokens: maxTokens, blocks: blocks, tail: tail}}
	return nil
}

// promptsOf returns the prompt token counts (and prefix blocks when
// blockTokens > 0) of a string, list of strings, token list or list of
// token lists, and whether the input is a batch.
func promptsOf(v gjson.Result, field, missing string, blockTokens int) ([]promptInfo, bool, *apiError) {
	if !v.Exists() || v.Type == gjson.Null {
		if missing == "" {
			missing = field + ": Field required"
		}
		return nil, false, badRequestf("%s", missing)
	}
	if v.Type == gjson.String {
		blocks, tail := textBlocksTail(v.String(), blockTokens)
		return []promptInfo{{tokens: textTokens(v.String()), blocks: blocks, tail: tail}}, false, nil
	}
	if !v.IsArray() {
		return nil, false, badRequestf("%s must be a string or a list", field)
	}
	elems := v.Array()
	if len(elems) == 0 {
		return nil, false, badRequestf("%s must not be empty", field)
	}
	switch {
	case elems[0].Type == gjson.Number:
		for _, e := range elems {
			if e.Type != gjson.Number {
				return nil, false, badRequestf("%s: mixed token ids and other values", field)
			}
		}
		blocks, ids := idBlocks(elems, blockTokens)
		return []promptInfo{{tokens: len(elems), blocks: blocks, ids: ids}}, false, nil
	case elems[0].Type == gjson.String:
		out := make([]promptInfo, len(elems))
		for i, e := range elems {
			if e.Type != gjson.String {
				return nil, false, badRequestf("%s: a batch must be all strings", field)
			}
			blocks, tail := textBlocksTail(e.String(), blockTokens)
			out[i] = promptInfo{tokens: textTokens(e.String()), blocks: blocks, tail: tail}
		}
		return out, true, nil
	case elems[0].IsArray():
		out := make([]promptInfo, len(elems))
		for i, e := range elems {
			if !e.IsArray() {
				return nil, false, badRequestf("%s: a batch of token ids must be all lists", field)
			}
			ids := e.Array()
			for _, id := range ids {
				if id.Type != gjson.Number {
					return nil, false, badRequestf("%s: token ids must be integers", field)
				}
			}
			blocks, tids := idBlocks(ids, blockTokens)
			out[i] = promptInfo{tokens: len(ids), blocks: blocks, ids: tids}
		}
		return out, true, nil
	}
	return nil, false, badRequestf("%s: unsupported element type", field)
}

// contentText extracts the text of a chat/responses content value: a
// string, a list of parts with "text", or a list of messages with
// "content".
func contentText(v gjson.Result) string {
	switch {
	case v.Type == gjson.String:
		return v.String()
	case v.IsArray():
		var b strings.Builder
		for _, e := range v.Array() {
			b.WriteString(contentText(e))
		}
		return b.String()
	case v.IsObject():
		if t := v.Get("text"); t.Type == gjson.String {
			return t.String()
		}
		return contentText(v.Get("content"))
	}
	return ""
}

// maxTokensOf returns the first present field of names as a non-negative
// int, or the default of 16.
func maxTokensOf(obj gjson.Result, names ...string) (int, *apiError) {
	for _, name := range names {
		v, err := optInt(obj.Get(name), name)
		if err != nil {
			return 0, err
		}
		if v != nil {
			if *v < 0 {
				return 0, badRequestf("%s must be non-negative, got %d", name, *v)
			}
			return *v, nil
		}
	}
	return defaultMaxNewTokens, nil
}

// optSeed reads an optional sampling seed; a value that is not an
// integer is ignored (the simulator samples nothing, the seed only picks
// the answer's text).
func optSeed(v gjson.Result) *int64 {
	n, err := optInt64(v, "seed")
	if err != nil {
		return nil
	}
	return n
}

// optInt parses an optional integer field; absent or null gives nil.
func optInt(v gjson.Result, name string) (*int, *apiError) {
	n, err := optInt64(v, name)
	if err != nil || n == nil {
		return nil, err
	}
	if *n > math.MaxInt32 || *n < math.MinInt32 {
		return nil, badRequestf("%s: integer out of range: %d", name, *n)
	}
	i := int(*n)
	return &i, nil
}

// optInt64 parses an optional 64-bit integer field. Like pydantic's lax
// mode it accepts floats with no fractional part.
func optInt64(v gjson.Result, name string) (*int64, *apiError) {
	if !v.Exists() || v.Type == gjson.Null {
		return nil, nil
	}
	if v.Type != gjson.Number {
		return nil, badRequestf("%s: Input should be a valid integer, got %s", name, v.Raw)
	}
	if n, err := strconv.ParseInt(v.Raw, 10, 64); err == nil {
		return &n, nil
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	if err != nil || f != math.Trunc(f) || f >= math.MaxInt64 || f < math.MinInt64 {
		return nil, badRequestf("%s: Input should be a valid integer, got %s", name, v.Raw)
	}
	n := int64(f)
	return &n, nil
}

// parseBootstrap reads bootstrap_room, bootstrap_host and bootstrap_port.
// A scalar is allowed for a single item; a list must have one entry per
// item, as SGLang indexes the lists when it splits a batch.
func parseBootstrap(root gjson.Result, n int) (bootstrapFields, *apiError) {
	var f bootstrapFields
	var err *apiError
	f.rooms, err = perItem(root.Get("bootstrap_room"), "bootstrap_room", n, func(v gjson.Result) (*int64, *apiError) {
		return optInt64(v, "bootstrap_room")
	})
	if err != nil {
		return f, err
	}
	f.hosts, err = perItem(root.Get("bootstrap_host"), "bootstrap_host", n, func(v gjson.Result) (*string, *apiError) {
		if v.Type == gjson.Null {
			return nil, nil
		}
		if v.Type != gjson.String {
			return nil, badRequestf("bootstrap_host: Input should be a valid string, got %s", v.Raw)
		}
		s := v.String()
		return &s, nil
	})
	if err != nil {
		return f, err
	}
	f.ports, err = perItem(root.Get("bootstrap_port"), "bootstrap_port", n, func(v gjson.Result) (*int, *apiError) {
		p, err := optInt(v, "bootstrap_port")
		if err == nil && p != nil && (*p < 0 || *p > 65535) {
			return nil, badRequestf("bootstrap_port out of range: %d", *p)
		}
		return p, err
	})
	return f, err
}

// perItem expands a bootstrap field into one value per item.
func perItem[T any](v gjson.Result, name string, n int, parse func(gjson.Result) (*T, *apiError)) ([]*T, *apiError) {
	out := make([]*T, n)
	if !v.Exists() || v.Type == gjson.Null {
		return out, nil
	}
	if !v.IsArray() {
		if n != 1 {
			return nil, badRequestf("%s must be a list of length %d for a batch request, got a scalar", name, n)
		}
		x, err := parse(v)
		if err != nil {
			return nil, err
		}
		out[0] = x
		return out, nil
	}
	elems := v.Array()
	if len(elems) != n {
		return nil, badRequestf("%s list has length %d but the batch has %d items", name, len(elems), n)
	}
	for i, e := range elems {
		x, err := parse(e)
		if err != nil {
			return nil, err
		}
		out[i] = x
	}
	return out, nil
}
