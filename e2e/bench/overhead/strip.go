package main

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// isFeedbackFilter reports whether an HTTP filter of the rendered
// bootstrap exists only for completion feedback and error envelopes: the
// usage parsers and the Lua error mapper.
func isFeedbackFilter(name string) bool {
	switch name {
	case "envoy.filters.http.json_to_metadata", "envoy.filters.http.sse_to_metadata", "envoy.filters.http.lua":
		return true
	}
	return false
}

// stripFeedback returns the Envoy bootstrap rendered by `duet envoy-config`
// without its access logs (the connection manager's access_log and the
// router's upstream_log, stdout and gRPC) and without the feedback filters,
// leaving ext_proc and the router: the "ext_proc only" variant. It fails if
// the bootstrap has none of these pieces, so a change of the rendered
// layout is noticed rather than measured as nothing.
func stripFeedback(bootstrap []byte) ([]byte, error) {
	return editBootstrap(bootstrap, "strip", func(doc map[string]any) error {
		removed := 0
		eachConnectionManager(doc, func(hcm map[string]any) {
			if _, ok := hcm["access_log"]; ok {
				delete(hcm, "access_log")
				removed++
			}
			httpFilters, _ := hcm["http_filters"].([]any)
			kept := httpFilters[:0:0]
			for _, hf := range httpFilters {
				m := asMap(hf)
				name, _ := m["name"].(string)
				if isFeedbackFilter(name) {
					removed++
					continue
				}
				if tc := asMap(m["typed_config"]); tc != nil {
					if _, ok := tc["upstream_log"]; ok {
						delete(tc, "upstream_log")
						removed++
					}
				}
				kept = append(kept, hf)
			}
			if httpFilters != nil {
				hcm["http_filters"] = kept
			}
		})
		if removed == 0 {
			return fmt.Errorf("no access log or feedback filter found")
		}
		return nil
	})
}

// editBootstrap parses bootstrap, lets edit change it, and renders it
// again; what names the edit in errors.
func editBootstrap(bootstrap []byte, what string, edit func(doc map[string]any) error) ([]byte, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(bootstrap, &doc); err != nil {
		return nil, fmt.Errorf("%s bootstrap: parse: %w", what, err)
	}
	if err := edit(doc); err != nil {
		return nil, fmt.Errorf("%s bootstrap: %w", what, err)
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("%s bootstrap: render: %w", what, err)
	}
	return out, nil
}

// eachConnectionManager calls fn with the typed config of every listener
// filter of doc (the HTTP connection managers).
func eachConnectionManager(doc map[string]any, fn func(hcm map[string]any)) {
	resources, _ := doc["static_resources"].(map[string]any)
	listeners, _ := resources["listeners"].([]any)
	for _, l := range listeners {
		chains, _ := asMap(l)["filter_chains"].([]any)
		for _, c := range chains {
			filters, _ := asMap(c)["filters"].([]any)
			for _, f := range filters {
				if hcm := asMap(asMap(f)["typed_config"]); hcm != nil {
					fn(hcm)
				}
			}
		}
	}
}

// asMap returns v as a YAML mapping, or nil.
func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// fullDuplex switches the ext_proc filters of a bootstrap to
// FULL_DUPLEX_STREAMED request bodies (which requires sending the request
// trailers too): the "floor full-duplex" variant. It fails if the
// bootstrap has no ext_proc filter.
func fullDuplex(bootstrap []byte) ([]byte, error) {
	return editBootstrap(bootstrap, "full-duplex", func(doc map[string]any) error {
		changed := 0
		eachHTTPFilter(doc, func(f map[string]any) {
			if name, _ := f["name"].(string); name != "envoy.filters.http.ext_proc" {
				return
			}
			mode := asMap(asMap(f["typed_config"])["processing_mode"])
			if mode == nil {
				return
			}
			mode["request_body_mode"] = "FULL_DUPLEX_STREAMED"
			mode["request_trailer_mode"] = "SEND"
			changed++
		})
		if changed == 0 {
			return fmt.Errorf("no ext_proc filter with a processing_mode found")
		}
		return nil
	})
}

// eachHTTPFilter calls fn with every HTTP filter of every connection
// manager in doc.
func eachHTTPFilter(doc map[string]any, fn func(map[string]any)) {
	eachConnectionManager(doc, func(hcm map[string]any) {
		httpFilters, _ := hcm["http_filters"].([]any)
		for _, hf := range httpFilters {
			if m := asMap(hf); m != nil {
				fn(m)
			}
		}
	})
}
