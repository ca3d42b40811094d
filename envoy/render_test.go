package envoy

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy/contract"
)

func params() Params {
	return Params{
		Listen: Address{"127.0.0.1", 8080}, Admin: Address{"127.0.0.1", 9901}, Duet: Address{"127.0.0.1", 9002},
		MaxBodyBytes: 32 << 20, MessageTimeout: 2 * time.Second, StreamIdleTimeout: 15 * time.Minute, MaxRoutingRequests: 256,
		Prefill: []Address{{"10.0.0.1", 30000}}, Decode: []Address{{"10.0.0.2", 30000}, {"10.0.0.3", 30000}},
	}
}

// Every variant of the bootstrap must load in the real Envoy.
func TestRenderValidatesInEnvoy(t *testing.T) {
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	creds, err := harness.MakeCredentials(context.Background(), tools.Duet, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*Params)
		want   []string
		absent []string
	}{
		{"pd", func(*Params) {},
			[]string{"cluster_header: x-duet-mirror", "name: duet_prefill", "header: x-duet-prefill-endpoint",
				"header: x-duet-decode-endpoint", "type: STATIC", "per_connection_buffer_limit_bytes: 33554432",
				"request_body_mode: BUFFERED", "failure_mode_allow: false", `prefix: "x-duet-"`,
				"log_name: duet_downstream", "log_name: duet_upstream", "buffer_size_bytes: 0",
				"envoy.filters.http.json_to_metadata", "envoy.filters.http.sse_to_metadata"},
			nil},
		{"aggregated", func(p *Params) { p.Prefill = nil },
			[]string{"name: duet_decode", "log_name: duet_downstream", "log_name: duet_upstream"},
			[]string{"request_mirror_policies", "duet_prefill"}},
		{"headless services", func(p *Params) {
			p.Headless = true
			p.Prefill = []Address{{"sglang-prefill.inference.svc.cluster.local", 30000}}
			p.Decode = []Address{{"sglang-decode.inference.svc.cluster.local", 30000}}
		}, []string{"type: STRICT_DNS", "dns_lookup_family: ALL", "dns_refresh_rate: 1s",
			`address: "sglang-decode.inference.svc.cluster.local", port_value: 30000`,
			`address: "sglang-prefill.inference.svc.cluster.local", port_value: 30000`},
			[]string{"type: STATIC\n    dns"}},
		{"headless aggregated", func(p *Params) {
			p.Headless = true
			p.Prefill = nil
			p.Decode = []Address{{"sglang.inference.svc.cluster.local", 8000}}
		}, []string{"dns_lookup_family: ALL", `address: "sglang.inference.svc.cluster.local", port_value: 8000`},
			[]string{"duet_prefill"}},
		{"dns names", func(p *Params) { p.Decode = []Address{{"localhost", 30000}} },
			[]string{"type: STRICT_DNS"}, []string{"dns_lookup_family", "dns_refresh_rate"}},
		{"sub-second timeout", func(p *Params) { p.MessageTimeout = 500 * time.Millisecond }, []string{"message_timeout: 0.5s"}, nil},
		{"admission queue", func(p *Params) { p.MaxMessageTimeout = 31 * time.Second }, []string{"message_timeout: 2s", "max_message_timeout: 31s",
			"initial_metadata:\n                - {key: x-duet-envoy-message-timeout, value: 2s}\n                - {key: x-duet-envoy-max-message-timeout, value: 31s}"}, nil},
		{"no admission queue: Envoy honours no override", func(*Params) {}, []string{"- {key: x-duet-envoy-message-timeout, value: 2s}\n                - {key: x-duet-envoy-max-message-timeout, value: 2s}"},
			[]string{"max_message_timeout:"}},
		{"mutual TLS and token to duet", func(p *Params) {
			p.DuetTLS = &ClientTLS{CertFile: creds.EnvoyCertFile, KeyFile: creds.EnvoyKeyFile, CAFile: creds.CAFile, ServerName: "duet"}
			p.DuetToken = creds.Token
		}, []string{"transport_socket:", `sni: "duet"`, "alpn_protocols: [h2]", "tls_maximum_protocol_version: TLSv1_3", `certificate_chain: {filename: "` + creds.EnvoyCertFile + `"}`,
			`trusted_ca: {filename: "` + creds.CAFile + `"}`, "matcher: {exact: \"duet\"}",
			`initial_metadata: [{key: authorization, value: "Bearer ` + creds.Token + `"}]`,
			"# duet's bearer token (auth.token_file): this file holds a secret.\n                - {key: authorization, value: \"Bearer " + creds.Token + `"}`},
			nil},
		{"routing request limit", func(p *Params) { p.MaxRoutingRequests = 64 }, []string{"{max_requests: 64, max_pending_requests: 64, max_retries: 64}"}, nil},
		{"duet replicas", func(p *Params) {
			p.DuetReplicas = []Address{{"10.0.1.1", 9002}, {"10.0.1.2", 9002}, {"fd00::3", 9102}}
		}, []string{`address: "10.0.1.1", port_value: 9002`, `address: "10.0.1.2", port_value: 9002`, `address: "fd00::3", port_value: 9102`,
			"grpc_health_check: {}", "interval: 0.25s", "consecutive_local_origin_failure: 1", "healthy_panic_threshold: {value: 1}",
			"envoy.retry_host_predicates.previous_hosts"},
			[]string{`address: "127.0.0.1", port_value: 9002`, "name: duet_extproc\n    type: STRICT_DNS"}},
		{"duet replicas with TLS", func(p *Params) {
			p.DuetReplicas = []Address{{"10.0.1.1", 9002}, {"10.0.1.2", 9002}}
			p.DuetTLS = &ClientTLS{CertFile: creds.EnvoyCertFile, KeyFile: creds.EnvoyKeyFile, CAFile: creds.CAFile, ServerName: "duet"}
		}, []string{"transport_socket:", "grpc_health_check: {}"}, nil},
		{"duet headless service", func(p *Params) { p.Duet = Address{"duet.inference.svc.cluster.local", 9002} },
			[]string{"name: duet_extproc\n    type: STRICT_DNS\n    # A name may resolve to several duet replicas",
				"name: duet_feedback\n    type: STRICT_DNS\n    # A name may resolve to several duet replicas", "dns_lookup_family: ALL"}, nil},
		{"tracing", func(p *Params) {
			p.Tracing = &Tracing{Collector: Address{"127.0.0.1", 4317}, SamplingPercent: 0.5, ServiceName: "duet-envoy"}
		}, []string{"sampling_percentage: {numerator: 5000, denominator: MILLION}", "envoy.tracers.opentelemetry.samplers.parent_based",
			"envoy.tracers.opentelemetry.samplers.trace_id_ratio_based", "spawn_upstream_span: true", "name: envoy.tracers.opentelemetry",
			"envoy_grpc: {cluster_name: duet_otlp}", "service_name: duet-envoy", "  - name: duet_otlp\n    type: STATIC",
			`address: "127.0.0.1", port_value: 4317`,
			"additional_request_headers_to_log: [x-duet-request-id, x-request-id, x-data-parallel-rank, traceparent]",
			"pack_trace_reason: false", "use_request_id_for_trace_sampling: false"}, nil},
		{"tracing to a collector by name", func(p *Params) {
			p.Tracing = &Tracing{Collector: Address{"otel-collector.observability", 4317}, SamplingPercent: 100, ServiceName: "envoy"}
		}, []string{"sampling_percentage: {numerator: 1000000, denominator: MILLION}", "  - name: duet_otlp\n    type: STRICT_DNS", "service_name: envoy"},
			[]string{"random_sampling: {"}},
		{"no tracing", func(*Params) {}, nil, []string{"tracing:", "duet_otlp", "traceparent", "request_id_extension"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := params()
			tt.mutate(&p)
			var buf bytes.Buffer
			if err := Render(&buf, p); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("bootstrap lacks %q", w)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(out, a) {
					t.Errorf("bootstrap has %q", a)
				}
			}
			path := filepath.Join(t.TempDir(), "envoy.yaml")
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(tools.Envoy, "--mode", "validate", "-c", path, "--disable-hot-restart", "--log-level", "warn")
			log, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("envoy rejects the bootstrap: %v\n%s", err, log)
			}
			checkWorkInProgress(t, log)
		})
	}
}

// workInProgress are the work-in-progress protos a rendered bootstrap may
// use, each with the number of warnings Envoy prints for it at every start
// (--log-level warn included) and why duet keeps it. Every one belongs to
// sse_to_metadata, which gives duet the token usage of streamed responses
// (docs/envoy-contract.md, claim 19): Envoy validates the filter's config
// twice, and its JSON content parser once, with one RuleConfig per rule
// (prompt_tokens, completion_tokens).
var workInProgress = map[string]int{
	"envoy.extensions.filters.http.sse_to_metadata.v3.SseToMetadata":                 2,
	"envoy.extensions.filters.http.sse_to_metadata.v3.SseToMetadata.ProcessingRules": 2,
	"envoy.extensions.content_parsers.json.v3.JsonContentParser":                     1,
	"envoy.extensions.content_parsers.json.v3.JsonContentParser.RuleConfig":          2,
}

// wipWarning is Envoy's warning about a work-in-progress proto message.
var wipWarning = regexp.MustCompile(`message '([\w.]+)' is contained in proto file '[^']*' marked as work-in-progress`)

// checkWorkInProgress holds Envoy's output to the work-in-progress warnings
// of workInProgress, message by message.
func checkWorkInProgress(t *testing.T, out []byte) {
	t.Helper()
	got := map[string]int{}
	for _, m := range wipWarning.FindAllSubmatch(out, -1) {
		got[string(m[1])]++
	}
	if !maps.Equal(got, workInProgress) {
		t.Errorf("work-in-progress warnings %v, want %v", got, workInProgress)
	}
}

func TestRenderRejectsBadParams(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Params)
	}{
		{"no decode", func(p *Params) { p.Decode = nil }},
		{"no body limit", func(p *Params) { p.MaxBodyBytes = 0 }},
		{"no timeout", func(p *Params) { p.MessageTimeout = 0 }},
		{"no routing request limit", func(p *Params) { p.MaxRoutingRequests = 0 }},
		{"max message timeout below the message timeout", func(p *Params) { p.MaxMessageTimeout = time.Second }},
		{"yaml injection", func(p *Params) { p.Decode = []Address{{"a\"}\n- x", 1}} }},
		{"empty host", func(p *Params) { p.Duet = Address{"", 1} }},
		{"empty replica host", func(p *Params) { p.DuetReplicas = []Address{{"10.0.1.1", 9002}, {"", 9002}} }},
		{"headless IP", func(p *Params) { p.Headless = true }},
		{"pools and engines outside them", func(p *Params) { p.Pools = twoPools() }},
		{"a pool without a name", func(p *Params) {
			p.Prefill, p.Decode, p.Pools = nil, nil, twoPools()
			p.Pools[1].Name = ""
		}},
		{"a cluster in two pools", func(p *Params) {
			p.Prefill, p.Decode, p.Pools = nil, nil, twoPools()
			p.Pools[1].DecodeCluster = p.Pools[0].PrefillCluster
		}},
		{"a pool's cluster named as duet's", func(p *Params) {
			p.Prefill, p.Decode, p.Pools = nil, nil, twoPools()
			p.Pools[1].DecodeCluster = ClusterDuet
		}},
		{"tracing sampled above 100%", func(p *Params) {
			p.Tracing = &Tracing{Collector: Address{"127.0.0.1", 4317}, SamplingPercent: 101, ServiceName: "envoy"}
		}},
		{"tracing without a collector port", func(p *Params) {
			p.Tracing = &Tracing{Collector: Address{"127.0.0.1", 0}, SamplingPercent: 1, ServiceName: "envoy"}
		}},
		{"tracing service name that breaks the YAML", func(p *Params) {
			p.Tracing = &Tracing{Collector: Address{"127.0.0.1", 4317}, SamplingPercent: 1, ServiceName: "a: b"}
		}},
		{"a pool without decode engines", func(p *Params) {
			p.Prefill, p.Decode, p.Pools = nil, nil, twoPools()
			p.Pools[1].Decode = nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := params()
			tt.mutate(&p)
			if err := Render(&bytes.Buffer{}, p); err == nil {
				t.Fatal("Render accepted bad params")
			}
		})
	}
}

// renderDoc renders p and decodes the bootstrap.
func renderDoc(t *testing.T, p Params) (*bytes.Buffer, any) {
	t.Helper()
	var buf bytes.Buffer
	if err := Render(&buf, p); err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	return &buf, doc
}

// twoPools is a PD pool and an aggregated pool.
func twoPools() []Pool {
	return []Pool{
		{Name: "deepseek", DecodeCluster: "duet_deepseek_decode", PrefillCluster: "duet_deepseek_prefill",
			Prefill: []Address{{"10.0.0.1", 30000}}, Decode: []Address{{"10.0.0.2", 30000}}},
		{Name: "qwen", DecodeCluster: "duet_qwen_decode", PrefillCluster: "duet_qwen_prefill",
			Decode: []Address{{"10.0.1.1", 8000}, {"10.0.1.2", 8000}}},
	}
}

// With pools, each pool gets a route chosen by x-duet-pool and its own
// clusters; only the PD pool's route mirrors, and only its decode cluster
// writes the decode rank into /generate bodies. Envoy loads it.
func TestRenderPools(t *testing.T) {
	p := params()
	p.Prefill, p.Decode, p.Pools = nil, nil, twoPools()
	buf, doc := renderDoc(t, p)
	hcm := node(t, doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	routes := node(t, hcm, "route_config", "virtual_hosts", 0, "routes").([]any)
	if len(routes) != 2 {
		t.Fatalf("%d routes, want one per pool", len(routes))
	}
	for i, pool := range twoPools() {
		r := routes[i]
		match := node(t, r, "match", "headers", 0)
		if fmt.Sprint(node(t, match, "name")) != contract.HeaderPool || fmt.Sprint(node(t, match, "string_match", "exact")) != pool.Name {
			t.Errorf("route %d matches %v, want %s: %s", i, match, contract.HeaderPool, pool.Name)
		}
		if got := node(t, r, "route", "cluster"); got != pool.DecodeCluster {
			t.Errorf("route %d goes to %v, want %s", i, got, pool.DecodeCluster)
		}
		_, mirrors := node(t, r, "route").(map[string]any)["request_mirror_policies"]
		if mirrors != pool.PD() {
			t.Errorf("route %d (%s) mirrors: %v, want %v", i, pool.Name, mirrors, pool.PD())
		}
	}
	clusters := map[string]any{}
	for _, c := range node(t, doc, "static_resources", "clusters").([]any) {
		clusters[fmt.Sprint(node(t, c, "name"))] = c
	}
	for name, wantLua := range map[string]bool{"duet_deepseek_decode": true, "duet_deepseek_prefill": false, "duet_qwen_decode": false} {
		c, ok := clusters[name]
		if !ok {
			t.Errorf("no cluster %s", name)
			continue
		}
		out, _ := yaml.Marshal(c)
		if got := strings.Contains(string(out), "envoy.filters.http.lua"); got != wantLua {
			t.Errorf("cluster %s has the body-rank Lua filter: %v, want %v", name, got, wantLua)
		}
	}
	for _, absent := range []string{"duet_qwen_prefill", "name: duet_decode", "name: duet_prefill"} {
		if strings.Contains(buf.String(), absent) {
			t.Errorf("bootstrap has %q", absent)
		}
	}
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tools.Envoy, "--mode", "validate", "-c", path, "--disable-hot-restart").CombinedOutput(); err != nil {
		t.Fatalf("envoy rejects the bootstrap: %v\n%s", err, out)
	}
}

func TestParseAddress(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Address
		ok   bool
	}{
		{"127.0.0.1:80", Address{"127.0.0.1", 80}, true},
		{":9002", Address{"0.0.0.0", 9002}, true},
		{"[::1]:9002", Address{"::1", 9002}, true},
		{"host:70000", Address{}, false},
		{"nohost", Address{}, false},
	} {
		got, err := ParseAddress(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("ParseAddress(%q) = %v, %v", tt.in, got, err)
		}
	}
}

// node walks a decoded YAML document: string keys index maps, ints index
// lists. It fails the test when the path does not exist.
func node(t *testing.T, doc any, path ...any) any {
	t.Helper()
	cur := doc
	for i, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := cur.(map[string]any)
			if !ok {
				t.Fatalf("%v: not a map at %v", path, path[:i])
			}
			if cur, ok = m[k]; !ok {
				t.Fatalf("%v: no key %q", path, k)
			}
		case int:
			l, ok := cur.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("%v: no item %d", path, k)
			}
			cur = l[k]
		}
	}
	return cur
}

// The completion-feedback pieces sit where they must: a gRPC access log on
// the connection manager and on the router (the router's covers the
// mirror), both to duet's cluster, unbatched, logging the correlation
// headers; the usage filters between ext_proc and the router.
func TestRenderFeedback(t *testing.T) {
	var buf bytes.Buffer
	if err := Render(&buf, params()); err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	hcm := node(t, doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	filters := node(t, hcm, "http_filters").([]any)
	var names []string
	for i := range filters {
		names = append(names, node(t, filters[i], "name").(string))
	}
	wantFilters := "[envoy.filters.http.ext_proc envoy.filters.http.json_to_metadata envoy.filters.http.sse_to_metadata envoy.filters.http.lua envoy.filters.http.router]"
	if got := fmt.Sprint(names); got != wantFilters {
		t.Errorf("http_filters %s, want %s", got, wantFilters)
	}
	router := node(t, filters[len(filters)-1], "typed_config")
	for _, tt := range []struct {
		logName string
		loggers any
	}{
		{contract.LogDownstream, node(t, hcm, "access_log")},
		{contract.LogUpstream, node(t, router, "upstream_log")},
	} {
		loggers := tt.loggers.([]any)
		if len(loggers) != 2 || node(t, loggers[0], "name") != "envoy.access_loggers.stdout" {
			t.Errorf("%s: want the stdout logger kept, then the gRPC one: %v", tt.logName, loggers)
			continue
		}
		grpcLog := node(t, loggers[1], "typed_config")
		common := node(t, grpcLog, "common_config")
		for _, c := range []struct {
			path []any
			want any
		}{
			{[]any{"log_name"}, tt.logName},
			{[]any{"transport_api_version"}, "V3"},
			{[]any{"grpc_service", "envoy_grpc", "cluster_name"}, ClusterFeedback},
			{[]any{"buffer_size_bytes"}, 0},
		} {
			if got := node(t, common, c.path...); got != c.want {
				t.Errorf("%s: %v = %v, want %v", tt.logName, c.path, got, c.want)
			}
		}
		if got := fmt.Sprint(node(t, grpcLog, "additional_request_headers_to_log")); got != fmt.Sprint(LoggedRequestHeaders) {
			t.Errorf("%s: logged headers %s, want %v", tt.logName, got, LoggedRequestHeaders)
		}
	}
	// JSON: OpenAI usage and /generate meta_info; SSE: OpenAI usage only.
	for _, tt := range []struct {
		rules []any
		want  string
	}{
		{node(t, filters[1], "typed_config", "response_rules", "rules").([]any),
			"usage.prompt_tokens usage.completion_tokens meta_info.prompt_tokens meta_info.completion_tokens"},
		{node(t, filters[2], "typed_config", "response_rules", "content_parser", "typed_config", "rules").([]any),
			"usage.prompt_tokens usage.completion_tokens"},
	} {
		var got []string
		for _, r := range tt.rules {
			if rule, ok := r.(map[string]any)["rule"]; ok {
				r = rule
			}
			key := node(t, r, "selectors", 0, "key").(string) + "." + node(t, r, "selectors", 1, "key").(string)
			if dst := node(t, r, "on_present"); node(t, dst, "metadata_namespace") != "duet" || node(t, dst, "type") != "NUMBER" ||
				node(t, dst, "key") != node(t, r, "selectors", 1, "key") {
				t.Errorf("rule %s writes %v", key, dst)
			}
			got = append(got, key)
		}
		if strings.Join(got, " ") != tt.want {
			t.Errorf("usage rules %v, want %s", got, tt.want)
		}
	}
}

// Both clusters to duet list every replica and skip a dead one: gRPC
// health checks, ejection at the first refused connection, panic only
// with no replica healthy. Every stream to duet is retried on another
// replica when its own refuses it; only the ext_proc stream also when
// the replica resets it before answering (an access-log stream would
// replay entries the replica already took).
func TestRenderDuetClusters(t *testing.T) {
	p := params()
	p.DuetReplicas = []Address{{"10.0.1.1", 9002}, {"10.0.1.2", 9002}, {"10.0.1.3", 9102}}
	_, doc := renderDoc(t, p)
	clusters := map[string]any{}
	for _, c := range node(t, doc, "static_resources", "clusters").([]any) {
		clusters[node(t, c, "name").(string)] = c
	}
	for _, name := range []string{ClusterDuet, ClusterFeedback} {
		cluster, ok := clusters[name]
		if !ok {
			t.Fatalf("no cluster %s", name)
		}
		var hosts []string
		for _, e := range node(t, cluster, "load_assignment", "endpoints", 0, "lb_endpoints").([]any) {
			sa := node(t, e, "endpoint", "address", "socket_address")
			hosts = append(hosts, fmt.Sprintf("%v:%v", node(t, sa, "address"), node(t, sa, "port_value")))
		}
		if got := strings.Join(hosts, " "); got != "10.0.1.1:9002 10.0.1.2:9002 10.0.1.3:9102" {
			t.Errorf("%s: hosts %s, want every replica", name, got)
		}
		for _, c := range []struct {
			path []any
			want any
		}{
			{[]any{"health_checks", 0, "interval"}, "0.25s"},
			{[]any{"health_checks", 0, "no_traffic_interval"}, "0.25s"},
			{[]any{"health_checks", 0, "unhealthy_threshold"}, DuetUnhealthyThreshold},
			{[]any{"health_checks", 0, "healthy_threshold"}, 1},
			{[]any{"outlier_detection", "split_external_local_origin_errors"}, true},
			{[]any{"outlier_detection", "consecutive_local_origin_failure"}, 1},
			{[]any{"outlier_detection", "max_ejection_percent"}, 100},
			{[]any{"outlier_detection", "base_ejection_time"}, "1s"},
			{[]any{"common_lb_config", "healthy_panic_threshold", "value"}, 1},
		} {
			if got := node(t, cluster, c.path...); got != c.want {
				t.Errorf("%s: %v = %v, want %v", name, c.path, got, c.want)
			}
		}
		if hc := node(t, cluster, "health_checks", 0, "grpc_health_check"); hc == nil {
			t.Errorf("%s: no gRPC health check", name)
		}
	}

	hcm := node(t, doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	filters := node(t, hcm, "http_filters").([]any)
	router := node(t, filters[len(filters)-1], "typed_config")
	for _, tt := range []struct {
		what    string
		service any
		retryOn string
	}{
		{"ext_proc", node(t, filters[0], "typed_config", "grpc_service"), "connect-failure,refused-stream,reset,unavailable"},
		{"downstream access log", node(t, hcm, "access_log", 1, "typed_config", "common_config", "grpc_service"), "connect-failure,refused-stream"},
		{"upstream access log", node(t, router, "upstream_log", 1, "typed_config", "common_config", "grpc_service"), "connect-failure,refused-stream"},
	} {
		for _, c := range []struct {
			path []any
			want any
		}{
			{[]any{"retry_policy", "retry_on"}, tt.retryOn},
			{[]any{"retry_policy", "num_retries"}, DuetStreamRetries},
			{[]any{"retry_policy", "retry_host_predicate", 0, "name"}, "envoy.retry_host_predicates.previous_hosts"},
			{[]any{"retry_policy", "retry_back_off", "base_interval"}, "0.01s"},
		} {
			if got := node(t, tt.service, c.path...); got != c.want {
				t.Errorf("%s: %v = %v, want %v", tt.what, c.path, got, c.want)
			}
		}
	}
}

// Envoy's own error replies say what happened in the OpenAI error
// envelope, and never show the client Envoy's response code details (the
// access logs have them): duet's replies as they are; the ext_proc
// filter's message timeout (504) and its other failures (503) by their
// details; a body above the limit, no route, the router's upstream
// failures (a response flag); then Envoy's own words.
func TestRenderLocalReplies(t *testing.T) {
	p := params()
	p.MaxBodyBytes = 1 << 20
	buf, doc := renderDoc(t, p)
	hcm := node(t, doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	mappers := node(t, hcm, "local_reply_config", "mappers").([]any)
	celFilter := func(expr string) map[string]any {
		return map[string]any{"extension_filter": map[string]any{
			"name": "envoy.access_loggers.extension_filters.cel",
			"typed_config": map[string]any{
				"@type":      "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
				"expression": expr,
			},
		}}
	}
	status := func(op string, code int, key string) map[string]any {
		return map[string]any{"status_code_filter": map[string]any{"comparison": map[string]any{
			"op": op, "value": map[string]any{"default_value": code, "runtime_key": key}}}}
	}
	tests := []struct {
		filter       map[string]any
		message, typ string // empty: the reply is left as it is
	}{
		{map[string]any{"metadata_filter": map[string]any{
			"matcher":                map[string]any{"filter": "duet", "path": []any{map[string]any{"key": "local_reply"}}, "value": map[string]any{"bool_match": true}},
			"match_if_key_not_found": false,
		}}, "", ""},
		{celFilter("response.code_details == 'ext_proc_error_per-message_timeout_exceeded'"), MessageRouterTimeout, "server_error"},
		{celFilter("response.code_details.startsWith('ext_proc_error')"), MessageRouterUnavailable, "server_error"},
		{status("EQ", 413, "duet.local_reply.body_too_large"), "request body exceeds the 1048576-byte limit", "invalid_request_error"},
		{celFilter("response.code_details == 'response_payload_too_large'"), ResponseTooLargeMessage(1 << 20), "server_error"},
		{map[string]any{"response_flag_filter": map[string]any{"flags": []any{"NR"}}}, MessageNoRoute, "invalid_request_error"},
		{map[string]any{"and_filter": map[string]any{"filters": []any{
			map[string]any{"response_flag_filter": map[string]any{}}, status("GE", 500, "duet.local_reply.server_error")}}},
			MessageEngineFailed, "server_error"},
		{status("GE", 500, "duet.local_reply.server_error"), "%LOCAL_REPLY_BODY%", "server_error"},
		{status("GE", 400, "duet.local_reply.client_error"), "%LOCAL_REPLY_BODY%", "invalid_request_error"},
	}
	if len(mappers) != len(tests) {
		t.Fatalf("%d mappers, want %d", len(mappers), len(tests))
	}
	for i, tt := range tests {
		m := mappers[i].(map[string]any)
		if got := m["filter"]; !reflect.DeepEqual(got, any(tt.filter)) {
			t.Errorf("mapper %d: filter %v, want %v", i, got, tt.filter)
		}
		override, ok := m["body_format_override"]
		if tt.message == "" {
			if ok {
				t.Errorf("mapper %d rewrites duet's own replies: %v", i, override)
			}
			continue
		}
		want := map[string]any{"content_type": "application/json", "json_format": map[string]any{"error": map[string]any{
			"message": tt.message, "type": tt.typ, "code": "%RESPONSE_CODE%"}}}
		if !reflect.DeepEqual(override, any(want)) {
			t.Errorf("mapper %d: body %v, want %v", i, override, want)
		}
	}
	if strings.Contains(buf.String(), "message: \"%LOCAL_REPLY_BODY% (") || strings.Contains(buf.String(), "(%RESPONSE_CODE_DETAILS%)") {
		t.Error("a local reply shows the client Envoy's response code details")
	}
}
