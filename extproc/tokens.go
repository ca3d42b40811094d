package extproc

import (
	"errors"
	"fmt"
	"time"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/extproc/tokenize"
	"github.com/duet-router/duet/scheduler"
)

// Outcomes of duet_tokenize_requests_total.
const (
	tokenizeOK       = "ok"
	tokenizeGiven    = "input_ids"         // the client sent token ids
	tokenizeFallback = "template_fallback" // the template failed: routed by the text estimate
	tokenizeRejected = "invalid_messages"  // answered 400
	tokenizeSkipped  = "unsupported_route" // /v1/responses: routed by the text estimate
)

// errInvalidMessages marks a chat body SGLang refuses before its template
// runs (an unknown role, content of the wrong type, tool call arguments
// that are not a JSON object): duet answers 400 at once.
var errInvalidMessages = errors.New("invalid messages")

// tokenizeBody sets req.TokenIDs to the prompt's token ids as the pool's
// engines compute them: the chat template and the tokenizer on chat
// messages, the tokenizer on text prompts (the first item of a batch,
// which keys the prefix index as in describe). Ids the client sent are
// kept as describe read them.
//
// A body SGLang refuses is errInvalidMessages. A template that fails to
// render leaves the request to the text estimate (counted, logged by the
// caller): it may be a construct duet's template engine lacks, and
// routing by estimate loses nothing but precision.
//
// It fills the prompt as describePrompt does, except that a chat's text
// form is the rendered template (whose length calibrates the token
// estimate as well as the messages' would): the messages are read once.
func tokenizeBody(m *tokenize.Model, route Route, b *Body, req *scheduler.Request) (outcome string, err error) {
	if route == RouteChat {
		return tokenizeChat(m, b, req)
	}
	describePrompt(route, b, req)
	if len(req.TokenIDs) > 0 {
		return tokenizeGiven, nil
	}
	switch route {
	case RouteCompletions:
		prompt := b.field("prompt")
		if prompt.IsArray() {
			prompt = prompt.Get("0")
		}
		req.TokenIDs = m.EncodeText(req.TokenIDs[:0], prompt.String())
	case RouteGenerate:
		text := b.field("text")
		if text.IsArray() {
			text = text.Get("0")
		}
		if text.Type != gjson.String {
			return tokenizeGiven, nil
		}
		req.TokenIDs = m.EncodeText(req.TokenIDs[:0], text.Str)
	default:
		return tokenizeSkipped, nil
	}
	return tokenizeOK, nil
}

// tokenizeChat renders a chat request with the model's template and
// tokenizes it; the rendered text is the prompt's text form.
func tokenizeChat(m *tokenize.Model, b *Body, req *scheduler.Request) (outcome string, err error) {
	ids, text, err := m.EncodeChat(req.TokenIDs[:0], tokenize.ChatRequest{
		Messages:           b.field("messages"),
		Tools:              b.field("tools"),
		ToolChoice:         b.field("tool_choice"),
		ChatTemplateKwargs: b.field("chat_template_kwargs"),
		ReasoningEffort:    b.field("reasoning_effort"),
	})
	switch {
	case errors.Is(err, tokenize.ErrInvalidMessages):
		return tokenizeRejected, fmt.Errorf("%w: %v", errInvalidMessages, err)
	case err != nil:
		describePrompt(RouteChat, b, req)
		return tokenizeFallback, err
	}
	req.TokenIDs = ids
	req.Prompt = append(req.Prompt[:0], text...)
	return tokenizeOK, nil
}

// observeTokenize records one tokenization's outcome and time.
func (m *Metrics) observeTokenize(pool, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	m.tokenize.WithLabelValues(pool, outcome).Inc()
	if outcome == tokenizeOK {
		m.tokenizeSeconds.WithLabelValues(pool).Observe(took.Seconds())
	}
}

// PromptTokens parses raw, a request body sent on route, and returns its
// prompt's token ids exactly as duet computes them for a pool with
// tokenizer m (see tokenizeBody): the ids the prefix index keys. It also
// returns the prompt's text form, for a chat the rendered template.
// `duet tokenize` and the tests use it.
func PromptTokens(m *tokenize.Model, route Route, raw []byte) (ids []int64, prompt string, err error) {
	b, err := ParseBody(route, raw)
	if err != nil {
		return nil, "", err
	}
	var req scheduler.Request
	describeMeta(b, &req)
	outcome, err := tokenizeBody(m, route, b, &req)
	switch {
	case err != nil:
		return nil, "", err
	case outcome == tokenizeSkipped:
		return nil, "", fmt.Errorf("%s requests are routed by the text estimate, not tokenized", route)
	}
	return req.TokenIDs, string(req.Prompt), nil
}
