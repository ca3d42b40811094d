package harness

import "fmt"

// HeaderRoutes finds every route of a parsed Envoy bootstrap (a mapping
// with match and route, wherever it stands) that matches header exactly,
// and returns the cluster each such value routes to: for duet's pools and
// x-duet-pool, pool name to cluster.
func HeaderRoutes(bootstrap any, header string) map[string]string {
	routes := map[string]string{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			match, okM := v["match"].(map[string]any)
			route, okR := v["route"].(map[string]any)
			if okM && okR {
				headers, _ := match["headers"].([]any)
				for _, h := range headers {
					h, _ := h.(map[string]any)
					sm, _ := h["string_match"].(map[string]any)
					if h["name"] == header && sm["exact"] != nil {
						routes[fmt.Sprint(sm["exact"])], _ = route["cluster"].(string)
					}
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(bootstrap)
	return routes
}
