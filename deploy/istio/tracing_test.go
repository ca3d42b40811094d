package istio

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy"
	"github.com/duet-router/duet/envoy/contract"
)

// The tracing example (tracing/): a kustomize overlay of deploy/istio
// that adds a Telemetry resource and patches the EnvoyFilter, and the
// provider for istiod's mesh configuration.
const (
	tracingDir           = "tracing"
	tracingKustomization = "tracing/kustomization.yaml"
	tracingTelemetry     = "tracing/telemetry.yaml"
	tracingMesh          = "tracing/mesh.yaml"
)

// jsonPatchOp is one RFC 6902 operation of a kustomize patch.
type jsonPatchOp struct {
	Op    string `yaml:"op"`
	Path  string `yaml:"path"`
	Value any    `yaml:"value"`
}

// applyJSONPatch applies the add and test operations of an RFC 6902 patch
// to doc, as kustomize does: add sets a map key or inserts into a list (at
// an index, or at the end for "-"), test fails unless the value at the
// path equals its value.
func applyJSONPatch(doc any, ops []jsonPatchOp) (any, error) {
	for _, op := range ops {
		var keys []string
		for _, k := range strings.Split(strings.TrimPrefix(op.Path, "/"), "/") {
			keys = append(keys, strings.NewReplacer("~1", "/", "~0", "~").Replace(k))
		}
		var err error
		switch op.Op {
		case "test":
			var got any
			if got, err = lookup(doc, keys); err == nil && !reflect.DeepEqual(got, op.Value) {
				err = fmt.Errorf("%v, not %v", got, op.Value)
			}
		case "add":
			doc, err = add(doc, keys, op.Value)
		default:
			err = fmt.Errorf("operation %q: only add and test here", op.Op)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", op.Op, op.Path, err)
		}
	}
	return doc, nil
}

func lookup(v any, keys []string) (any, error) {
	for _, k := range keys {
		switch x := v.(type) {
		case obj:
			var ok bool
			if v, ok = x[k]; !ok {
				return nil, fmt.Errorf("no key %q", k)
			}
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(x) {
				return nil, fmt.Errorf("no index %q in a list of %d", k, len(x))
			}
			v = x[i]
		default:
			return nil, fmt.Errorf("%q indexes a %T", k, v)
		}
	}
	return v, nil
}

// add returns v with value added at keys (the parent must exist).
func add(v any, keys []string, value any) (any, error) {
	if len(keys) == 0 {
		return value, nil
	}
	k := keys[0]
	switch x := v.(type) {
	case obj:
		if len(keys) == 1 {
			x[k] = value
			return x, nil
		}
		child, ok := x[k]
		if !ok {
			return nil, fmt.Errorf("no key %q", k)
		}
		c, err := add(child, keys[1:], value)
		x[k] = c
		return x, err
	case []any:
		if len(keys) == 1 {
			if k == "-" {
				return append(x, value), nil
			}
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i > len(x) {
				return nil, fmt.Errorf("no index %q in a list of %d", k, len(x))
			}
			return slices.Insert(x, i, value), nil
		}
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= len(x) {
			return nil, fmt.Errorf("no index %q in a list of %d", k, len(x))
		}
		c, err := add(x[i], keys[1:], value)
		x[i] = c
		return x, err
	}
	return nil, fmt.Errorf("%q indexes a %T", k, v)
}

// tracingOverlay reads the overlay's kustomization and returns the
// EnvoyFilter it makes (envoyfilter.yaml with the overlay's patch applied),
// written to a temporary file.
func tracingOverlay(t *testing.T) string {
	t.Helper()
	var k struct {
		Resources []string `yaml:"resources"`
		Patches   []struct {
			Target map[string]string `yaml:"target"`
			Patch  string            `yaml:"patch"`
		} `yaml:"patches"`
	}
	data, err := os.ReadFile(tracingKustomization)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("%s: %v", tracingKustomization, err)
	}
	if !slices.Equal(k.Resources, []string{"../", "telemetry.yaml"}) {
		t.Errorf("%s: resources %v, want deploy/istio (../) and telemetry.yaml", tracingKustomization, k.Resources)
	}
	if len(k.Patches) != 1 {
		t.Fatalf("%s: %d patches, want one, of the EnvoyFilter", tracingKustomization, len(k.Patches))
	}
	p := k.Patches[0]
	docs := yamlDocs(t, "envoyfilter.yaml")
	if len(docs) != 1 {
		t.Fatalf("envoyfilter.yaml: %d documents, want the EnvoyFilter alone", len(docs))
	}
	ef := docs[0]
	if p.Target["kind"] != ef["kind"] || p.Target["name"] != get(t, ef, "metadata", "name") ||
		p.Target["namespace"] != get(t, ef, "metadata", "namespace") || p.Target["group"]+"/" != strings.SplitAfter(ef["apiVersion"].(string), "/")[0] {
		t.Fatalf("%s: the patch targets %v, not envoyfilter.yaml's %v %v", tracingKustomization, p.Target, ef["apiVersion"], ef["metadata"])
	}
	var ops []jsonPatchOp
	if err := yaml.Unmarshal([]byte(p.Patch), &ops); err != nil {
		t.Fatalf("%s: the patch: %v", tracingKustomization, err)
	}
	patched, err := applyJSONPatch(ef, ops)
	if err != nil {
		t.Fatalf("%s: %v", tracingKustomization, err)
	}
	return writeEnvoyFilter(t, patched)
}

// tracingProvider returns the OpenTelemetry provider of mesh.yaml (its one
// extension provider): its name and the collector's host and port.
func tracingProvider(t *testing.T) (name string, collector envoy.Address) {
	t.Helper()
	var mesh struct {
		MeshConfig struct {
			ExtensionProviders []struct {
				Name          string
				OpenTelemetry *struct {
					Service string
					Port    int
				} `yaml:"opentelemetry"`
			} `yaml:"extensionProviders"`
		} `yaml:"meshConfig"`
	}
	data, err := os.ReadFile(tracingMesh)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &mesh); err != nil {
		t.Fatalf("%s: %v", tracingMesh, err)
	}
	ps := mesh.MeshConfig.ExtensionProviders
	if len(ps) != 1 || ps[0].OpenTelemetry == nil || ps[0].OpenTelemetry.Service == "" || ps[0].OpenTelemetry.Port == 0 {
		t.Fatalf("%s: extension providers %+v, want one opentelemetry provider with a service and port", tracingMesh, ps)
	}
	return ps[0].Name, envoy.Address{Host: ps[0].OpenTelemetry.Service, Port: ps[0].OpenTelemetry.Port}
}

// TestTracingOverlayMatchesRenderedBootstrap: the EnvoyFilter of the
// tracing overlay carries exactly what `duet envoy-config` renders with an
// otlp section (the collector and sampling of the overlay's provider and
// Telemetry), field for field as TestEnvoyFilterMatchesRenderedBootstrap
// holds envoyfilter.yaml to the rendering without one: the access loggers
// log traceparent, and the request id extension does not rewrite
// x-request-id. The tracer itself and its cluster are Istio's
// (telemetry.yaml, mesh.yaml), so the rendering's are left out. One
// difference is intended, and set in the rendering before comparing: the
// overlay samples by x-request-id (use_request_id_for_trace_sampling
// true), duet's rendering in its tracer's sampler. The Telemetry traces
// the pods the EnvoyFilter patches, with mesh.yaml's provider, and samples
// by x-request-id too.
//
// Why by x-request-id: with use_request_id_for_trace_sampling false Envoy
// skips its sampling and traces every request, random_sampling (which
// randomSamplingPercentage becomes) ignored, unless the tracer samples
// (docs/envoy-contract.md, claim 45, proved on Envoy 1.40 by the e2e
// TestTracingFollowsClientDecision). duet's bootstrap gives its tracer a
// sampler; Istio's provider has none, so false here would trace 100 % of
// the requests while the Telemetry says 1.
func TestTracingOverlayMatchesRenderedBootstrap(t *testing.T) {
	provider, collector := tracingProvider(t)
	var tel struct {
		Kind     string
		Metadata struct{ Namespace string }
		Spec     struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			}
			Tracing []struct {
				Providers                    []struct{ Name string }
				RandomSamplingPercentage     *float64 `yaml:"randomSamplingPercentage"`
				UseRequestIDForTraceSampling *bool    `yaml:"useRequestIdForTraceSampling"`
			}
		}
	}
	data, err := os.ReadFile(tracingTelemetry)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &tel); err != nil {
		t.Fatalf("%s: %v", tracingTelemetry, err)
	}
	ef := yamlDocs(t, "envoyfilter.yaml")[0]
	if tel.Kind != "Telemetry" || tel.Metadata.Namespace != get(t, ef, "metadata", "namespace") ||
		fmt.Sprint(tel.Spec.Selector.MatchLabels) != fmt.Sprint(get(t, ef, "spec", "workloadSelector", "labels")) {
		t.Errorf("%s: %s in %s selecting %v; want a Telemetry of the pods the EnvoyFilter patches (%v)", tracingTelemetry,
			tel.Kind, tel.Metadata.Namespace, tel.Spec.Selector.MatchLabels, get(t, ef, "spec", "workloadSelector", "labels"))
	}
	if len(tel.Spec.Tracing) != 1 || len(tel.Spec.Tracing[0].Providers) != 1 || tel.Spec.Tracing[0].Providers[0].Name != provider ||
		tel.Spec.Tracing[0].RandomSamplingPercentage == nil || tel.Spec.Tracing[0].UseRequestIDForTraceSampling == nil || !*tel.Spec.Tracing[0].UseRequestIDForTraceSampling {
		t.Fatalf("%s: tracing %+v; want provider %s, a sampling percentage, and useRequestIdForTraceSampling true, said out loud "+
			"(false would trace every request whatever the percentage: Istio's tracer has no sampler)", tracingTelemetry, tel.Spec.Tracing, provider)
	}

	p := bootstrapParams()
	p.Tracing = &envoy.Tracing{Collector: collector, SamplingPercent: *tel.Spec.Tracing[0].RandomSamplingPercentage, ServiceName: "duet-envoy"}
	var buf bytes.Buffer
	if err := envoy.Render(&buf, p); err != nil {
		t.Fatal(err)
	}
	var boot obj
	if err := yaml.Unmarshal(buf.Bytes(), &boot); err != nil {
		t.Fatal(err)
	}
	hcm := get(t, boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config").(obj)
	if hcm["tracing"] == nil || hcm["request_id_extension"] == nil {
		t.Fatalf("the rendering with tracing has no tracing or request id extension: %v", hcm)
	}
	delete(hcm, "tracing")
	// duet's bootstrap leaves sampling to its tracer's sampler (deleted
	// above with the tracer) and so keeps x-request-id out of it; Istio's
	// tracer has no sampler, so the overlay samples by x-request-id, or
	// Envoy would trace every request. The id is left unaltered in both.
	rid := get(t, hcm, "request_id_extension", "typed_config").(obj)
	if rid["use_request_id_for_trace_sampling"] != false || rid["pack_trace_reason"] != false {
		t.Fatalf("the rendering's request id extension %v: want it neither sampling by nor packing into x-request-id, as this test assumes", rid)
	}
	rid["use_request_id_for_trace_sampling"] = true
	sr := boot["static_resources"].(obj)
	sr["clusters"] = slices.DeleteFunc(sr["clusters"].([]any), func(c any) bool { return c.(obj)["name"] == envoy.ClusterOTLP })
	checkEnvoyFilterMatches(t, boot, tracingOverlay(t), []string{"duet-inference"})
}

// The tracing overlay's objects satisfy Istio's CRD schemas; istioctl
// analyze, given mesh.yaml's provider, reports nothing on deploy/istio with
// the overlay (the patched EnvoyFilter, the Telemetry) but the warning
// every EnvoyFilter gets; and Istio's generator, given the patched
// EnvoyFilter, builds a gateway whose connection manager carries duet's
// request id extension (merged over Istio's own: it samples by
// x-request-id, or Envoy would trace every request, and does not pack the
// decision into it) and whose two access loggers log traceparent, and
// which Envoy loads.
func TestTracingOverlayInIstio(t *testing.T) {
	tools := findIstioTools(t)
	filter := tracingOverlay(t)
	out, err := exec.Command(tools.Check, "crd", "-crds", tools.CRDs, tracingTelemetry, filter).CombinedOutput()
	if err != nil {
		t.Fatalf("CRD schema validation: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), tracingTelemetry+":") {
		t.Errorf("the Telemetry was not validated:\n%s", out)
	}

	files := []string{fixture, filter, tracingTelemetry}
	for _, m := range manifests {
		if m != "envoyfilter.yaml" {
			files = append(files, m)
		}
	}
	var mesh struct {
		MeshConfig any `yaml:"meshConfig"`
	}
	data, err := os.ReadFile(tracingMesh)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &mesh); err != nil {
		t.Fatal(err)
	}
	meshData, err := yaml.Marshal(mesh.MeshConfig)
	if err != nil {
		t.Fatal(err)
	}
	meshFile := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(meshFile, meshData, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"analyze", "--use-kube=false", "--all-namespaces", "--output", "json", "--failure-threshold", "Error", "--meshConfigFile", meshFile}
	cmd := exec.Command(tools.Istioctl, append(args, files...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 79 {
			t.Fatalf("istioctl analyze: %v\n%s%s", err, stdout.String(), stderr.String())
		}
	}
	checkClean(t, parseMessages(t, stdout.Bytes()))

	boot, _ := generateGatewayConfig(t, tools, append([]string{filter, fixture}, slices.DeleteFunc(slices.Clone(manifests), func(m string) bool { return m == "envoyfilter.yaml" })...)...)
	var hcms []obj
	var logged [][]any
	harness.Walk(boot, func(m map[string]any) {
		switch m["@type"] {
		case "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager":
			if m["requestIdExtension"] != nil {
				hcms = append(hcms, m)
			}
		case "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig":
			h, _ := m["additionalRequestHeadersToLog"].([]any)
			logged = append(logged, h)
		}
	})
	var gateway obj
	for _, h := range hcms {
		if reflect.DeepEqual(get(t, h, "requestIdExtension", "typedConfig", "packTraceReason"), false) {
			gateway = h
		}
	}
	if gateway == nil {
		t.Fatalf("no connection manager with duet's request id extension (packTraceReason false) among %v", hcms)
	}
	if rid := get(t, gateway, "requestIdExtension", "typedConfig").(obj); rid["useRequestIdForTraceSampling"] != true {
		t.Errorf("request id extension %v, want useRequestIdForTraceSampling true (false traces every request: Istio's tracer has no sampler)", rid)
	}
	if len(logged) != 2 {
		t.Errorf("%d gRPC access loggers, want duet's two", len(logged))
	}
	for _, h := range logged {
		if !slices.Contains(h, any(contract.HeaderTraceParent)) {
			t.Errorf("a gRPC access logger logs %v, without %s", h, contract.HeaderTraceParent)
		}
	}
	envoyTools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	loadsInEnvoy(t, envoyTools.Envoy, boot, "Istio's gateway configuration with the tracing overlay")
}
