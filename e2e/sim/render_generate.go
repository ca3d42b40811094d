package sim

// generateMeta is SGLang's meta_info for one /generate item.
func generateMeta(res itemResult, finished bool) map[string]any {
	var finish any
	switch {
	case finished && res.finish == finishAbort:
		finish = map[string]any{"type": finishAbort, "message": res.finishMsg}
	case finished:
		finish = map[string]any{"type": "length", "length": res.completionTokens}
	}
	return map[string]any{
		"id":                res.rid,
		"prompt_tokens":     res.promptTokens,
		"completion_tokens": res.completionTokens,
		"cached_tokens":     res.cachedTokens,
		"finish_reason":     finish,
	}
}

// generateObject is one /generate result object.
func (r *renderer) generateObject(res itemResult, finished bool) map[string]any {
	out := map[string]any{"text": res.text, "meta_info": generateMeta(res, finished)}
	if r.batch {
		out["index"] = res.index
	}
	return out
}

// fullGenerate renders a /generate body: an object, or a list for batches.
func (r *renderer) fullGenerate(results []itemResult) any {
	if !r.batch {
		o := r.generateObject(results[0], true)
		delete(o, "index")
		return o
	}
	out := make([]any, len(results))
	for i, res := range results {
		o := r.generateObject(res, true)
		delete(o, "index")
		out[i] = o
	}
	return out
}

// generateChunk is one streaming /generate event with the cumulative text.
func (r *renderer) generateChunk(res itemResult, finished bool) []byte {
	return mustJSON(r.generateObject(res, finished))
}
