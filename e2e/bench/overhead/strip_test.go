package main

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// bootstrapFixture has the layout `duet envoy-config` renders, shortened.
const bootstrapFixture = `
static_resources:
  listeners:
  - name: duet_ingress
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          stat_prefix: duet
          access_log:
          - name: envoy.access_loggers.stdout
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config: {message_timeout: 2s}
          - name: envoy.filters.http.json_to_metadata
          - name: envoy.filters.http.sse_to_metadata
          - name: envoy.filters.http.lua
          - name: envoy.filters.http.router
            typed_config:
              suppress_envoy_headers: true
              upstream_log:
              - name: envoy.access_loggers.http_grpc
`

func TestStripFeedback(t *testing.T) {
	out, err := stripFeedback([]byte(bootstrapFixture))
	if err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"access_log", "upstream_log", "json_to_metadata", "sse_to_metadata", "lua"} {
		if strings.Contains(string(out), gone) {
			t.Errorf("%s left in:\n%s", gone, out)
		}
	}
	var doc struct {
		StaticResources struct {
			Listeners []struct {
				FilterChains []struct {
					Filters []struct {
						TypedConfig struct {
							StatPrefix  string `yaml:"stat_prefix"`
							HTTPFilters []struct {
								Name string `yaml:"name"`
							} `yaml:"http_filters"`
						} `yaml:"typed_config"`
					} `yaml:"filters"`
				} `yaml:"filter_chains"`
			} `yaml:"listeners"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	hcm := doc.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig
	var names []string
	for _, f := range hcm.HTTPFilters {
		names = append(names, f.Name)
	}
	if got, want := strings.Join(names, ","), "envoy.filters.http.ext_proc,envoy.filters.http.router"; got != want || hcm.StatPrefix != "duet" {
		t.Errorf("filters %s, stat_prefix %q; want %s, duet", got, hcm.StatPrefix, want)
	}
}

func TestStripFeedbackNothingToStrip(t *testing.T) {
	if _, err := stripFeedback([]byte(directBootstrap("127.0.0.1:1", "127.0.0.1:2", "http://127.0.0.1:3"))); err == nil {
		t.Error("a bootstrap without feedback pieces was accepted")
	}
}

func TestFullDuplex(t *testing.T) {
	withMode := strings.Replace(bootstrapFixture, "typed_config: {message_timeout: 2s}",
		"typed_config: {message_timeout: 2s, processing_mode: {request_header_mode: SEND, request_body_mode: BUFFERED, request_trailer_mode: SKIP}}", 1)
	out, err := fullDuplex([]byte(withMode))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	var modes []map[string]any
	eachHTTPFilter(doc, func(f map[string]any) {
		if m := asMap(asMap(f["typed_config"])["processing_mode"]); m != nil {
			modes = append(modes, m)
		}
	})
	if len(modes) != 1 || modes[0]["request_body_mode"] != "FULL_DUPLEX_STREAMED" ||
		modes[0]["request_trailer_mode"] != "SEND" || modes[0]["request_header_mode"] != "SEND" {
		t.Errorf("processing modes after fullDuplex: %v", modes)
	}
	if _, err := fullDuplex([]byte(bootstrapFixture)); err == nil {
		t.Error("a bootstrap without a processing_mode was accepted")
	}
}
