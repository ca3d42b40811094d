package sim

// chunkObject is the "object" of streaming chunks on the OpenAI routes.
func (r *renderer) chunkObject() string {
	if r.route == routeChat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

// fullOpenAI renders a chat.completion or text_completion body.
func (r *renderer) fullOpenAI(results []itemResult) map[string]any {
	choices := make([]any, len(results))
	object := "text_completion"
	for i, res := range results {
		c := map[string]any{"index": res.index, "logprobs": nil, "finish_reason": res.finishReason()}
		if r.route == routeChat {
			c["message"] = map[string]any{"role": "assistant", "content": res.text}
		} else {
			c["text"] = res.text
		}
		choices[i] = c
	}
	if r.route == routeChat {
		object = "chat.completion"
	}
	return map[string]any{
		"id": r.id, "object": object, "created": r.created, "model": r.model,
		"choices": choices, "usage": r.openAIUsage(results),
	}
}

// chatChunk is one chat.completion.chunk with a single choice.
func (r *renderer) chatChunk(index int, delta map[string]any, finish *string) []byte {
	return mustJSON(map[string]any{
		"id": r.itemID(index), "object": "chat.completion.chunk", "created": r.created, "model": r.model,
		"choices": []any{map[string]any{
			"index": index, "delta": delta, "logprobs": nil, "finish_reason": finish,
		}},
	})
}

// completionChunk is one streaming text_completion with a single choice.
func (r *renderer) completionChunk(index int, text string, finish *string) []byte {
	return mustJSON(map[string]any{
		"id": r.itemID(index), "object": "text_completion", "created": r.created, "model": r.model,
		"choices": []any{map[string]any{
			"index": index, "text": text, "logprobs": nil, "finish_reason": finish,
		}},
	})
}
