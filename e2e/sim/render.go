package sim

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"
)

// itemResult is the outcome (or progress) of one item.
type itemResult struct {
	index            int
	rid              string
	promptTokens     int
	completionTokens int
	text             string
	// cachedTokens are the prompt tokens found in the prefix cache
	// (engine model only).
	cachedTokens int
	// finish is the finish reason when it is not "length" (finishAbort);
	// finishMsg its message.
	finish    string
	finishMsg string
	// seed is the request's sampling seed: the answer is ReplyText(seed).
	seed *int64
	// Decode radix cache (engine model). radix: a decode with the cache;
	// decodePrefix and hostHit its match at preallocation. gotPrefix: a
	// prefill told its decode's match; transferred the tokens it sent.
	radix        bool
	decodePrefix int
	hostHit      int
	gotPrefix    bool
	transferred  int
}

// finishAbort is the finish reason of an item aborted by /abort_request.
const finishAbort = "abort"

// finishReason is the item's OpenAI finish_reason.
func (res itemResult) finishReason() string {
	if res.finish != "" {
		return res.finish
	}
	return "length"
}

// frame is one SSE event: an optional event name and a JSON payload.
type frame struct {
	event string
	data  []byte
}

// renderer shapes responses for one request on one route.
type renderer struct {
	route routeKind
	// id is the response id: the first item's rid on the OpenAI routes
	// (SGLang answers meta_info.id, the rid), a resp_ id on /v1/responses.
	id string
	// ids are the items' rids; streaming chunks carry their item's.
	ids          []string
	created      int64
	model        string
	batch        bool
	includeUsage bool
	// cacheReport adds usage.prompt_tokens_details.cached_tokens, as
	// SGLang's --enable-cache-report does (engine model only).
	cacheReport bool
}

// newRenderer returns a renderer for req on s.
func (s *Server) newRenderer(req *inferRequest) *renderer {
	r := newRenderer(req)
	r.cacheReport = s.eng != nil
	return r
}

// newRenderer returns a renderer for req.
func newRenderer(req *inferRequest) *renderer {
	id := newID("resp_")
	if req.route != routeResponses && len(req.rids) > 0 {
		id = req.rids[0]
	}
	return &renderer{
		route:        req.route,
		id:           id,
		ids:          req.rids,
		created:      time.Now().Unix(),
		model:        req.model,
		batch:        req.batch,
		includeUsage: req.includeUsage,
	}
}

// itemID is the id of item index's chunks: its rid.
func (r *renderer) itemID(index int) string {
	if index < len(r.ids) {
		return r.ids[index]
	}
	return r.id
}

// newID returns a random hex id with prefix.
func newID(prefix string) string {
	return fmt.Sprintf("%s%016x%016x", prefix, rand.Uint64(), rand.Uint64())
}

// mustJSON encodes v; the simulator only encodes maps and slices of plain
// values, which cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("sim: encode %T: %v", v, err))
	}
	return b
}

// usageCached returns prompt, completion and cached prompt token totals.
// Chat samples (n > 1) share one prompt, so it is counted once.
func (r *renderer) usageCached(results []itemResult) (prompt, completion, cached int) {
	for i, res := range results {
		if r.route != routeChat || i == 0 {
			prompt += res.promptTokens
			cached += res.cachedTokens
		}
		completion += res.completionTokens
	}
	return prompt, completion, cached
}

// openAIUsage is the OpenAI usage object.
func (r *renderer) openAIUsage(results []itemResult) map[string]any {
	p, c, cached := r.usageCached(results)
	u := map[string]any{"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
	if r.cacheReport {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	}
	return u
}

// full renders the non-streaming body.
func (r *renderer) full(results []itemResult) any {
	switch r.route {
	case routeChat, routeCompletions:
		return r.fullOpenAI(results)
	case routeGenerate:
		return r.fullGenerate(results)
	default:
		return r.fullResponses(results)
	}
}

// startFrames are sent before an item's first token (or its finish).
func (r *renderer) startFrames(index int) []frame {
	switch r.route {
	case routeChat:
		return []frame{{data: r.chatChunk(index, map[string]any{"role": "assistant", "content": ""}, nil)}}
	case routeResponses:
		return r.responsesStart()
	}
	return nil
}

// tokenFrames are sent for one generated token; res already includes it.
func (r *renderer) tokenFrames(res itemResult, delta string, total int) []frame {
	switch r.route {
	case routeChat:
		return []frame{{data: r.chatChunk(res.index, map[string]any{"content": delta}, nil)}}
	case routeCompletions:
		return []frame{{data: r.completionChunk(res.index, delta, nil)}}
	case routeGenerate:
		return []frame{{data: r.generateChunk(res, res.completionTokens == total && res.finish == "")}}
	default:
		return r.responsesDelta(delta)
	}
}

// finishFrames are sent when an item finished generating.
func (r *renderer) finishFrames(res itemResult) []frame {
	reason := res.finishReason()
	switch r.route {
	case routeChat:
		return []frame{{data: r.chatChunk(res.index, map[string]any{}, &reason)}}
	case routeCompletions:
		return []frame{{data: r.completionChunk(res.index, "", &reason)}}
	case routeGenerate:
		if res.completionTokens == 0 || res.finish != "" {
			return []frame{{data: r.generateChunk(res, true)}}
		}
		return nil
	default:
		return nil
	}
}

// endFrames are sent once every item finished, before [DONE].
func (r *renderer) endFrames(results []itemResult) []frame {
	switch r.route {
	case routeChat, routeCompletions:
		if !r.includeUsage {
			return nil
		}
		return []frame{{data: mustJSON(map[string]any{
			"id": r.id, "object": r.chunkObject(), "created": r.created, "model": r.model,
			"choices": []any{}, "usage": r.openAIUsage(results),
		})}}
	case routeResponses:
		return r.responsesEnd(results)
	}
	return nil
}
