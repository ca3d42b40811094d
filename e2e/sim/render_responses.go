package sim

// responseObject is a Responses API response object.
func (r *renderer) responseObject(status string, results []itemResult) map[string]any {
	text := ""
	output := []any{}
	if len(results) > 0 {
		text = results[0].text
		output = append(output, map[string]any{
			"type": "message", "id": "msg_" + r.id, "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}},
		})
	}
	o := map[string]any{
		"id": r.id, "object": "response", "created_at": r.created, "model": r.model,
		"status": status, "output": output,
	}
	if len(results) > 0 {
		p, c, cached := r.usageCached(results)
		u := map[string]any{"input_tokens": p, "output_tokens": c, "total_tokens": p + c}
		if r.cacheReport {
			u["input_tokens_details"] = map[string]any{"cached_tokens": cached}
		}
		o["usage"] = u
	}
	return o
}

// fullResponses renders a non-streaming /v1/responses body.
func (r *renderer) fullResponses(results []itemResult) map[string]any {
	return r.responseObject("completed", results)
}

// responsesStart is the response.created event.
func (r *renderer) responsesStart() []frame {
	ev := "response.created"
	return []frame{{event: ev, data: mustJSON(map[string]any{
		"type": ev, "response": r.responseObject("in_progress", nil),
	})}}
}

// responsesDelta is one response.output_text.delta event.
func (r *renderer) responsesDelta(delta string) []frame {
	ev := "response.output_text.delta"
	return []frame{{event: ev, data: mustJSON(map[string]any{
		"type": ev, "item_id": "msg_" + r.id, "output_index": 0, "content_index": 0, "delta": delta,
	})}}
}

// responsesEnd is the response.completed event.
func (r *renderer) responsesEnd(results []itemResult) []frame {
	ev := "response.completed"
	return []frame{{event: ev, data: mustJSON(map[string]any{
		"type": ev, "response": r.responseObject("completed", results),
	})}}
}
