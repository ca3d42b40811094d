package sim

// routeKind identifies an inference route.
type routeKind int

// Inference routes.
const (
	routeChat routeKind = iota + 1
	routeCompletions
	routeGenerate
	routeResponses
)

// isOpenAI reports whether the route is an OpenAI-compatible route (these
// honour X-Data-Parallel-Rank and answer errors with ErrorResponse).
func (r routeKind) isOpenAI() bool { return r != routeGenerate }

// path returns the HTTP path of the route.
func (r routeKind) path() string {
	switch r {
	case routeChat:
		return "/v1/chat/completions"
	case routeCompletions:
		return "/v1/completions"
	case routeGenerate:
		return "/generate"
	case routeResponses:
		return "/v1/responses"
	}
	return ""
}
