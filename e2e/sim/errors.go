package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// statusClientClosed is the status recorded when the client went away
// before the request finished (nginx's 499).
const statusClientClosed = 499

// apiError is a request failure with the HTTP status SGLang would use.
type apiError struct {
	status int
	msg    string
}

// Error implements error.
func (e *apiError) Error() string { return e.msg }

// badRequestf builds a 400 error.
func badRequestf(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// internalErrorf builds a 500 error.
func internalErrorf(format string, args ...any) *apiError {
	return &apiError{status: http.StatusInternalServerError, msg: fmt.Sprintf(format, args...)}
}

// openAIErrorType maps a status to the "type" SGLang's OpenAI layer reports.
func openAIErrorType(status int) string {
	switch {
	case status == http.StatusNotFound:
		return "NotFoundError"
	case status >= 500:
		return "InternalServerError"
	default:
		return "BadRequestError"
	}
}

// errorBody renders err the way SGLang does on the given route: the OpenAI
// ErrorResponse on /v1/*, {"error":{"message":...}} on /generate.
func errorBody(route routeKind, err *apiError) []byte {
	var v any
	if route.isOpenAI() {
		v = map[string]any{
			"object":  "error",
			"message": err.msg,
			"type":    openAIErrorType(err.status),
			"param":   nil,
			"code":    err.status,
		}
	} else {
		v = map[string]any{"error": map[string]any{"message": err.msg}}
	}
	b, _ := json.Marshal(v)
	return b
}

// streamErrorBody is the SSE payload SGLang sends when a request fails after
// a streaming response has started.
func streamErrorBody(err *apiError) []byte {
	b, _ := json.Marshal(map[string]any{
		"error": map[string]any{"message": err.msg, "code": err.status},
	})
	return b
}

// writeJSON writes v as a JSON response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("encode response: %v", err), http.StatusInternalServerError)
		return
	}
	writeRawJSON(w, status, b)
}

// writeRawJSON writes already-encoded JSON with the given status.
func writeRawJSON(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeDetail writes a FastAPI-style {"detail": msg} error.
func writeDetail(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"detail": msg})
}
