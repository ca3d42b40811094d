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

// HasRID reports whether SGLang's request model on the route has a rid
// field (its responses API has none), so that duet can name the request
// to /abort_request.
func (r Route) HasRID() bool { return r == RouteChat || r == RouteCompletions || r == RouteGenerate }

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

// adminPaths are SGLang endpoints that act on the engine as a whole or on
// other clients' requests (abort, cache flush, weight updates, profiling,
// memory release, shutdown). Through duet they would let one client abort or
// stall everyone's requests, so duet refuses them; operators reach the
// engines directly.
var adminPaths = map[string]bool{
	"/abort_request":                    true,
	"/flush_cache":                      true,
	"/update_weights_from_disk":         true,
	"/update_weights_from_tensor":       true,
	"/update_weights_from_distributed":  true,
	"/init_weights_update_group":        true,
	"/update_weight_version":            true,
	"/release_memory_occupation":        true,
	"/resume_memory_occupation":         true,
	"/start_profile":                    true,
	"/stop_profile":                     true,
	"/start_expert_distribution_record": true,
	"/stop_expert_distribution_record":  true,
	"/dump_expert_distribution_record":  true,
	"/configure_logging":                true,
	"/set_internal_state":               true,
	"/pause_generation":                 true,
	"/continue_generation":              true,
	"/slow_down":                        true,
	"/shutdown":                         true,
	"/load_lora_adapter":                true,
	"/unload_lora_adapter":              true,
	"/open_session":                     true,
	"/close_session":                    true,
}

// AdminPath reports whether path (query included or not) is an engine
// administration endpoint that clients must not reach through duet.
func AdminPath(path string) bool {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	return adminPaths[strings.TrimSuffix(path, "/")]
}
