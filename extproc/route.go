package extproc

import "strings"

// Route is the kind of request, decided from its path.
type Route int

// Routes duet understands. RouteOther passes through to a decode engine,
// unchanged and never mirrored.
const (
	RouteOther Route = iota
	RouteChat
	RouteCompletions
	RouteGenerate
	RouteResponses
)

var routeNames = [...]string{"other", "chat", "completions", "generate", "responses"}

// String returns the route's metric label.
func (r Route) String() string { return routeNames[r] }

// Inference reports whether the route carries an inference body that duet
// rewrites and (in PD mode) mirrors.
func (r Route) Inference() bool { return r != RouteOther }

// OpenAI reports whether SGLang honours the X-Data-Parallel-Rank header on the
// route (it ignores it on /generate as of v0.5.19).
func (r Route) OpenAI() bool { return r == RouteChat || r == RouteCompletions || r == RouteResponses }

// ClassifyRoute maps a request method and :path (query included or not) to a Route.
func ClassifyRoute(method, path string) Route {
	if method != "POST" {
		return RouteOther
	}
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch path {
	case "/v1/chat/completions":
		return RouteChat
	case "/v1/completions":
		return RouteCompletions
	case "/generate":
		return RouteGenerate
	case "/v1/responses":
		return RouteResponses
	}
	return RouteOther
}
