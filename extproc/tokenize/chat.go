package tokenize

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"
	"github.com/tidwall/gjson"
)

// ChatRequest is what a chat completion request gives its template: the
// fields of the request body, as they arrived.
type ChatRequest struct {
	// Messages is the body's messages array.
	Messages gjson.Result
	// Tools is the body's tools array, if any.
	Tools gjson.Result
	// ChatTemplateKwargs is SGLang's chat_template_kwargs object, if any.
	ChatTemplateKwargs gjson.Result
	// ReasoningEffort is the body's reasoning_effort, if any.
	ReasoningEffort gjson.Result
	// NoGenerationPrompt leaves out the assistant turn's opening (SGLang
	// always asks for it in a chat completion).
	NoGenerationPrompt bool
}

// ErrInvalidMessages marks a chat request SGLang refuses before its
// template runs: messages that are not a list of objects, an unknown role,
// content of the wrong type, tool call arguments that are not a JSON
// object.
var ErrInvalidMessages = errors.New("invalid chat messages")

// ErrTemplate marks a request the chat template failed to render (the
// template's own raise_exception, or a construct the engine lacks).
var ErrTemplate = errors.New("chat template")

// ChatTemplate renders chat requests with a model's Jinja chat template as
// SGLang does before it tokenizes: SGLang's rewrites of the messages and
// tools, then transformers' apply_chat_template (trim_blocks,
// lstrip_blocks, Python's json.dumps for tojson). It is safe for
// concurrent use.
type ChatTemplate struct {
	main, toolUse *jinja.Template
	// specials are the special-token variables (bos_token, ...).
	specials map[string]jinja.Value
	// contentParts is SGLang's "openai" content format: the template
	// loops over content parts, so they are passed as a list.
	contentParts bool
}

// newChatTemplate compiles the config's templates; nil when it has none.
func newChatTemplate(c *tokenizerConfig, override string) (*ChatTemplate, error) {
	sources, err := c.templates()
	if err != nil {
		return nil, err
	}
	if override != "" {
		sources = map[string]string{"default": override}
	}
	if len(sources) == 0 {
		return nil, nil
	}
	ct := &ChatTemplate{specials: map[string]jinja.Value{}}
	for k, v := range c.specials() {
		ct.specials[k] = jinja.NewString(v)
	}
	main, ok := sources["default"]
	if !ok {
		return nil, fmt.Errorf("chat_template has no template named default")
	}
	if ct.main, err = jinja.Compile(main); err != nil {
		return nil, fmt.Errorf("chat_template: %w", err)
	}
	ct.contentParts = contentFormatOpenAI(main)
	if src, ok := sources["tool_use"]; ok {
		if ct.toolUse, err = jinja.Compile(src); err != nil {
			return nil, fmt.Errorf("chat_template tool_use: %w", err)
		}
	}
	return ct, nil
}

// contentLoop finds a for loop over a message's content, SGLang's sign of a
// template that takes content parts (SGLang inspects the template's syntax
// tree; this reads the same loop in its source).
var contentLoop = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+(?:message\s*\[\s*['"]content['"]\s*\]|message\.content|msg\.content|m\.content)\b`)

// contentFormatOpenAI reports SGLang's "openai" content format.
func contentFormatOpenAI(src string) bool {
	for _, w := range []string{"image", "audio", "video", "vision"} {
		if strings.Contains(src, w) {
			return true
		}
	}
	return contentLoop.MatchString(src)
}

// Render returns the prompt text of a chat request.
func (ct *ChatTemplate) Render(req ChatRequest) (string, error) {
	msgs, err := ct.messages(req.Messages)
	if err != nil {
		return "", err
	}
	data := make(map[string]jinja.Value, len(ct.specials)+8)
	for k, v := range ct.specials {
		data[k] = v
	}
	data["__filter_tojson"] = jinja.NewCallable("tojson", pyToJSON)
	data["messages"] = msgs
	data["add_generation_prompt"] = jinja.NewBool(!req.NoGenerationPrompt)
	tmpl := ct.main
	if req.Tools.IsArray() {
		data["tools"] = sglangTools(req.Tools)
		if ct.toolUse != nil {
			tmpl = ct.toolUse
		}
	} else {
		data["tools"] = jinja.None()
	}
	data["documents"] = jinja.None()
	kwargs := map[string]jinja.Value{}
	var order []string
	setKwarg := func(k string, v jinja.Value) {
		if _, ok := kwargs[k]; !ok {
			order = append(order, k)
		}
		kwargs[k] = v
	}
	if e := req.ReasoningEffort; e.Exists() && e.Type != gjson.Null {
		setKwarg("reasoning_effort", toValue(e))
	}
	req.ChatTemplateKwargs.ForEach(func(k, v gjson.Result) bool {
		setKwarg(k.String(), toValue(v))
		return true
	})
	if e := req.ReasoningEffort; e.Exists() && e.Type != gjson.Null {
		thinking := jinja.NewBool(e.String() != "none")
		for _, k := range []string{"thinking", "enable_thinking"} {
			if _, ok := kwargs[k]; !ok {
				setKwarg(k, thinking)
			}
		}
	}
	for _, k := range order {
		data[k] = kwargs[k]
	}
	out, err := tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	return out, nil
}

// messages rewrites the request's messages as SGLang does before it
// renders them (serving_chat.py in SGLang 0.5.23):
//   - keys whose value is null are dropped, and a null content is "";
//   - in "string" content format, a content list becomes its text parts
//     joined by one space; in "openai" format, text parts stay and
//     images, audio and video become {"type": ...} placeholders;
//   - an assistant's tool call arguments, a JSON string, become an object;
//   - a last assistant message with text content is sent as a user
//     message (SGLang continues it only with continue_final_message).
func (ct *ChatTemplate) messages(raw gjson.Result) (jinja.Value, error) {
	if !raw.IsArray() {
		return jinja.Value{}, fmt.Errorf("%w: messages is not an array", ErrInvalidMessages)
	}
	arr := raw.Array()
	items := make([]jinja.Value, 0, len(arr))
	for i, m := range arr {
		if !m.IsObject() {
			return jinja.Value{}, fmt.Errorf("%w: messages[%d] is not an object", ErrInvalidMessages, i)
		}
		role := m.Get("role")
		if role.Type != gjson.String {
			return jinja.Value{}, fmt.Errorf("%w: messages[%d] has no role", ErrInvalidMessages, i)
		}
		switch role.Str {
		case "system", "developer", "user", "assistant", "tool", "function":
		default:
			return jinja.Value{}, fmt.Errorf("%w: messages[%d] has unknown role %q", ErrInvalidMessages, i, role.Str)
		}
		msg := jinja.NewDict()
		d := msg.AsDict()
		var err error
		m.ForEach(func(k, v gjson.Result) bool {
			key := k.String()
			switch {
			case key == "content":
				var c jinja.Value
				if c, err = ct.content(v, role.Str); err != nil {
					err = fmt.Errorf("%w: messages[%d].content: %v", ErrInvalidMessages, i, err)
					return false
				}
				d.Set(key, c)
			case v.Type == gjson.Null:
			case key == "tool_calls" && role.Str == "assistant":
				var tc jinja.Value
				if tc, err = toolCalls(v); err != nil {
					err = fmt.Errorf("%w: messages[%d].tool_calls: %v", ErrInvalidMessages, i, err)
					return false
				}
				d.Set(key, tc)
			default:
				d.Set(key, toValue(v))
			}
			return true
		})
		if err != nil {
			return jinja.Value{}, err
		}
		if !d.Has("content") {
			d.Set("content", jinja.NewString(""))
		}
		items = append(items, msg)
	}
	if n := len(items); n > 0 {
		last := items[n-1].AsDict()
		if r, _ := last.Get("role"); r.IsString() && r.AsString() == "assistant" {
			if c, _ := last.Get("content"); c.IsString() {
				user := jinja.NewDict()
				user.AsDict().Set("role", jinja.NewString("user"))
				user.AsDict().Set("content", c)
				items[n-1] = user
			}
		}
	}
	return jinja.NewList(items), nil
}

// content rewrites one message's content.
func (ct *ChatTemplate) content(v gjson.Result, role string) (jinja.Value, error) {
	switch {
	case v.Type == gjson.Null:
		return jinja.NewString(""), nil
	case v.Type == gjson.String:
		return jinja.NewString(v.Str), nil
	case !v.IsArray():
		return jinja.Value{}, fmt.Errorf("neither a string nor a list of parts")
	}
	var texts []string
	var parts []jinja.Value
	var err error
	v.ForEach(func(_, p gjson.Result) bool {
		typ := p.Get("type").String()
		switch typ {
		case "text", "input_text":
			t := p.Get("text")
			if t.Type != gjson.String {
				err = fmt.Errorf("a %s part without text", typ)
				return false
			}
			texts = append(texts, t.Str)
			part := jinja.NewDict()
			part.AsDict().Set("type", jinja.NewString("text"))
			part.AsDict().Set("text", jinja.NewString(t.Str))
			parts = append(parts, part)
		case "image_url", "image", "input_image":
			parts = append(parts, placeholder("image"))
		case "video_url", "video":
			parts = append(parts, placeholder("video"))
		case "audio_url", "input_audio", "audio":
			parts = append(parts, placeholder("audio"))
		case "thinking", "reasoning":
		default:
			err = fmt.Errorf("part of unknown type %q", typ)
			return false
		}
		return true
	})
	if err != nil {
		return jinja.Value{}, err
	}
	if !ct.contentParts || role == "tool" && len(parts) == len(texts) {
		return jinja.NewString(strings.Join(texts, " ")), nil
	}
	return jinja.NewList(parts), nil
}

// placeholder is a non-text content part as SGLang passes it.
func placeholder(typ string) jinja.Value {
	p := jinja.NewDict()
	p.AsDict().Set("type", jinja.NewString(typ))
	return p
}

// toolCalls parses each call's arguments, a JSON string, into an object,
// as SGLang does (strictly: arguments that are not a JSON object fail).
func toolCalls(v gjson.Result) (jinja.Value, error) {
	if !v.IsArray() {
		return toValue(v), nil
	}
	var calls []jinja.Value
	var err error
	v.ForEach(func(_, call gjson.Result) bool {
		c := toValue(call)
		if !c.IsDict() {
			calls = append(calls, c)
			return true
		}
		fn, ok := c.AsDict().Get("function")
		if ok && fn.IsDict() {
			if args, ok := fn.AsDict().Get("arguments"); ok && args.IsString() {
				parsed := gjson.Parse(args.AsString())
				if !gjson.Valid(args.AsString()) || !parsed.IsObject() {
					err = fmt.Errorf("arguments %q are not a JSON object", args.AsString())
					return false
				}
				fn.AsDict().Set("arguments", toValue(parsed))
			}
		}
		calls = append(calls, c)
		return true
	})
	if err != nil {
		return jinja.Value{}, err
	}
	return jinja.NewList(calls), nil
}

// sglangTools is the tools list as SGLang passes it to the template (its
// Tool and Function models dumped): each tool is {type, function,
// defer_loading}; a function keeps the client's keys in order, then
// description and parameters (null when absent), and drops null strict
// and defer_loading.
func sglangTools(tools gjson.Result) jinja.Value {
	var out []jinja.Value
	tools.ForEach(func(_, t gjson.Result) bool {
		tool := jinja.NewDict()
		td := tool.AsDict()
		typ := t.Get("type")
		if typ.Exists() && typ.Type != gjson.Null {
			td.Set("type", toValue(typ))
		} else {
			td.Set("type", jinja.NewString("function"))
		}
		fn := jinja.NewDict()
		fd := fn.AsDict()
		t.Get("function").ForEach(func(k, v gjson.Result) bool {
			key := k.String()
			if v.Type == gjson.Null && (key == "strict" || key == "defer_loading") {
				return true
			}
			fd.Set(key, toValue(v))
			return true
		})
		for _, k := range []string{"description", "parameters"} {
			if !fd.Has(k) {
				fd.Set(k, jinja.None())
			}
		}
		defer_ := t.Get("defer_loading")
		if !fd.Has("defer_loading") && defer_.Exists() && defer_.Type != gjson.Null {
			fd.Set("defer_loading", toValue(defer_))
		}
		td.Set("function", fn)
		td.Set("defer_loading", toValue(defer_))
		out = append(out, tool)
		return true
	})
	return jinja.NewList(out)
}

// toValue turns JSON into template values, keeping the order of keys as
// Python's json module does.
func toValue(v gjson.Result) jinja.Value {
	switch v.Type {
	case gjson.Null:
		return jinja.None()
	case gjson.False:
		return jinja.NewBool(false)
	case gjson.True:
		return jinja.NewBool(true)
	case gjson.String:
		return jinja.NewString(v.Str)
	case gjson.Number:
		if !strings.ContainsAny(v.Raw, ".eE") {
			if n := v.Int(); fmt.Sprint(n) == strings.TrimPrefix(v.Raw, "+") {
				return jinja.NewInt(n)
			}
		}
		return jinja.NewFloat(v.Num)
	}
	if v.IsArray() {
		var items []jinja.Value
		v.ForEach(func(_, x gjson.Result) bool {
			items = append(items, toValue(x))
			return true
		})
		return jinja.NewList(items)
	}
	if v.IsObject() {
		d := jinja.NewDict()
		v.ForEach(func(k, x gjson.Result) bool {
			d.AsDict().Set(k.String(), toValue(x))
			return true
		})
		return d
	}
	return jinja.Undefined()
}
