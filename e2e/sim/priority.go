package sim

import (
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"
)

// This file is SGLang's priority scheduling (--enable-priority-scheduling,
// --schedule-low-priority-values-first, --abort-on-priority-when-disabled)
// as SGLang 0.5.23 does it: the tokenizer manager's range check of the
// priority field, the scheduler's default priority and its abort of a
// prioritised request when priority scheduling is off, and the order of
// the waiting queues (engine.go's enqueue).

const (
	// priorityRangeMsg is the tokenizer manager's ValueError (a 400) for
	// a priority outside int64 (_set_default_priority).
	priorityRangeMsg = "priority must be a signed 64-bit integer between -9223372036854775808 and 9223372036854775807"
	// priorityDisabledMsg is the scheduler's abort message for a request
	// with a priority when priority scheduling is off and
	// --abort-on-priority-when-disabled is set (_set_or_validate_priority).
	priorityDisabledMsg = "Using priority is disabled for this server. Please send a new request without a priority."
)

// priorityOrder is how an engine orders its waiting queues.
type priorityOrder struct {
	// enabled orders by priority; otherwise the queues are FIFO.
	enabled bool
	// lowFirst starts smaller values first; otherwise larger ones.
	lowFirst bool
}

// newPriorityOrder is the order cfg asks for.
func newPriorityOrder(cfg Config) priorityOrder {
	return priorityOrder{enabled: cfg.EnablePriorityScheduling, lowFirst: cfg.ScheduleLowPriorityValuesFirst}
}

// precedes reports whether priority a starts strictly before priority b,
// SGLang's sort key priority × (1 if low values first else -1).
func (o priorityOrder) precedes(a, b int64) bool {
	if o.lowFirst {
		return a < b
	}
	return a > b
}

// effective is the priority the scheduler gives a request whose body
// carried p (nil: none): p itself, or with priority scheduling on and no
// priority the one that starts last (sys.maxsize when low values come
// first, -sys.maxsize-1 otherwise). With priority scheduling off it is 0
// and unused.
func (o priorityOrder) effective(p *int64) int64 {
	switch {
	case !o.enabled:
		return 0
	case p != nil:
		return *p
	case o.lowFirst:
		return math.MaxInt64
	}
	return math.MinInt64
}

// parsePriority reads the optional priority field: an integer (a float
// without fractional part passes, as pydantic's lax mode lets it), with
// SGLang's 400 when it lies outside int64.
func parsePriority(v gjson.Result) (*int64, *apiError) {
	if v.Type == gjson.Number && outsideInt64(v.Raw) {
		return nil, badRequestf("%s", priorityRangeMsg)
	}
	return optInt64(v, "priority")
}

// outsideInt64 reports whether raw, a JSON number, is an integer that
// int64 cannot hold (Python parses any integer and checks the range
// afterwards).
func outsideInt64(raw string) bool {
	_, err := strconv.ParseInt(raw, 10, 64)
	if err == nil || errors.Is(err, strconv.ErrRange) {
		return err != nil
	}
	f, err := strconv.ParseFloat(raw, 64)
	return err == nil && f == math.Trunc(f) && (f >= math.MaxInt64 || f < math.MinInt64)
}

// abortsPriority reports whether the scheduler aborts req on arrival:
// priority scheduling off, --abort-on-priority-when-disabled set, and a
// priority in the body.
func (s *Server) abortsPriority(req *inferRequest) bool {
	return req.priority != nil && !s.cfg.EnablePriorityScheduling && s.cfg.AbortOnPriorityWhenDisabled
}

// abortPriority answers a request the scheduler aborted for its priority.
// SGLang's abort carries status 503: without streaming the tokenizer
// manager raises an HTTPException, which every route answers with a 503
// ErrorResponse whose type is "503"; streaming, the 200 is sent and the
// abort arrives in the stream: /generate sends the abort's output (empty
// text, meta_info.finish_reason with the status and message) per item,
// chat and completions one error event of type SERVICE_UNAVAILABLE.
func (s *Server) abortPriority(w http.ResponseWriter, req *inferRequest, rec *Record) {
	rec.Error = priorityDisabledMsg
	if !req.stream {
		rec.Status = http.StatusServiceUnavailable
		writeJSON(w, http.StatusServiceUnavailable, errorResponse(priorityDisabledMsg, "503", http.StatusServiceUnavailable))
		return
	}
	sse := startSSE(w, s.streamErrorBody)
	rec.Status = http.StatusOK
	sse.send(priorityAbortFrames(req)...)
	sse.done()
}

// priorityAbortFrames are the stream events of a request aborted for its
// priority (before [DONE]).
func priorityAbortFrames(req *inferRequest) []frame {
	if req.route.isOpenAI() {
		body := map[string]any{"error": errorResponse(priorityDisabledMsg, "SERVICE_UNAVAILABLE", http.StatusServiceUnavailable)}
		return []frame{{data: mustJSON(body)}}
	}
	frames := make([]frame, len(req.rids))
	for i, rid := range req.rids {
		out := map[string]any{
			"text":       "",
			"output_ids": []int{},
			"meta_info": map[string]any{
				"id": rid,
				"finish_reason": map[string]any{
					"type": finishAbort, "status_code": http.StatusServiceUnavailable, "message": priorityDisabledMsg,
				},
				"weight_version":    "default",
				"e2e_latency":       0.0,
				"completion_tokens": 0,
			},
		}
		if req.batch {
			out["index"] = i
		}
		frames[i] = frame{data: mustJSON(out)}
	}
	return frames
}

// errorResponse is SGLang's OpenAI ErrorResponse.
func errorResponse(msg, typ string, code int) map[string]any {
	return map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": code}
}

// priorityServerArgs are the priority scheduling server args /server_info
// reports, as SGLang names them.
func priorityServerArgs(cfg Config) map[string]any {
	return map[string]any{
		"enable_priority_scheduling":         cfg.EnablePriorityScheduling,
		"schedule_low_priority_values_first": cfg.ScheduleLowPriorityValuesFirst,
		"abort_on_priority_when_disabled":    cfg.AbortOnPriorityWhenDisabled,
	}
}
