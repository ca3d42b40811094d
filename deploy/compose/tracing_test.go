package compose

import (
	"bufio"
	"fmt"
	"github.com/duet-router/duet/e2e/harness"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
)

// Jaeger, the stack's trace backend: its service, and its ports inside its
// container (the all-in-one configuration of its image).
const (
	jaegerService    = "jaeger"
	jaegerOTLPPort   = 4317  // OTLP/gRPC, where Envoy and duet export
	jaegerUIPort     = 16686 // the UI and its query API
	jaegerHealthPort = 13133 // the health check extension
	jaegerImage      = "jaegertracing/jaeger"
)

// Envoy's names for what `duet envoy-config` renders with an otlp section
// (package envoy): the tracer, its cluster, the header the access loggers
// log.
const (
	envoyOTLPCluster = "duet_otlp"
	envoyTracer      = "envoy.tracers.opentelemetry"
	traceParent      = "traceparent"
	// The service names duet's otlp section defaults to.
	defaultServiceName      = "duet"
	defaultEnvoyServiceName = "duet-envoy"
)

// otlpSection is duet's otlp section, as a file holds it.
type otlpSection struct {
	Endpoint         string
	EnvoyEndpoint    string   `yaml:"envoy_endpoint"`
	SamplingPercent  *float64 `yaml:"sampling_percent"`
	ServiceName      string   `yaml:"service_name"`
	EnvoyServiceName string   `yaml:"envoy_service_name"`
}

// TestTracing proves the stack's tracing, on both stacks: the jaeger
// service runs Jaeger v2 (pinned: TestJaegerImageVersion) on the duet
// network and publishes its UI on loopback at its own port; every duet's
// configuration exports to jaeger's OTLP/gRPC port, by its service name,
// with every request sampled and the default service names; and the Envoy
// bootstrap it mounts traces with Envoy's OpenTelemetry tracer to the same
// address (the duet_otlp cluster, HTTP/2), sampling every request, with a
// span per upstream request (the decode leg and the prefill mirror), a
// request id extension that neither samples by nor rewrites x-request-id,
// and traceparent logged by both gRPC access loggers (duet's failed-leg
// spans hang under it).
func TestTracing(t *testing.T) { forEachVariant(t, testTracing) }

func testTracing(t *testing.T, p *types.Project) {
	jaeger := service(t, p, jaegerService)
	if !strings.HasPrefix(jaeger.Image, jaegerImage+":2.") {
		t.Errorf("jaeger: image %q, want %s:2.x (Jaeger v2: OTLP in, memory storage by default)", jaeger.Image, jaegerImage)
	}
	if len(jaeger.Command) > 0 || len(jaeger.Entrypoint) > 0 || len(jaeger.Volumes) > 0 {
		t.Errorf("jaeger: entrypoint %q, command %q, volumes %v; want the image's all-in-one configuration (in-memory) as it is",
			jaeger.Entrypoint, jaeger.Command, jaeger.Volumes)
	}
	ui := false
	for _, port := range jaeger.Ports {
		ui = ui || (port.Target == jaegerUIPort && port.Published == strconv.Itoa(jaegerUIPort) && port.HostIP == "127.0.0.1")
	}
	if !ui {
		t.Errorf("jaeger: ports %+v, want the UI published at 127.0.0.1:%d", jaeger.Ports, jaegerUIPort)
	}
	want := hostPort(jaegerService, jaegerOTLPPort)
	for _, name := range append(slices.Clone(duetServices), "envoy") {
		if service(t, p, name).Networks[networkName] == nil {
			t.Errorf("%s is not on network %s, where it reaches %s", name, networkName, want)
		}
	}
	for _, name := range duetServices {
		file := mountedFile(t, p, name, duetConfigPath)
		var cfg struct {
			OTLP *otlpSection `yaml:"otlp"`
		}
		readYAML(t, file, &cfg)
		o := cfg.OTLP
		if o == nil {
			t.Errorf("%s: %s has no otlp section: nothing is traced", name, file)
			continue
		}
		if o.Endpoint != want || (o.EnvoyEndpoint != "" && o.EnvoyEndpoint != want) {
			t.Errorf("%s: otlp.endpoint %q, envoy_endpoint %q; want %s for both (the jaeger service)", file, o.Endpoint, o.EnvoyEndpoint, want)
		}
		if o.SamplingPercent == nil || *o.SamplingPercent != 100 {
			t.Errorf("%s: otlp.sampling_percent %v, want 100 (a demo traces every request)", file, o.SamplingPercent)
		}
		if o.ServiceName != "" || o.EnvoyServiceName != "" {
			t.Errorf("%s: otlp service names %q, %q; want the defaults (%s, %s), which the docs and the dashboard name",
				file, o.ServiceName, o.EnvoyServiceName, defaultServiceName, defaultEnvoyServiceName)
		}
	}

	file := mountedFile(t, p, "envoy", envoyConfigPath)
	var boot map[string]any
	readYAML(t, file, &boot)
	tracing := harness.Dig(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "tracing")
	for _, c := range []struct {
		path []any
		want any
	}{
		{[]any{"provider", "name"}, envoyTracer},
		{[]any{"provider", "typed_config", "grpc_service", "envoy_grpc", "cluster_name"}, envoyOTLPCluster},
		{[]any{"provider", "typed_config", "service_name"}, defaultEnvoyServiceName},
		// Every request sampled: 100 % as the tracer's sampler's millionths.
		{[]any{"provider", "typed_config", "sampler", "typed_config", "wrapped_sampler", "typed_config", "sampling_percentage", "numerator"}, 1000000},
		{[]any{"spawn_upstream_span"}, true},
	} {
		if got := harness.Dig(tracing, c.path...); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: tracing %v = %v, want %v", file, c.path, got, c.want)
		}
	}
	rid := harness.Dig(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "request_id_extension", "typed_config")
	if fmt.Sprint(harness.Dig(rid, "pack_trace_reason"), harness.Dig(rid, "use_request_id_for_trace_sampling")) != "false false" {
		t.Errorf("%s: request_id_extension %v, want neither packing the trace reason nor sampling by x-request-id", file, rid)
	}
	var cluster any
	for _, c := range harness.Dig(boot, "static_resources", "clusters").([]any) {
		if harness.Dig(c, "name") == envoyOTLPCluster {
			cluster = c
		}
	}
	if cluster == nil {
		t.Fatalf("%s has no cluster %s", file, envoyOTLPCluster)
	}
	addr := harness.Dig(cluster, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
	if got := hostPort(fmt.Sprint(harness.Dig(addr, "address")), harness.Dig(addr, "port_value").(int)); got != want {
		t.Errorf("%s: cluster %s reaches %s, want %s", file, envoyOTLPCluster, got, want)
	}
	if harness.Dig(cluster, "typed_extension_protocol_options", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "explicit_http_config", "http2_protocol_options") == nil {
		t.Errorf("%s: cluster %s does not speak HTTP/2 (OTLP/gRPC)", file, envoyOTLPCluster)
	}
	loggers := 0
	harness.Walk(boot, func(m map[string]any) {
		if m["name"] != "envoy.access_loggers.http_grpc" {
			return
		}
		loggers++
		headers, _ := harness.Dig(m, "typed_config", "additional_request_headers_to_log").([]any)
		if !slices.Contains(headers, any(traceParent)) {
			t.Errorf("%s: access logger %v logs %v, not %s", file, harness.Dig(m, "typed_config", "common_config", "log_name"), headers, traceParent)
		}
	})
	if loggers != 2 {
		t.Errorf("%s: %d gRPC access loggers, want 2 (the connection manager's and the router's)", file, loggers)
	}
}

// jaegerModule is the Go module of the Jaeger the tests build (`make
// jaeger`), whose go.mod pins its version.
const jaegerModule = "../../e2e/jaeger/go.mod"

// TestJaegerImageVersion checks that the jaeger service runs the Jaeger
// release the end-to-end tests run: the tests build it from its Go module
// (github.com/jaegertracing/jaeger v1.x, e2e/jaeger/go.mod), released
// together with the v2 image tag its CHANGELOG names on the same line
// ("v1.76.0 / v2.13.0").
func TestJaegerImageVersion(t *testing.T) {
	data, err := os.ReadFile(jaegerModule)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/jaegertracing/jaeger (v1\.\d+\.\d+)[\s/]`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s requires no github.com/jaegertracing/jaeger v1.x", jaegerModule)
	}
	v1 := string(m[1])
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	changelog := filepath.Join(strings.TrimSpace(string(out)), "github.com", "jaegertracing", "jaeger@"+v1, "CHANGELOG.md")
	f, err := os.Open(changelog)
	if err != nil {
		t.Fatalf("%v: run `make jaeger` (it downloads the module)", err)
	}
	defer f.Close()
	release := regexp.MustCompile(`^` + regexp.QuoteMeta(v1) + ` / v(2\.\d+\.\d+)\b`)
	v2 := ""
	for sc := bufio.NewScanner(f); sc.Scan() && v2 == ""; {
		if m := release.FindStringSubmatch(sc.Text()); m != nil {
			v2 = m[1]
		}
	}
	if v2 == "" {
		t.Fatalf("%s names no v2 release beside %s", changelog, v1)
	}
	if got, want := service(t, loadProject(t), jaegerService).Image, jaegerImage+":"+v2; got != want {
		t.Errorf("jaeger image %q, want %q (the Jaeger %s the tests build)", got, want, v1)
	}
}
