package extproc

import (
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/extproc/jsonscan"
	"github.com/duet-router/duet/scheduler"
)

// Describe parses raw, an inference request body sent on route, and
// returns the scheduler's view of it exactly as duet builds it for a
// request it schedules (see describe). The routing-quality simulator
// (e2e/clustersim) uses it so that its scheduler sees what duet's does.
func Describe(route Route, raw []byte) (scheduler.Request, error) {
	b, err := ParseBody(route, raw)
	if err != nil {
		return scheduler.Request{}, err
	}
	var req scheduler.Request
	describe(route, b, &req)
	return req, nil
}

// describe fills the scheduler's view of an inference request from its
// body: model, prompt (rendered in a stable text form, or token ids),
// requested output length and number of items. The prompt of a batch is
// its first item: it keys the prefix index, and the token estimate is
// scaled by Items. A text prompt is written over req.Prompt's memory
// (req.Prompt[:0]), so a caller can hand in a reused buffer.
func describe(route Route, b *Body, req *scheduler.Request) {
	describeMeta(b, req)
	describePrompt(route, b, req)
}

// describeMeta fills the model, the number of items and the requested
// output length.
func describeMeta(b *Body, req *scheduler.Request) {
	// A clone: gjson's string would share the memory of the whole body, and
	// the model outlives the request (reservations, per-model estimates).
	req.Model = strings.Clone(b.field("model").String())
	req.Items = max(b.Batch, 1)
	for _, v := range []gjson.Result{b.field("max_tokens"), b.field("max_completion_tokens"), b.field("max_output_tokens"),
		b.field("sampling_params").Get("max_new_tokens")} {
		if v.Type == gjson.Number && v.Int() > 0 {
			req.MaxTokens = int(v.Int())
			break
		}
	}
}

// describePrompt fills the prompt: its stable text form, or the token ids
// the client sent.
func describePrompt(route Route, b *Body, req *scheduler.Request) {
	dst := req.Prompt[:0]
	req.Prompt = nil
	switch route {
	case RouteChat:
		req.Prompt = renderMessages(dst, b.field("messages"))
	case RouteCompletions:
		prompt := b.field("prompt")
		if prompt.IsArray() && b.Batch > 0 {
			prompt = prompt.Get("0")
		}
		setPrompt(dst, prompt, req)
	case RouteGenerate:
		if text := b.field("text"); text.Exists() {
			if text.IsArray() {
				text = text.Get("0")
			}
			req.Prompt = append(dst, text.String()...)
		} else {
			ids := b.field("input_ids")
			if b.Batch > 0 {
				ids = ids.Get("0")
			}
			setPrompt(dst, ids, req)
		}
	case RouteResponses:
		input := b.field("input")
		if input.IsArray() {
			req.Prompt = renderMessages(append(dst, b.field("instructions").String()...), input)
		} else {
			req.Prompt = append(append(dst, b.field("instructions").String()...), input.String()...)
		}
	}
}

// setPrompt takes a prompt that is either text (appended to dst) or a list
// of token ids.
func setPrompt(dst []byte, v gjson.Result, req *scheduler.Request) {
	if !v.IsArray() {
		req.Prompt = append(dst, v.String()...)
		return
	}
	ids := v.Array()
	req.TokenIDs = make([]int64, 0, len(ids))
	for _, id := range ids {
		req.TokenIDs = append(req.TokenIDs, id.Int())
	}
}

// renderMessages appends chat messages to out as "role\ncontent\n" per
// message, content parts joined. Equal conversations render equally, and a
// conversation that grows keeps its earlier rendering as a prefix. Of
// duplicate keys in a message it takes the last, as the engines do.
//
// msgs must be a valid JSON value whose Raw shares the body's memory (a
// field of a parsed Body): the messages and their members are found with
// package jsonscan, which skips through long contents eight bytes at a
// time, where gjson walked each content twice a byte at a time (once to
// find the message's end, once to find its content).
func renderMessages(out []byte, msgs gjson.Result) []byte {
	if !msgs.IsArray() {
		return out
	}
	raw := unsafe.Slice(unsafe.StringData(msgs.Raw), len(msgs.Raw))
	var scratch [16]jsonscan.Span
	elems, _ := jsonscan.Elements(scratch[:0], raw)
	var members [8]jsonscan.Member
	for _, e := range elems {
		var role, content gjson.Result
		msg := raw[e.Start:e.End]
		if msg[0] == '{' {
			ms, _ := jsonscan.Members(members[:0], msg)
			for _, m := range ms {
				switch string(msg[m.Key.Start:m.Key.End]) {
				case `"role"`:
					role = valueAt(msg, m.Value)
				case `"content"`:
					content = valueAt(msg, m.Value)
				}
			}
		}
		out = append(out, role.String()...)
		out = append(out, '\n')
		if content.IsArray() {
			content.ForEach(func(_, part gjson.Result) bool {
				if t := part.Get("text"); t.Exists() {
					out = append(out, t.String()...)
				} else if t := part.Get("content"); t.Exists() {
					out = append(out, t.String()...)
				}
				return true
			})
		} else {
			out = append(out, content.String()...)
		}
		out = append(out, '\n')
	}
	return out
}
