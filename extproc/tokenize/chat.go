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
	// ToolChoice is the body's tool_choice, if any: "none" passes no
	// tools to the template, a named function only that one.
	ToolChoice gjson.Result
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
	data["tools"] = jinja.None()
	data["documents"] = jinja.None()
	tmpl := ct.main
	if req.Tools.IsArray() && req.ToolChoice.String() != "none" {
		tools, err := parseValue(req.Tools.Raw)
		if err != nil {
			return "", fmt.Errorf("%w: tools: %v", ErrInvalidMessages, err)
		}
		if name := req.ToolChoice.Get("function.name"); req.ToolChoice.IsObject() {
			tools = namedTool(tools, name.String())
		}
		if tools.AsList().Len() > 0 {
			data["tools"] = sglangTools(tools)
			if ct.toolUse != nil {
				tmpl = ct.toolUse
			}
		}
	}
	var effort jinja.Value
	if e := req.ReasoningEffort; e.Exists() && e.Type != gjson.Null {
		if effort, err = parseValue(e.Raw); err != nil {
			return "", fmt.Errorf("%w: reasoning_effort: %v", ErrInvalidMessages, err)
		}
		data["reasoning_effort"] = effort
	}
	if k := req.ChatTemplateKwargs; k.IsObject() {
		kwargs, err := parseValue(k.Raw)
		if err != nil {
			return "", fmt.Errorf("%w: chat_template_kwargs: %v", ErrInvalidMessages, err)
		}
		d := kwargs.AsDict()
		for _, key := range d.Keys {
			data[key] = d.Data[key]
		}
	}
	if effort.IsString() || effort.IsNumber() {
		thinking := jinja.NewBool(!(effort.IsString() && effort.AsString() == "none"))
		for _, k := range []string{"thinking", "enable_thinking"} {
			if !req.ChatTemplateKwargs.Get(k).Exists() {
				data[k] = thinking
			}
		}
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
	parsed, err := parseValue(raw.Raw)
	if err != nil {
		return jinja.Value{}, fmt.Errorf("%w: messages: %v", ErrInvalidMessages, err)
	}
	in := parsed.AsList().Items
	items := make([]jinja.Value, 0, len(in))
	for i, m := range in {
		if !m.IsDict() {
			return jinja.Value{}, fmt.Errorf("%w: messages[%d] is not an object", ErrInvalidMessages, i)
		}
		src := m.AsDict()
		role, _ := src.Get("role")
		if !role.IsString() {
			return jinja.Value{}, fmt.Errorf("%w: messages[%d] has no role", ErrInvalidMessages, i)
		}
		switch role.AsString() {
		case "system", "developer", "user", "assistant", "tool", "function":
		default:
			return jinja.Value{}, fmt.Errorf("%w: messages[%d] has unknown role %q", ErrInvalidMessages, i, role.AsString())
		}
		msg := jinja.NewDict()
		d := msg.AsDict()
		for _, key := range src.Keys {
			v := src.Data[key]
			switch {
			case key == "content":
				c, err := ct.content(v, role.AsString())
				if err != nil {
					return jinja.Value{}, fmt.Errorf("%w: messages[%d].content: %v", ErrInvalidMessages, i, err)
				}
				d.Set(key, c)
			case v.IsNone():
			case key == "tool_calls" && role.AsString() == "assistant":
				if err := parseToolArguments(v); err != nil {
					return jinja.Value{}, fmt.Errorf("%w: messages[%d].tool_calls: %v", ErrInvalidMessages, i, err)
				}
				d.Set(key, v)
			default:
				d.Set(key, v)
			}
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
func (ct *ChatTemplate) content(v jinja.Value, role string) (jinja.Value, error) {
	switch {
	case v.IsNone():
		return jinja.NewString(""), nil
	case v.IsString():
		return v, nil
	case !v.IsList():
		return jinja.Value{}, fmt.Errorf("neither a string nor a list of parts")
	}
	var texts []string
	var parts []jinja.Value
	for _, p := range v.AsList().Items {
		if !p.IsDict() {
			return jinja.Value{}, fmt.Errorf("a part that is not an object")
		}
		pd := p.AsDict()
		typ, _ := pd.Get("type")
		if !typ.IsString() {
			return jinja.Value{}, fmt.Errorf("a part without a type")
		}
		switch typ.AsString() {
		case "text", "input_text":
			t, _ := pd.Get("text")
			if !t.IsString() {
				return jinja.Value{}, fmt.Errorf("a %s part without text", typ.AsString())
			}
			texts = append(texts, t.AsString())
			part := jinja.NewDict()
			part.AsDict().Set("type", jinja.NewString("text"))
			part.AsDict().Set("text", t)
			parts = append(parts, part)
		case "image_url", "image", "input_image":
			parts = append(parts, placeholder("image"))
		case "video_url", "video":
			parts = append(parts, placeholder("video"))
		case "audio_url", "input_audio", "audio":
			parts = append(parts, placeholder("audio"))
		case "thinking", "reasoning":
		default:
			return jinja.Value{}, fmt.Errorf("part of unknown type %q", typ.AsString())
		}
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

// parseToolArguments parses each call's arguments, a JSON string, into an
// object in place, as SGLang does (strictly: arguments that are not a JSON
// object fail).
func parseToolArguments(calls jinja.Value) error {
	if !calls.IsList() {
		return nil
	}
	for _, call := range calls.AsList().Items {
		if !call.IsDict() {
			continue
		}
		fn, ok := call.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			continue
		}
		args, ok := fn.AsDict().Get("arguments")
		if !ok || !args.IsString() {
			continue
		}
		parsed, err := parseValue(args.AsString())
		if err != nil || !parsed.IsDict() {
			return fmt.Errorf("arguments %q are not a JSON object", args.AsString())
		}
		fn.AsDict().Set("arguments", parsed)
	}
	return nil
}

// namedTool keeps the tools whose function is named name, as SGLang does
// for a tool_choice that names a function.
func namedTool(tools jinja.Value, name string) jinja.Value {
	var out []jinja.Value
	for _, t := range tools.AsList().Items {
		if !t.IsDict() {
			continue
		}
		if fn, ok := t.AsDict().Get("function"); ok && fn.IsDict() {
			if n, ok := fn.AsDict().Get("name"); ok && n.IsString() && n.AsString() == name {
				out = append(out, t)
			}
		}
	}
	return jinja.NewList(out)
}

// sglangTools is the tools list as SGLang passes it to the template (its
// Tool and Function models dumped): each tool is {type, function,
// defer_loading}; a function keeps the client's keys in order, then
// description and parameters (null when absent), and drops null strict
// and defer_loading.
func sglangTools(tools jinja.Value) jinja.Value {
	var out []jinja.Value
	if !tools.IsList() {
		return jinja.NewList(out)
	}
	for _, t := range tools.AsList().Items {
		td := jinja.NewDict()
		if !t.IsDict() {
			out = append(out, t)
			continue
		}
		src := t.AsDict()
		if typ, ok := src.Get("type"); ok && !typ.IsNone() {
			td.AsDict().Set("type", typ)
		} else {
			td.AsDict().Set("type", jinja.NewString("function"))
		}
		fn := jinja.NewDict()
		fd := fn.AsDict()
		if f, ok := src.Get("function"); ok && f.IsDict() {
			for _, key := range f.AsDict().Keys {
				v := f.AsDict().Data[key]
				if v.IsNone() && (key == "strict" || key == "defer_loading") {
					continue
				}
				fd.Set(key, v)
			}
		}
		for _, k := range []string{"description", "parameters"} {
			if !fd.Has(k) {
				fd.Set(k, jinja.None())
			}
		}
		deferLoading, ok := src.Get("defer_loading")
		if !ok {
			deferLoading = jinja.None()
		}
		if !fd.Has("defer_loading") && !deferLoading.IsNone() {
			fd.Set("defer_loading", deferLoading)
		}
		td.AsDict().Set("function", fn)
		td.AsDict().Set("defer_loading", deferLoading)
		out = append(out, td)
	}
	return jinja.NewList(out)
}
