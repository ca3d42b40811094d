// Package envoygateway holds duet's Envoy Gateway manifests; e2e/envoygateway
// proves them on a real Envoy. The tests here check the tracing example:
// tracing/envoyproxy-patch.yaml, merged into gateway.yaml's EnvoyProxy, is
// what Envoy Gateway's own translator (egctl x translate, the release the
// Makefile builds) turns into the tracing that `duet envoy-config` renders
// with an otlp section; and duet's side, the commented otlp section of
// duet.yaml, exports to the same collector.
package envoygateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/duet-router/duet/e2e/harness"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/envoy"
	"github.com/duet-router/duet/envoy/contract"
)

const (
	tracingPatch = "tracing/envoyproxy-patch.yaml"
	// egctlVersion is the Envoy Gateway release the Makefile builds egctl
	// from (EGCTL_VERSION); DUET_EGCTL_BIN overrides the path.
	egctlVersion = "v1.9.1"
	// The service name of Envoy's spans where duet renders the bootstrap
	// (otlp.envoy_service_name's default), which the docs and the Grafana
	// dashboard search for.
	envoyServiceName = "duet-envoy"
)

type obj = map[string]any

// readDocs reads every document of a YAML file.
func readDocs(t *testing.T, path string) []obj {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []obj
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var d obj
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			return docs
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

// find returns the first document of kind kind.
func find(docs []obj, kind string) obj {
	for _, d := range docs {
		if d["kind"] == kind {
			return d
		}
	}
	return nil
}

// mergePatch applies a JSON merge patch (RFC 7386), as `kubectl patch
// --type merge` does: maps merge key by key, null deletes, anything else
// replaces.
func mergePatch(target, patch any) any {
	p, ok := patch.(obj)
	if !ok {
		return patch
	}
	out := obj{}
	if t, ok := target.(obj); ok {
		for k, v := range t {
			out[k] = v
		}
	}
	for k, v := range p {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = mergePatch(out[k], v)
		}
	}
	return out
}

// egctlPath locates egctl: $DUET_EGCTL_BIN, else where the Makefile builds
// it. A missing egctl is an error naming the make target, never a skip.
func egctlPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("DUET_EGCTL_BIN")
	if p == "" {
		p = filepath.Join("..", "..", ".tools", "egctl-"+egctlVersion, "egctl")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("egctl: %v: run `make egctl` (or `make test`, which builds it)", err)
	}
	return p
}

// service is a stand-in Service with a cluster IP, for egctl.
func service(name, namespace string, port int, ip string) obj {
	return obj{"apiVersion": "v1", "kind": "Service", "metadata": obj{"name": name, "namespace": namespace},
		"spec": obj{"clusterIP": ip, "ports": []any{obj{"name": "p", "port": port, "protocol": "TCP"}}}}
}

// TestTracingPatch: gateway.yaml's access logs log the headers duet's
// bootstrap logs with tracing on (traceparent, under which duet hangs a
// failed leg's span, besides envoy.LoggedRequestHeaders), and the tracing
// patch, merged into gateway.yaml's EnvoyProxy as `kubectl patch --type
// merge` does, is accepted by Envoy Gateway's translator, which gives the
// gateway's connection manager what `duet envoy-config` renders with an
// otlp section: the OpenTelemetry tracer exporting over gRPC to the
// patch's collector under Envoy's service name (duet-envoy), random
// sampling at the patch's rate, a span per upstream request, and a request
// id extension that does not rewrite x-request-id. The access loggers of
// the translation log traceparent.
//
// One difference from duet's bootstrap is intended: the extension samples
// by x-request-id (requestID.tracing: Sample). With
// use_request_id_for_trace_sampling false Envoy skips its sampling and
// traces every request, random_sampling (which samplingRate becomes)
// ignored, unless the tracer samples (docs/envoy-contract.md, claim 45,
// proved on Envoy 1.40 by the e2e TestTracingFollowsClientDecision).
// duet's bootstrap gives its tracer a sampler; Envoy Gateway's tracer has
// none, so Disable would trace 100 % of the requests while the patch says
// 1. With policies.yaml translated too, the id sampled by is the one a
// client sent, when it sent one (PreserveOrGenerate), as the docs say.
func TestTracingPatch(t *testing.T) {
	want := append(slices.Clone(envoy.LoggedRequestHeaders), contract.HeaderTraceParent)
	docs := readDocs(t, "gateway.yaml")
	ep := find(docs, "EnvoyProxy")
	if ep == nil {
		t.Fatal("gateway.yaml has no EnvoyProxy")
	}
	settings, _ := harness.Dig(ep, "spec", "telemetry", "accessLog", "settings").([]any)
	sinks := 0
	for _, s := range settings {
		for _, sink := range harness.Dig(s, "sinks").([]any) {
			if harness.Dig(sink, "type") != "ALS" {
				continue
			}
			sinks++
			var got []string
			for _, h := range harness.Dig(sink, "als", "http", "requestHeaders").([]any) {
				got = append(got, fmt.Sprint(h))
			}
			if !slices.Equal(got, want) {
				t.Errorf("ALS sink %v logs %v, want %v", harness.Dig(sink, "als", "logName"), got, want)
			}
		}
	}
	if sinks != 2 {
		t.Errorf("gateway.yaml: %d ALS sinks, want 2 (duet_downstream, duet_upstream)", sinks)
	}

	var patch obj
	data, err := os.ReadFile(tracingPatch)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &patch); err != nil {
		t.Fatalf("%s: %v", tracingPatch, err)
	}
	if keys := fmt.Sprint(harness.Dig(patch, "spec", "telemetry")); !strings.Contains(keys, "tracing:") || len(patch) != 1 {
		t.Fatalf("%s: want a patch of spec.telemetry alone, got %v", tracingPatch, patch)
	}
	tracing := harness.Dig(patch, "spec", "telemetry", "tracing")
	ref := harness.Dig(tracing, "provider", "backendRefs", 0)
	collector := fmt.Sprintf("%v.%v.svc", harness.Dig(ref, "name"), harness.Dig(ref, "namespace"))
	if harness.Dig(tracing, "provider", "type") != "OpenTelemetry" || harness.Dig(ref, "port") != 4317 || harness.Dig(tracing, "provider", "serviceName") != envoyServiceName {
		t.Errorf("%s: provider %v, want OpenTelemetry to a collector's OTLP/gRPC port 4317, service %s", tracingPatch, harness.Dig(tracing, "provider"), envoyServiceName)
	}
	checkDuetOTLP(t, "duet.yaml", collector+":4317")
	checkDuetOTLP(t, "pools/duet.yaml", collector+":4317")

	var in []any
	for _, d := range docs {
		if d["kind"] == "EnvoyProxy" {
			d = mergePatch(d, patch).(obj)
		}
		in = append(in, d)
	}
	for _, d := range append(readDocs(t, "route.yaml"), readDocs(t, "policies.yaml")...) {
		in = append(in, d)
	}
	in = append(in, service("duet", "inference", 9002, "10.96.0.10"), service("sglang-decode", "inference", 30000, "10.96.0.12"),
		service("sglang-prefill", "inference", 30000, "10.96.0.13"),
		service(fmt.Sprint(harness.Dig(ref, "name")), fmt.Sprint(harness.Dig(ref, "namespace")), 4317, "10.96.0.11"))
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	for _, d := range in {
		if err := enc.Encode(d); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	input := filepath.Join(dir, "input.yaml")
	if err := os.WriteFile(input, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(egctlPath(t), "x", "translate", "--from", "gateway-api", "--to", "gateway-api,xds", "--output", "json", "--file", input)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("egctl x translate: %v: %s", err, stderr.String())
	}
	var tr obj
	if err := json.Unmarshal(out, &tr); err != nil {
		t.Fatal(err)
	}
	for _, a := range harness.Dig(tr, "envoyProxyForGatewayClass", "status", "ancestors").([]any) {
		for _, c := range harness.Dig(a, "conditions").([]any) {
			if harness.Dig(c, "status") != "True" {
				t.Errorf("EnvoyProxy: %v=%v (%v) %v", harness.Dig(c, "type"), harness.Dig(c, "status"), harness.Dig(c, "reason"), harness.Dig(c, "message"))
			}
		}
	}
	var hcms []obj
	var clusters = map[string]obj{}
	var logged [][]any
	harness.Walk(harness.Dig(tr, "xds"), func(m obj) {
		switch harness.Dig(m, "@type") {
		case "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager":
			// The Gateway's listener (Envoy Gateway's own stats and
			// readiness listeners carry their routes inline).
			if harness.Dig(m, "rds", "routeConfigName") == "inference/duet/http" {
				hcms = append(hcms, m)
			}
		case "type.googleapis.com/envoy.config.cluster.v3.Cluster":
			clusters[fmt.Sprint(m["name"])] = m
		case "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig":
			h, _ := m["additionalRequestHeadersToLog"].([]any)
			logged = append(logged, h)
		}
	})
	if len(hcms) != 1 {
		t.Fatalf("the translation has %d connection managers, want the Gateway's one", len(hcms))
	}
	hcm := hcms[0]
	name := harness.Dig(hcm, "tracing", "provider", "typedConfig", "grpcService", "envoyGrpc", "clusterName")
	for _, c := range []struct {
		path []any
		want any
	}{
		{[]any{"tracing", "provider", "name"}, "envoy.tracers.opentelemetry"},
		{[]any{"tracing", "provider", "typedConfig", "serviceName"}, envoyServiceName},
		{[]any{"tracing", "provider", "typedConfig", "grpcService", "envoyGrpc", "authority"}, collector},
		{[]any{"tracing", "randomSampling", "value"}, harness.Dig(tracing, "samplingRate")},
		{[]any{"tracing", "spawnUpstreamSpan"}, true},
		{[]any{"requestIdExtension", "typedConfig", "packTraceReason"}, false},
		// Sample by x-request-id, or samplingRate is ignored and every
		// request traced (Envoy Gateway's tracer has no sampler).
		{[]any{"requestIdExtension", "typedConfig", "useRequestIdForTraceSampling"}, true},
		// The edge: Envoy makes an x-request-id for a request without
		// one, and keeps a client's (policies.yaml).
		{[]any{"useRemoteAddress"}, true},
		{[]any{"generateRequestId"}, true},
		{[]any{"preserveExternalRequestId"}, true},
	} {
		if got := harness.Dig(hcm, c.path...); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("connection manager: %v = %v, want %v", c.path, got, c.want)
		}
	}
	if c, ok := clusters[fmt.Sprint(name)]; !ok || harness.Dig(c, "typedExtensionProtocolOptions", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "explicitHttpConfig", "http2ProtocolOptions") == nil {
		t.Errorf("the tracer's cluster %v: %v, want one speaking HTTP/2 (OTLP/gRPC)", name, c)
	}
	if len(logged) != 2 {
		t.Errorf("%d gRPC access loggers in the translation, want 2", len(logged))
	}
	for _, h := range logged {
		if !slices.Contains(h, any(contract.HeaderTraceParent)) {
			t.Errorf("a gRPC access logger logs %v, without %s", h, contract.HeaderTraceParent)
		}
	}
}

// checkDuetOTLP: the duet.yaml of the file's ConfigMap has a commented otlp
// section ("# otlp:" and the "#   " lines under it) that, made live,
// exports to endpoint and sets nothing that only duet's own Envoy reads.
func checkDuetOTLP(t *testing.T, path, endpoint string) {
	t.Helper()
	cm := find(readDocs(t, path), "ConfigMap")
	config, _ := harness.Dig(cm, "data", "duet.yaml").(string)
	lines := strings.Split(config, "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.TrimSpace(l) == "# otlp:" })
	if start < 0 {
		t.Errorf("%s: duet.yaml has no commented otlp section", path)
		return
	}
	indent := lines[start][:strings.Index(lines[start], "#")]
	var live []string
	for i := start; i < len(lines) && (i == start || strings.HasPrefix(lines[i], indent+"#   ")); i++ {
		live = append(live, strings.TrimPrefix(strings.TrimPrefix(lines[i], indent), "# "))
	}
	var cfg struct {
		OTLP map[string]any `yaml:"otlp"`
	}
	if err := yaml.Unmarshal([]byte(strings.Join(live, "\n")), &cfg); err != nil {
		t.Fatalf("%s: the otlp section: %v", path, err)
	}
	if fmt.Sprint(cfg.OTLP) != fmt.Sprint(map[string]any{"endpoint": endpoint}) {
		t.Errorf("%s: otlp %v, want only endpoint %s (the gateway samples and names its own spans)", path, cfg.OTLP, endpoint)
	}
}
