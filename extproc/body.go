package extproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/extproc/jsonscan"
)

// Body field names SGLang reads for PD bootstrap and DP routing.
const (
	FieldBootstrapHost       = "bootstrap_host"
	FieldBootstrapPort       = "bootstrap_port"
	FieldBootstrapRoom       = "bootstrap_room"
	FieldDisaggPrefillDPRank = "disagg_prefill_dp_rank"
	FieldRoutedDPRank        = "routed_dp_rank"
	FieldDeprecatedDPRank    = "data_parallel_rank"
	// FieldRID is SGLang's request id (rid), the key of POST /abort_request.
	FieldRID = "rid"
	// FieldPriority is SGLang's request priority (with
	// --enable-priority-scheduling).
	FieldPriority = "priority"
)

// routingFields are removed from every client body before duet writes its
// own: a client must never choose a host, a room or a rank.
var routingFields = []string{
	FieldBootstrapHost, FieldBootstrapPort, FieldBootstrapRoom,
	FieldDisaggPrefillDPRank, FieldRoutedDPRank, FieldDeprecatedDPRank, FieldRID,
}

// maxBodyDepth bounds a request body's JSON nesting: far beyond what chat
// messages, tool schemas or response formats need, far below what would
// exhaust the stack.
const maxBodyDepth = 256

// errBadBody marks client errors in the request body (HTTP 400).
var errBadBody = errors.New("invalid request body")

// Body is a parsed inference request body.
type Body struct {
	raw []byte
	// members are raw's top-level members, in order, found in one pass: the
	// batch shape, the scheduler's view and the rewrite all read them. A
	// path lookup on the whole body (gjson's Get) would rescan every member
	// before the one it wants, the prompt included, once per field.
	members []member
	// Batch is the number of items SGLang will split the request into, or 0
	// for a single (scalar) request. Bootstrap fields are lists of this length.
	Batch int
}

// ParseBody validates raw as a JSON object and works out its batch shape for
// route, following SGLang's request models:
//   - /generate: a list `text`, or a list of lists `input_ids`;
//   - /v1/chat/completions: `n` > 1 (one room per sample);
//   - /v1/completions: a list `prompt` of strings or of token lists.
func ParseBody(route Route, raw []byte) (*Body, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: the body is empty; %s requests need a JSON object", errBadBody, route)
	}
	// One pass validates the body and bounds its nesting (before gjson
	// recurses into any of it), a second finds its top-level members; both
	// skip through strings eight bytes at a time (package jsonscan).
	if err := jsonscan.Validate(raw, maxBodyDepth); err != nil {
		if errors.Is(err, jsonscan.ErrInvalid) {
			return nil, fmt.Errorf("%w: the body is not valid JSON (%v)", errBadBody, err)
		}
		return nil, fmt.Errorf("%w: %v", errBadBody, err)
	}
	// Members fails on valid JSON only when it is not an object.
	spans, err := jsonscan.Members(nil, raw)
	if err != nil {
		root := gjson.Parse(unsafe.String(unsafe.SliceData(raw), len(raw)))
		return nil, fmt.Errorf("%w: the body must be a JSON object, got %s", errBadBody, kindOf(root))
	}
	b := &Body{raw: raw}
	b.members = make([]member, len(spans))
	for i, m := range spans {
		b.members[i] = member{name: valueAt(raw, m.Key).String(), Member: m}
	}
	switch route {
	case RouteGenerate:
		if text := b.field("text"); text.IsArray() {
			if b.Batch = len(text.Array()); b.Batch == 0 {
				return nil, fmt.Errorf("%w: text must not be an empty list", errBadBody)
			}
		} else if ids := b.field("input_ids"); ids.IsArray() && ids.Get("0").IsArray() {
			b.Batch = len(ids.Array())
		}
	case RouteChat:
		if n := b.field("n"); n.Exists() && n.Type != gjson.Null {
			if n.Type != gjson.Number || n.Int() < 1 || float64(n.Int()) != n.Num {
				return nil, fmt.Errorf("%w: n must be a positive integer", errBadBody)
			}
			if n.Int() > 1 {
				b.Batch = int(n.Int())
			}
		}
	case RouteCompletions:
		if p := b.field("prompt"); p.IsArray() {
			items := p.Array()
			if len(items) == 0 {
				return nil, fmt.Errorf("%w: prompt must not be an empty list", errBadBody)
			}
			if items[0].Type == gjson.String || items[0].IsArray() {
				b.Batch = len(items)
			}
		}
	}
	return b, nil
}

// member is one top-level member of a body: its name, unescaped, and
// where its key and value are.
type member struct {
	name string
	jsonscan.Member
}

// field returns the value of the body's top-level member name, or a
// Result that does not exist. Of duplicate keys it takes the last, as the
// engines' JSON parsers do.
func (b *Body) field(name string) gjson.Result {
	for i := len(b.members) - 1; i >= 0; i-- {
		if b.members[i].name == name {
			return valueAt(b.raw, b.members[i].Value)
		}
	}
	return gjson.Result{}
}

// valueAt returns the valid JSON value at span s of raw as a gjson Result
// that shares raw's memory (raw is never written to while it is parsed),
// with its Index. A string without escapes is taken as it stands: gjson
// would scan it a byte at a time again.
func valueAt(raw []byte, s jsonscan.Span) gjson.Result {
	v := raw[s.Start:s.End]
	str := unsafe.String(unsafe.SliceData(v), len(v))
	if len(v) > 0 && v[0] == '"' && jsonscan.Plain(v) {
		return gjson.Result{Type: gjson.String, Raw: str, Str: str[1 : len(str)-1], Index: s.Start}
	}
	r := gjson.Parse(str)
	r.Index = s.Start
	return r
}

func kindOf(r gjson.Result) string {
	switch {
	case r.IsArray():
		return "an array"
	case r.Type == gjson.String:
		return "a string"
	case r.Type == gjson.Number:
		return "a number"
	case r.Type == gjson.Null:
		return "null"
	default:
		return "a boolean"
	}
}

// Placement is what duet writes into a body.
type Placement struct {
	// PD selects disaggregated mode: bootstrap fields are written. Otherwise
	// any client bootstrap fields are removed.
	PD            bool
	BootstrapHost string
	BootstrapPort int
	// PrefillRank and PrefillDPSize shape the minted rooms and set
	// disagg_prefill_dp_rank (PD only). A negative PrefillRank leaves the
	// rank to the engines: rooms are random and decode derives the prefill
	// rank from room % dp, as SGLang does behind a rank-unaware router.
	PrefillRank   int
	PrefillDPSize int
	// RoutedRank, when not negative, is written as routed_dp_rank. Only for a
	// single-leg (aggregated) request: in PD mode the body is shared by both
	// legs and must not pin one rank for both.
	RoutedRank int
	// RID, when not empty, is written as the request's rid, so that duet can
	// name the request to the engine's POST /abort_request. SGLang expands a
	// string rid to "<rid>_<i>" for batches and n > 1.
	RID string
	// Model, when set, replaces the body's model (an alias of the name the
	// engines serve).
	Model string
	// OwnPriority removes the client's priority field: duet's admission
	// classes decide a request's priority, not its sender.
	OwnPriority bool
	// Priority, when set, is written as the priority field (implies
	// OwnPriority).
	Priority *int
}

// Rewrite returns the body with the client's routing fields replaced by
// placement, and the bootstrap rooms minted (nil when not PD).
func (b *Body) Rewrite(pl Placement) ([]byte, []uint64, error) {
	var rooms []uint64
	if pl.PD {
		rooms = make([]uint64, max(b.Batch, 1))
		for i := range rooms {
			rooms[i] = MintRoom(pl.PrefillRank, pl.PrefillDPSize)
		}
	}
	// One pass: copy every top-level member but the routing fields (each
	// occurrence, under any spelling of its name), then append duet's. A
	// field at a time with sjson copied and rescanned the whole body a dozen
	// times, and deleted only the first of duplicate keys, leaving a second
	// copy for the engine's parser, which keeps the last.
	out := make([]byte, 0, len(b.raw)+256)
	out = append(out, '{')
	for _, m := range b.members {
		if slices.Contains(routingFields, m.name) || (pl.Model != "" && m.name == "model") ||
			((pl.OwnPriority || pl.Priority != nil) && m.name == FieldPriority) {
			continue
		}
		if m.Key.Start <= 0 || m.Value.Start <= m.Key.Start || m.Value.End > len(b.raw) {
			return nil, nil, fmt.Errorf("member %q has no position in the body", m.name)
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, b.raw[m.Key.Start:m.Value.End]...)
	}
	field := func(name, value string) {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = strconv.AppendQuote(out, name)
		out = append(out, ':')
		out = append(out, value...)
	}
	if pl.PD {
		host, port := jsonString(pl.BootstrapHost), strconv.Itoa(pl.BootstrapPort)
		field(FieldBootstrapHost, jsonValue(b.Batch, func(int) string { return host }))
		field(FieldBootstrapPort, jsonValue(b.Batch, func(int) string { return port }))
		field(FieldBootstrapRoom, jsonValue(b.Batch, func(i int) string { return strconv.FormatUint(rooms[i], 10) }))
		if pl.PrefillRank >= 0 {
			field(FieldDisaggPrefillDPRank, strconv.Itoa(pl.PrefillRank))
		}
	}
	if pl.RID != "" {
		field(FieldRID, jsonString(pl.RID))
	}
	if pl.Model != "" {
		field("model", jsonString(pl.Model))
	}
	if pl.RoutedRank >= 0 {
		field(FieldRoutedDPRank, strconv.Itoa(pl.RoutedRank))
	}
	if pl.Priority != nil {
		field(FieldPriority, strconv.Itoa(*pl.Priority))
	}
	return append(out, '}'), rooms, nil
}

// jsonString renders s as a JSON string.
func jsonString(s string) string {
	data, _ := json.Marshal(s) // a string always marshals
	return string(data)
}

// jsonValue renders a scalar (batch 0) or a list of batch values.
func jsonValue(batch int, value func(i int) string) string {
	if batch == 0 {
		return value(0)
	}
	buf := make([]byte, 0, batch*8)
	buf = append(buf, '[')
	for i := range batch {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, value(i)...)
	}
	return string(append(buf, ']'))
}
