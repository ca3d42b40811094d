package istio

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
)

// The two-pool example: pools/ holds what differs from the single-pool
// example (the VirtualService with a route per pool, the EnvoyFilter with
// the engine clusters and route patch per pool); auth.yaml, replicas.yaml
// and nats.yaml apply as they are. duet's configuration for it is
// testdata/duet-pools.yaml (docs/deploy/istio.md, Two models).
var (
	poolsIstioManifests = []string{filepath.Join("pools", "gateway.yaml"), filepath.Join("pools", "envoyfilter.yaml"), "auth.yaml"}
	poolsManifests      = append(slices.Clone(poolsIstioManifests), "replicas.yaml", "nats.yaml")
	poolsFixture        = filepath.Join("testdata", "pools-cluster.yaml")
	poolsDuetConfig     = filepath.Join("testdata", "duet-pools.yaml")
)

// istioPool is one pool of testdata/duet-pools.yaml, as the tests read it.
type istioPool struct {
	Name       string `yaml:"name"`
	Kubernetes struct {
		Prefill *struct {
			Service string `yaml:"service"`
		} `yaml:"prefill"`
		Decode struct {
			Service string `yaml:"service"`
			DPSize  int    `yaml:"dp_size"`
		} `yaml:"decode"`
	} `yaml:"kubernetes"`
}

func (p istioPool) pd() bool { return p.Kubernetes.Prefill != nil }

// route is the VirtualService route of the pool, which the EnvoyFilter
// patches.
func (p istioPool) route() string { return "duet-" + p.Name }

// Envoy clusters are duet's default names for the pool's.
func (p istioPool) decodeCluster() string  { return "duet_" + p.Name + "_decode" }
func (p istioPool) prefillCluster() string { return "duet_" + p.Name + "_prefill" }

func readPools(t *testing.T) []istioPool {
	t.Helper()
	data, err := os.ReadFile(poolsDuetConfig)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Pools []istioPool `yaml:"pools"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Pools) != 2 || !cfg.Pools[0].pd() || cfg.Pools[1].pd() {
		t.Fatalf("%s: want a PD pool, then an aggregated one", poolsDuetConfig)
	}
	// The aggregated pool's vLLM engines serve no /server_info: without its
	// Service's dp_size the pool would never become ready.
	if q := cfg.Pools[1]; q.Kubernetes.Decode.DPSize < 1 {
		t.Fatalf("%s: pool %s (vLLM): Service %s has no dp_size", poolsDuetConfig, q.Name, q.Kubernetes.Decode.Service)
	}
	return cfg.Pools
}

// renderedPoolsBootstrap is what `duet envoy-config` renders for
// testdata/duet-pools.yaml.
func renderedPoolsBootstrap(t *testing.T) obj {
	t.Helper()
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tools.Duet, "envoy-config", "-config", poolsDuetConfig).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("duet envoy-config: %v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var b obj
	if err := yaml.Unmarshal(out, &b); err != nil {
		t.Fatal(err)
	}
	return b
}

// The two-pool EnvoyFilter carries exactly what `duet envoy-config` renders
// for duet's configuration with the same pools: every pool's engine
// clusters, one route patch per pool (the mirror on the PD pool's only),
// and the rest as in the single-pool EnvoyFilter, which it equals but for
// the engine clusters and the routes.
func TestPoolsEnvoyFilterMatchesRenderedBootstrap(t *testing.T) {
	pools := readPools(t)
	var routes []string
	for _, p := range pools {
		routes = append(routes, p.route())
	}
	checkEnvoyFilterMatches(t, renderedPoolsBootstrap(t), filepath.Join("pools", "envoyfilter.yaml"), routes)

	shared := func(path string) []patch {
		var out []patch
		for _, p := range envoyFilterPatches(t, path) {
			if p.ApplyTo == "HTTP_ROUTE" || (p.ApplyTo == "CLUSTER" && p.Patch.Value["name"] != "duet_extproc" && p.Patch.Value["name"] != "duet_feedback") {
				continue
			}
			out = append(out, p)
		}
		return out
	}
	if a, b := shared(filepath.Join("pools", "envoyfilter.yaml")), shared("envoyfilter.yaml"); !reflect.DeepEqual(a, b) {
		t.Error("pools/envoyfilter.yaml differs from envoyfilter.yaml beyond the engine clusters and the route patches")
	}
}

// The VirtualService has one route per pool, named as the EnvoyFilter
// patches it, matching x-duet-pool exactly on the pool's name, to the
// pool's decode Service, without Istio's retries or a timeout; the Gateway
// is the single-pool one.
func TestPoolsGatewayAndRoutes(t *testing.T) {
	pools := readPools(t)
	var gw, singleGW obj
	var routes []any
	for _, doc := range yamlDocs(t, filepath.Join("pools", "gateway.yaml")) {
		switch doc["kind"] {
		case "Gateway":
			gw = doc
		case "VirtualService":
			routes = get(t, doc, "spec", "http").([]any)
		}
	}
	for _, doc := range yamlDocs(t, "gateway.yaml") {
		if doc["kind"] == "Gateway" {
			singleGW = doc
		}
	}
	if gw == nil || !reflect.DeepEqual(gw, singleGW) {
		t.Errorf("pools/gateway.yaml's Gateway %v, want gateway.yaml's %v", gw, singleGW)
	}
	if len(routes) != len(pools) {
		t.Fatalf("%d routes, want one per pool (%d)", len(routes), len(pools))
	}
	for i, p := range pools {
		r := routes[i].(obj)
		if r["name"] != p.route() {
			t.Errorf("route %d is %v, want %s", i, r["name"], p.route())
		}
		if got := get(t, r, "match", 0, "headers", "x-duet-pool", "exact"); got != p.Name || len(r["match"].([]any)) != 1 {
			t.Errorf("route %s matches %v, want x-duet-pool exactly %s", p.route(), r["match"], p.Name)
		}
		if got := get(t, r, "route", 0, "destination", "host"); got != p.Kubernetes.Decode.Service+".inference.svc.cluster.local" {
			t.Errorf("route %s goes to %v, want the pool's decode Service %s", p.route(), got, p.Kubernetes.Decode.Service)
		}
		if got := get(t, r, "retries", "attempts"); got != 0 {
			t.Errorf("route %s: retries.attempts = %v, want 0", p.route(), got)
		}
		if _, ok := r["timeout"]; ok {
			t.Errorf("route %s sets a timeout", p.route())
		}
	}
}

// istioctl analyze, offline and with the stand-in cluster objects, reports
// nothing on the two-pool manifests but the EnvoyFilter warning, and every
// Istio object satisfies its CRD's schema.
func TestPoolsAnalyze(t *testing.T) {
	tools := findIstioTools(t)
	files := append(slices.Clone(poolsManifests), fixture, poolsFixture)
	checkClean(t, istioctlAnalyze(t, tools, files...))
	checkClean(t, clusterAnalyze(t, tools, files...))
	out, err := exec.Command(tools.Check, append([]string{"crd", "-crds", tools.CRDs}, poolsIstioManifests...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("CRD schema validation: %v\n%s", err, out)
	}
}

// Istio's own configuration generator applies every patch of the two-pool
// EnvoyFilter: per pool, a route matched on x-duet-pool to the pool's
// decode cluster with duet's retry, the mirror by x-duet-mirror on the PD
// pool's route only; every pool's engine clusters; and the result loads in
// the real Envoy.
func TestPoolsIstioGeneratedGatewayLoadsInEnvoy(t *testing.T) {
	tools := findIstioTools(t)
	envoyTools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	pools := readPools(t)
	boot, _ := generateGatewayConfig(t, tools, append(slices.Clone(poolsManifests), fixture, poolsFixture)...)
	f := readGateway(t, boot)
	for _, c := range []string{"duet_extproc", "duet_feedback", pools[0].decodeCluster(), pools[0].prefillCluster(), pools[1].decodeCluster()} {
		if !f.clusters[c] {
			t.Errorf("cluster %s missing from the generated configuration", c)
		}
	}
	if f.clusters[pools[1].prefillCluster()] || f.clusters["duet_decode"] || f.clusters["duet_prefill"] {
		t.Errorf("clusters of no pool in the generated configuration: %v", f.clusters)
	}
	if !f.earlyHeaders {
		t.Error("no early header mutation: a client's x-duet-pool would reach duet and the routes")
	}
	byName := map[string]obj{}
	harness.Walk(boot["staticResources"], func(m map[string]any) {
		if name, ok := m["name"].(string); ok && m["match"] != nil && m["route"] != nil {
			byName[name] = m
		}
	})
	for _, p := range pools {
		r, ok := byName[p.route()]
		if !ok {
			t.Errorf("route %s missing", p.route())
			continue
		}
		headers := asList(get(t, r, "match", "headers"))
		if len(headers) != 1 || headers[0].(obj)["name"] != "x-duet-pool" || get(t, headers[0], "stringMatch", "exact") != p.Name {
			t.Errorf("route %s matches headers %v, want x-duet-pool exactly %s", p.route(), headers, p.Name)
		}
		action := r["route"].(obj)
		if action["cluster"] != p.decodeCluster() {
			t.Errorf("route %s: cluster %v, want %s", p.route(), action["cluster"], p.decodeCluster())
		}
		rp, _ := action["retryPolicy"].(obj)
		if rp["retryOn"] != "connect-failure,reset-before-request" || rp["numRetries"] != float64(1) || len(rp) != 2 {
			t.Errorf("route %s: retry policy %v, want exactly duet's", p.route(), rp)
		}
		mirrors := asList(action["requestMirrorPolicies"])
		switch {
		case p.pd() && (len(mirrors) != 1 || mirrors[0].(obj)["clusterHeader"] != "x-duet-mirror"):
			t.Errorf("PD pool %s: mirrors %v, want one by cluster_header x-duet-mirror", p.Name, mirrors)
		case !p.pd() && len(mirrors) != 0:
			t.Errorf("aggregated pool %s: mirrors %v, want none", p.Name, mirrors)
		}
	}
	loadsInEnvoy(t, envoyTools.Envoy, boot, "Istio's two-pool gateway configuration")
}
