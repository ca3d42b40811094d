package istio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/envoy"
)

// The addresses and parameters envoyfilter.yaml is written for: what `duet
// envoy-config` renders for a duet whose engines are discovered in Kubernetes.
func bootstrapParams() envoy.Params {
	return envoy.Params{
		Listen: envoy.Address{Host: "0.0.0.0", Port: 8080}, Admin: envoy.Address{Host: "127.0.0.1", Port: 9901},
		// Every replica, through the headless Service of replicas.yaml.
		Duet:         envoy.Address{Host: "duet-replicas.inference.svc.cluster.local", Port: 9002},
		MaxBodyBytes: 32 << 20, MessageTimeout: 2 * time.Second, StreamIdleTimeout: 15 * time.Minute, MaxRoutingRequests: 256,
		// What duet renders for the admission section of the chart's Istio
		// values: the longest wait limit (30s) plus 2s
		// (TestAdmissionManifests).
		MaxMessageTimeout: 32 * time.Second,
		Prefill:           []envoy.Address{{Host: "sglang-prefill.inference.svc.cluster.local", Port: 30000}},
		Decode:            []envoy.Address{{Host: "sglang-decode.inference.svc.cluster.local", Port: 30000}},
		// The engines are headless Services, as with duet's kubernetes: section.
		Headless: true,
	}
}

type obj = map[string]any

// renderedBootstrap renders duet's bootstrap for bootstrapParams.
func renderedBootstrap(t *testing.T) obj {
	t.Helper()
	var buf bytes.Buffer
	if err := envoy.Render(&buf, bootstrapParams()); err != nil {
		t.Fatal(err)
	}
	var b obj
	if err := yaml.Unmarshal(buf.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	return b
}

// patch is one configPatches entry of the EnvoyFilter.
type patch struct {
	ApplyTo string `yaml:"applyTo"`
	Match   obj    `yaml:"match"`
	Patch   struct {
		Operation string `yaml:"operation"`
		Value     obj    `yaml:"value"`
	} `yaml:"patch"`
}

// envoyFilterPatches reads the patches of envoyfilter.yaml.
func envoyFilterPatches(t *testing.T, path string) []patch {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ef struct {
		Kind string `yaml:"kind"`
		Spec struct {
			ConfigPatches []patch `yaml:"configPatches"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &ef); err != nil {
		t.Fatal(err)
	}
	if ef.Kind != "EnvoyFilter" || len(ef.Spec.ConfigPatches) == 0 {
		t.Fatalf("%s: not an EnvoyFilter with patches", path)
	}
	return ef.Spec.ConfigPatches
}

// get walks nested maps and lists: a string key indexes a map, an int a list.
func get(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(obj)
			if !ok {
				t.Fatalf("at %q: not a map", k)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at [%d]: not a list that long", k)
			}
			v = l[k]
		}
	}
	return v
}

// grpcOnly keeps the gRPC access loggers of a logger list: the rendered
// bootstrap's stdout loggers are for local runs; in a mesh, Istio's own
// access logging (Telemetry, meshConfig.accessLogFile) takes their place.
func grpcOnly(loggers any) []any {
	var out []any
	for _, l := range loggers.([]any) {
		if l.(obj)["name"] == "envoy.access_loggers.http_grpc" {
			out = append(out, l)
		}
	}
	return out
}

// withoutMeshTLS returns a cluster patch without its transport socket when
// that is the mesh's mutual TLS (SDS secrets from Istio's agent): in the
// mesh, the gateway authenticates to duet's sidecar with its workload
// certificate, not with the files of duet's auth.tls (TestGatewayDuetClusters
// compares it with Istio's own cluster to duet).
func withoutMeshTLS(cluster obj) obj {
	ts, ok := cluster["transport_socket"].(obj)
	if !ok || !strings.Contains(fmt.Sprint(ts), "sds-grpc") {
		return cluster
	}
	out := obj{}
	for k, v := range cluster {
		if k != "transport_socket" {
			out[k] = v
		}
	}
	return out
}

// withoutEventLogger returns a cluster of the rendered bootstrap without
// the event logger of its health checks (Envoy's file sink): Istio's proxy
// build has its own list of extensions, which need not include that sink,
// and a proxy rejects a cluster that names an extension it lacks. The
// health-check events are a log; the checks stay.
func withoutEventLogger(cluster any) any {
	c, ok := cluster.(obj)
	if !ok {
		return cluster
	}
	hcs, ok := c["health_checks"].([]any)
	if !ok {
		return cluster
	}
	out := obj{}
	for k, v := range c {
		out[k] = v
	}
	var kept []any
	for _, hc := range hcs {
		h := obj{}
		for k, v := range hc.(obj) {
			if k != "event_logger" {
				h[k] = v
			}
		}
		kept = append(kept, h)
	}
	out["health_checks"] = kept
	return out
}

// The EnvoyFilter must carry exactly what `duet envoy-config` renders, field
// for field, with the exceptions named here (and the mesh's TLS on the
// clusters to duet, see withoutMeshTLS, and no health-check event log, see
// withoutEventLogger): a change to the template that the Istio fragments do
// not follow fails this test.
func TestEnvoyFilterMatchesRenderedBootstrap(t *testing.T) {
	checkEnvoyFilterMatches(t, renderedBootstrap(t), "envoyfilter.yaml", []string{"duet-inference"})
}

// checkEnvoyFilterMatches fails unless the EnvoyFilter at path carries
// exactly what the rendered bootstrap boot has (see
// TestEnvoyFilterMatchesRenderedBootstrap); routeNames names the
// VirtualService route whose patch must carry each route of the bootstrap,
// in the bootstrap's order.
func checkEnvoyFilterMatches(t *testing.T, boot obj, path string, routeNames []string) {
	t.Helper()
	listener := get(t, boot, "static_resources", "listeners", 0).(obj)
	hcm := get(t, listener, "filter_chains", 0, "filters", 0, "typed_config").(obj)
	bootFilters := hcm["http_filters"].([]any)
	router := bootFilters[len(bootFilters)-1].(obj)
	bootRoutes := get(t, hcm, "route_config", "virtual_hosts", 0, "routes").([]any)
	if len(bootRoutes) != len(routeNames) {
		t.Fatalf("the bootstrap has %d routes, %d route names given", len(bootRoutes), len(routeNames))
	}
	patchedRoutes := map[string]bool{}
	bootClusters := map[string]any{}
	for _, c := range get(t, boot, "static_resources", "clusters").([]any) {
		bootClusters[c.(obj)["name"].(string)] = c
	}

	// HCM fields that are not the EnvoyFilter's business: Istio owns the
	// stat prefix and the routes; the filters and loggers are checked apart.
	hcmOwnedElsewhere := map[string]bool{"@type": true, "stat_prefix": true, "route_config": true, "http_filters": true, "access_log": true}

	var inserted []any
	added := map[string]bool{}
	var sawHCM, sawRouter, sawListener bool
	for i, p := range envoyFilterPatches(t, path) {
		v := p.Patch.Value
		switch {
		case p.ApplyTo == "CLUSTER" && p.Patch.Operation == "ADD":
			name, _ := v["name"].(string)
			want, ok := bootClusters[name]
			if !ok {
				t.Errorf("patch %d adds cluster %q, which the bootstrap does not have", i, name)
				continue
			}
			if want = withoutEventLogger(want); !reflect.DeepEqual(any(withoutMeshTLS(v)), want) {
				t.Errorf("cluster %s differs from the bootstrap's:\n got %v\nwant %v", name, v, want)
			}
			added[name] = true
		case p.ApplyTo == "LISTENER" && p.Patch.Operation == "MERGE":
			sawListener = true
			if !reflect.DeepEqual(v, obj{"per_connection_buffer_limit_bytes": listener["per_connection_buffer_limit_bytes"]}) {
				t.Errorf("listener patch %v, want the bootstrap's per_connection_buffer_limit_bytes %v", v, listener["per_connection_buffer_limit_bytes"])
			}
		case p.ApplyTo == "NETWORK_FILTER" && p.Patch.Operation == "MERGE":
			sawHCM = true
			tc := v["typed_config"].(obj)
			if tc["@type"] != hcm["@type"] {
				t.Errorf("HCM patch type %v, want %v", tc["@type"], hcm["@type"])
			}
			for k, want := range hcm {
				if hcmOwnedElsewhere[k] {
					continue
				}
				if !reflect.DeepEqual(tc[k], want) {
					t.Errorf("HCM field %s: got %v, want the bootstrap's %v", k, tc[k], want)
				}
			}
			for k := range tc {
				if _, ok := hcm[k]; !ok {
					t.Errorf("HCM patch sets %s, which the bootstrap does not", k)
				}
			}
			if got, want := tc["access_log"], grpcOnly(hcm["access_log"]); !reflect.DeepEqual(got, any(want)) {
				t.Errorf("HCM access_log:\n got %v\nwant %v", got, want)
			}
		case p.ApplyTo == "HTTP_FILTER" && p.Patch.Operation == "INSERT_BEFORE":
			if sub := get(t, p.Match, "listener", "filterChain", "filter", "subFilter", "name"); sub != "envoy.filters.http.router" {
				t.Errorf("patch %d inserts before %v, want the router", i, sub)
			}
			inserted = append(inserted, any(v))
		case p.ApplyTo == "HTTP_FILTER" && p.Patch.Operation == "MERGE":
			sawRouter = true
			tc := v["typed_config"].(obj)
			want := router["typed_config"].(obj)
			for k, w := range want {
				if k == "upstream_log" {
					w = grpcOnly(w)
				}
				if !reflect.DeepEqual(tc[k], w) {
					t.Errorf("router field %s: got %v, want the bootstrap's %v", k, tc[k], w)
				}
			}
		case p.ApplyTo == "HTTP_ROUTE" && p.Patch.Operation == "MERGE":
			name, _ := get(t, p.Match, "routeConfiguration", "vhost", "route", "name").(string)
			j := slices.Index(routeNames, name)
			if j < 0 {
				t.Errorf("route patch matches %q, want one of the VirtualService routes %v", name, routeNames)
				continue
			}
			patchedRoutes[name] = true
			if want := bootRoutes[j].(obj)["route"]; !reflect.DeepEqual(v["route"], want) {
				t.Errorf("route %s action:\n got %v\nwant %v", name, v["route"], want)
			}
		default:
			t.Errorf("patch %d: unexpected %s %s", i, p.Patch.Operation, p.ApplyTo)
		}
	}
	if want := bootFilters[:len(bootFilters)-1]; !reflect.DeepEqual(inserted, want) {
		t.Errorf("HTTP filters inserted before the router:\n got %v\nwant %v", inserted, want)
	}
	for name := range bootClusters {
		if !added[name] {
			t.Errorf("the EnvoyFilter does not add the bootstrap's cluster %s", name)
		}
	}
	for _, name := range routeNames {
		if !patchedRoutes[name] {
			t.Errorf("no patch for the VirtualService route %s", name)
		}
	}
	if !sawHCM || !sawRouter || !sawListener {
		t.Errorf("missing patches: HCM %v, router %v, listener %v", sawHCM, sawRouter, sawListener)
	}
}

// yamlDocs reads every document of a multi-document YAML file.
func yamlDocs(t *testing.T, path string) []obj {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []obj
	for {
		var doc obj
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, doc)
	}
}

// The VirtualService route the EnvoyFilter patches must exist under that
// name and bring no Istio retry policy or timeout of its own; the Gateway
// must select the pods the EnvoyFilter patches.
func TestGatewayAndRoute(t *testing.T) {
	var route, gatewaySelector, filterSelector any
	for _, path := range []string{"gateway.yaml", "envoyfilter.yaml"} {
		for _, doc := range yamlDocs(t, path) {
			switch doc["kind"] {
			case "Gateway":
				gatewaySelector = get(t, doc, "spec", "selector")
			case "EnvoyFilter":
				filterSelector = get(t, doc, "spec", "workloadSelector", "labels")
			case "VirtualService":
				for _, r := range get(t, doc, "spec", "http").([]any) {
					if r.(obj)["name"] == "duet-inference" {
						route = r
					}
				}
			}
		}
	}
	if route == nil {
		t.Fatal("gateway.yaml has no VirtualService route named duet-inference")
	}
	if got := get(t, route, "retries", "attempts"); got != 0 {
		t.Errorf("retries.attempts = %v, want 0 (Istio's default retries would replay requests)", got)
	}
	if got, ok := route.(obj)["timeout"]; ok {
		t.Errorf("timeout = %v, want none (Istio's default: no timeout)", got)
	}
	if gatewaySelector == nil || !reflect.DeepEqual(gatewaySelector, filterSelector) {
		t.Errorf("the Gateway selects %v, the EnvoyFilter patches %v", gatewaySelector, filterSelector)
	}
}
