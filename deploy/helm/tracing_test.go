package helm

import (
	"fmt"
	"github.com/duet-router/duet/e2e/harness"
	"math"
	"net"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"gopkg.in/yaml.v3"
)

// checkTracing: duet's otlp section is exactly the value set's (the otlp
// values under duet's keys, duet's defaults where a value is empty), and
// absent, tracing off, where otlp.enabled is false. That duet loads it is
// checkDuetAndEnvoy's; what Envoy's bootstrap makes of it,
// checkTracingBootstrap's.
func checkTracing(t *testing.T, vs valueSet, objs map[string]object) {
	got, ok := duetConfig(objs)["otlp"]
	switch {
	case vs.otlp == nil && ok:
		t.Errorf("otlp rendered as %v, but tracing is off", got)
	case vs.otlp != nil && !reflect.DeepEqual(got, any(vs.otlp)):
		t.Errorf("otlp rendered as\n%v\nwant\n%v", got, vs.otlp)
	}
}

// checkTracingBootstrap: the bootstrap of the Envoy beside duet (as the
// init container renders it from the chart's configuration) traces with
// Envoy's OpenTelemetry tracer exactly when the chart's values turn
// tracing on: to the collector Envoy reaches (otlp.envoyEndpoint, else
// otlp.endpoint; the duet_otlp cluster), sampling the values' share of the
// requests, under Envoy's service name, with a span per upstream request,
// and both gRPC access loggers logging traceparent, which duet's spans of
// failed legs hang under. With tracing off, none of it.
func checkTracingBootstrap(t *testing.T, vs valueSet, bootstrap string) {
	t.Helper()
	var boot map[string]any
	if err := yaml.Unmarshal([]byte(bootstrap), &boot); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	hcm := harness.Dig(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	tracing := harness.Dig(hcm, "tracing")
	var cluster any
	clusters, _ := harness.Dig(boot, "static_resources", "clusters").([]any)
	for _, c := range clusters {
		if harness.Dig(c, "name") == "duet_otlp" {
			cluster = c
		}
	}
	var logged [][]any
	for _, l := range append(listOf(harness.Dig(hcm, "access_log")), listOf(harness.Dig(routerConfig(hcm), "upstream_log"))...) {
		if harness.Dig(l, "name") == "envoy.access_loggers.http_grpc" {
			h, _ := harness.Dig(l, "typed_config", "additional_request_headers_to_log").([]any)
			logged = append(logged, h)
		}
	}
	if len(logged) != 2 {
		t.Fatalf("bootstrap: %d gRPC access loggers, want 2 (the connection manager's and the router's)", len(logged))
	}
	if vs.otlp == nil {
		if tracing != nil || harness.Dig(hcm, "request_id_extension") != nil || cluster != nil {
			t.Errorf("tracing off, but the bootstrap has tracing %v, a request id extension %v, cluster duet_otlp %v",
				tracing, harness.Dig(hcm, "request_id_extension"), cluster)
		}
		for _, h := range logged {
			if slices.Contains(h, any("traceparent")) {
				t.Errorf("tracing off, but an access logger logs traceparent (%v)", h)
			}
		}
		return
	}
	collector, _ := vs.otlp["envoy_endpoint"].(string)
	if collector == "" {
		collector, _ = vs.otlp["endpoint"].(string)
	}
	sampling, service := vs.otlp["sampling_percent"], vs.otlp["envoy_service_name"]
	if sampling == nil {
		sampling = 100
	}
	if service == nil {
		service = "duet-envoy"
	}
	for _, c := range []struct {
		path []any
		want any
	}{
		{[]any{"provider", "name"}, "envoy.tracers.opentelemetry"},
		{[]any{"provider", "typed_config", "grpc_service", "envoy_grpc", "cluster_name"}, "duet_otlp"},
		{[]any{"provider", "typed_config", "service_name"}, service},
		// The tracer's sampler takes the percentage in millionths.
		{[]any{"provider", "typed_config", "sampler", "typed_config", "wrapped_sampler", "typed_config", "sampling_percentage", "numerator"}, perMillion(sampling)},
		{[]any{"spawn_upstream_span"}, true},
	} {
		if got := harness.Dig(tracing, c.path...); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("bootstrap: tracing %v = %v, want %v", c.path, got, c.want)
		}
	}
	if cluster == nil {
		t.Fatal("bootstrap: no cluster duet_otlp")
	}
	addr := harness.Dig(cluster, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
	port, _ := harness.Dig(addr, "port_value").(int)
	if got := net.JoinHostPort(fmt.Sprint(harness.Dig(addr, "address")), strconv.Itoa(port)); got != collector {
		t.Errorf("bootstrap: cluster duet_otlp reaches %s, want the collector %s", got, collector)
	}
	for _, h := range logged {
		if !slices.Contains(h, any("traceparent")) {
			t.Errorf("an access logger logs %v, not traceparent", h)
		}
	}
}

// routerConfig returns the router filter's typed_config among the
// connection manager's HTTP filters.
func routerConfig(hcm any) any {
	for _, f := range listOf(harness.Dig(hcm, "http_filters")) {
		if harness.Dig(f, "name") == "envoy.filters.http.router" {
			return harness.Dig(f, "typed_config")
		}
	}
	return nil
}

func listOf(v any) []any {
	l, _ := v.([]any)
	return l
}

// perMillion is a sampling percentage (a YAML number) in millionths, as
// the bootstrap's sampler takes it.
func perMillion(pct any) int64 {
	v, _ := strconv.ParseFloat(fmt.Sprint(pct), 64)
	return int64(math.Round(v * 1e4))
}
