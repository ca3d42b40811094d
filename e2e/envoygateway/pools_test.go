package envoygateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/extproc/accesslog"
)

// The two-pool example: deploy/envoy-gateway/pools holds what differs from
// the single-pool example (duet's ConfigMap with its pools, the HTTPRoute
// with a rule per pool, the patch with the mirror on the PD pool's route
// only); the rest is applied from deploy/envoy-gateway as it is
// (docs/deploy/envoy-gateway.md, Two models).
const poolsDir = "../../deploy/envoy-gateway/pools"

// sharedManifests are the single-pool files that the two-pool example
// applies unchanged, and poolsManifests the files of poolsDir.
var (
	sharedManifests = []string{"gateway.yaml", "nats.yaml", "policies.yaml"}
	poolsManifests  = []string{"duet.yaml", "patch.yaml", "route.yaml"}
)

// poolHeader is the header duet names a request's pool in.
const poolHeader = "x-duet-pool"

// loadPoolManifests reads the resources the two-pool example applies: the
// shared files of deploy/envoy-gateway, then deploy/envoy-gateway/pools.
func loadPoolManifests() ([]object, error) {
	got, err := filepath.Glob(filepath.Join(poolsDir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	for i := range got {
		got[i] = filepath.Base(got[i])
	}
	if sort.Strings(got); !slices.Equal(got, poolsManifests) {
		return nil, fmt.Errorf("%s holds %v, want %v (the docs apply exactly these)", poolsDir, got, poolsManifests)
	}
	var files []string
	for _, f := range sharedManifests {
		files = append(files, filepath.Join(manifestDir, f))
	}
	for _, f := range poolsManifests {
		files = append(files, filepath.Join(poolsDir, f))
	}
	return decodeManifests(files)
}

// loadPools reads the two-pool example's resources (loadPoolManifests) and
// the pools of duet's ConfigMap among them (duetPools).
func loadPools(t *testing.T) ([]object, []poolSpec) {
	t.Helper()
	objs, err := loadPoolManifests()
	if err != nil {
		t.Fatal(err)
	}
	pools, err := duetPools(objs)
	if err != nil {
		t.Fatal(err)
	}
	return objs, pools
}

// poolSpec is one pool of duet's ConfigMap, as the tests read it.
type poolSpec struct {
	Name       string   `yaml:"name"`
	Models     []string `yaml:"models"`
	Aliases    []string `yaml:"aliases"`
	Kubernetes struct {
		Prefill *poolService `yaml:"prefill"`
		Decode  *poolService `yaml:"decode"`
	} `yaml:"kubernetes"`
	Clusters struct{ Decode, Prefill string } `yaml:"clusters"`
}

// poolService is a pool's Service for one role: its name and the DP size
// duet gives every engine found behind it (0: read from the engine).
type poolService struct {
	Service string `yaml:"service"`
	DPSize  int    `yaml:"dp_size"`
}

func (p poolSpec) pd() bool { return p.Kubernetes.Prefill != nil }

// services are the pool's Services: decode, and prefill for a PD pool.
func (p poolSpec) services() []string {
	var out []string
	if p.Kubernetes.Decode != nil {
		out = append(out, p.Kubernetes.Decode.Service)
	}
	if p.Kubernetes.Prefill != nil {
		out = append(out, p.Kubernetes.Prefill.Service)
	}
	return out
}

// engineClusters are the decode and prefill cluster of each pool; an
// aggregated pool's prefill cluster is left empty (Envoy has none).
func engineClusters(pools []poolSpec) [][2]string {
	var out [][2]string
	for _, p := range pools {
		pair := [2]string{p.Clusters.Decode, ""}
		if p.pd() {
			pair[1] = p.Clusters.Prefill
		}
		out = append(out, pair)
	}
	return out
}

// duetPools reads the pools of the duet.yaml of duet's ConfigMap. Each must
// find its engines through Kubernetes and name its clusters.
func duetPools(objs []object) ([]poolSpec, error) {
	var cfg struct {
		Pools []poolSpec `yaml:"pools"`
	}
	if err := yaml.Unmarshal([]byte(str(find(objs, "ConfigMap", duetService), "data", "duet.yaml")), &cfg); err != nil {
		return nil, fmt.Errorf("ConfigMap duet: duet.yaml: %w", err)
	}
	if len(cfg.Pools) == 0 {
		return nil, errors.New("ConfigMap duet: duet.yaml has no pools")
	}
	for _, p := range cfg.Pools {
		if p.Kubernetes.Decode == nil || p.Clusters.Decode == "" || (p.pd() && p.Clusters.Prefill == "") || len(p.Models) == 0 {
			return nil, fmt.Errorf("ConfigMap duet: pool %s: want models, kubernetes Services and clusters", p.Name)
		}
	}
	return cfg.Pools, nil
}

// poolsTranslationInput is translationInput for any number of engine
// Services: pods maps each Service that the HTTPRoute sends or mirrors to
// to the placeholder pod addresses ("ip:port") of its Backend. Every
// Service of pods must be referred to.
func poolsTranslationInput(objs, extra []object, pods map[string][]string) ([]byte, error) {
	route := find(objs, "HTTPRoute", "duet")
	if route == nil {
		return nil, errors.New("no HTTPRoute duet")
	}
	backend := func(name string) object {
		return object{"group": "gateway.envoyproxy.io", "kind": "Backend", "name": name}
	}
	swapped := map[string]bool{}
	for _, r := range list(harness.Dig(route, "spec", "rules")) {
		refs := list(harness.Dig(r, "backendRefs"))
		for i, ref := range refs {
			if name := str(ref, "name"); pods[name] != nil {
				refs[i] = backend(name)
				swapped[name] = true
			}
		}
		for _, f := range list(harness.Dig(r, "filters")) {
			if m, ok := harness.Dig(f, "requestMirror").(map[string]any); ok && pods[str(m, "backendRef", "name")] != nil {
				swapped[str(m, "backendRef", "name")] = true
				m["backendRef"] = backend(str(m, "backendRef", "name"))
			}
		}
	}
	out := egctlObjects(objs, extra)
	services := slices.Sorted(func(yield func(string) bool) {
		for s := range pods {
			if !yield(s) {
				return
			}
		}
	})
	for _, name := range services {
		if !swapped[name] {
			return nil, fmt.Errorf("HTTPRoute duet does not send or mirror to Service %s", name)
		}
		out = append(out, podBackend(name, pods[name]))
	}
	svc := find(objs, "Service", duetService)
	spec, ok := harness.Dig(svc, "spec").(map[string]any)
	if !ok {
		return nil, errors.New("no Service duet")
	}
	spec["clusterIP"] = duetClusterIP
	return marshalYAML(out...)
}

// poolPods gives the engines (base URLs) of each Service placeholder pod
// addresses, 10.1.<Service's index>.<i+1>, and returns them with the map
// from each placeholder back to the engine's loopback address.
func poolPods(engines map[string][]string) (pods map[string][]string, remap map[string]string, err error) {
	pods, remap = map[string][]string{}, map[string]string{}
	names := make([]string, 0, len(engines))
	for s := range engines {
		names = append(names, s)
	}
	sort.Strings(names)
	for k, s := range names {
		for i, e := range engines[s] {
			u, err := url.Parse(e)
			if err != nil {
				return nil, nil, err
			}
			_, port, _ := net.SplitHostPort(u.Host)
			pod := fmt.Sprintf("10.1.%d.%d:%s", k+1, i+1, port)
			pods[s] = append(pods[s], pod)
			remap[pod] = u.Host
		}
	}
	return pods, remap, nil
}

// poolRouteHeader returns the pool a route matches on (the exact value of
// its x-duet-pool header matcher), or "" for a route without one.
func poolRouteHeader(r any) string {
	for _, h := range list(harness.Dig(r, "match", "headers")) {
		if str(h, "name") == poolHeader {
			if v := str(h, "stringMatch", "exact"); v != "" {
				return v
			}
			return "(not an exact match)"
		}
	}
	return ""
}

// extProcOn reports whether a route runs duet's ext_proc filter: Envoy
// Gateway disables it in the connection manager and enables it per route.
func extProcOn(r any) bool {
	for k := range mapOf(harness.Dig(r, "typedPerFilterConfig")) {
		if strings.HasPrefix(k, "envoy.filters.http.ext_proc/") {
			return true
		}
	}
	return false
}

func mapOf(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// poolEffects lists what the gateway's xDS lacks of the two-pool example:
// the listener as in the single-pool example (listenerEffects); per pool,
// routes matching x-duet-pool exactly on its name, to its decode cluster,
// with duet's timeout and retry, ext_proc on, and the mirror by
// x-duet-mirror on a PD pool's routes only; after them, an entry route
// with ext_proc on that sends nowhere (a direct 503); each PD pool's
// engine clusters as in the single-pool example, each aggregated pool's
// decode cluster with override_host and without the body-rank filter; and
// no other engine cluster.
func poolEffects(listener any, routes, clusters []any, pools []poolSpec) []string {
	missing := listenerEffects(listener)
	need := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}
	byPool := map[string]poolSpec{}
	for _, p := range pools {
		byPool[p.Name] = p
	}
	seen := map[string]int{}
	entries, lastPool, firstEntry := 0, -1, -1
	i := 0
	for _, rc := range routes {
		for _, vh := range list(harness.Dig(rc, "virtualHosts")) {
			for _, r := range list(harness.Dig(vh, "routes")) {
				name := str(r, "name")
				need(extProcOn(r), "route "+name+": ext_proc enabled")
				pool := poolRouteHeader(r)
				if pool == "" {
					entries++
					if firstEntry < 0 {
						firstEntry = i
					}
					need(harness.Dig(r, "directResponse", "status") == float64(http.StatusServiceUnavailable) && harness.Dig(r, "route") == nil,
						"entry route "+name+": a direct 503, no cluster")
					i++
					continue
				}
				lastPool = i
				i++
				p, ok := byPool[pool]
				if !ok {
					missing = append(missing, fmt.Sprintf("route %s matches %s %q, which is no pool of duet's", name, poolHeader, pool))
					continue
				}
				seen[pool]++
				need(str(r, "route", "cluster") == p.Clusters.Decode, "route "+name+": cluster "+p.Clusters.Decode)
				need(str(r, "route", "timeout") == "0s", "route "+name+": timeout 0s")
				need(str(r, "route", "retryPolicy", "retryOn") == "connect-failure,reset-before-request", "route "+name+": retry on connect-failure,reset-before-request")
				mirrors := list(harness.Dig(r, "route", "requestMirrorPolicies"))
				if p.pd() {
					need(len(mirrors) == 1 && str(mirrors[0], "clusterHeader") == "x-duet-mirror" && str(mirrors[0], "cluster") == "" &&
						len(list(harness.Dig(mirrors[0], "requestHeadersMutations"))) == 2,
						"route "+name+" (PD pool "+pool+"): the one mirror by cluster_header x-duet-mirror with the prefill rank mutations")
				} else {
					need(len(mirrors) == 0, fmt.Sprintf("route %s (aggregated pool %s): no mirror, got %v", name, pool, mirrors))
				}
			}
		}
	}
	for _, p := range pools {
		need(seen[p.Name] > 0, "a route for pool "+p.Name)
	}
	need(entries > 0, "an entry route without "+poolHeader+", which runs ext_proc")
	need(firstEntry > lastPool, "the pools' routes before the entry route (Envoy takes the first match)")

	byName := map[string]any{}
	for _, c := range clusters {
		byName[str(c, "name")] = c
	}
	want := map[string]bool{}
	for _, p := range pools {
		want[p.Clusters.Decode] = true
		if p.pd() {
			want[p.Clusters.Prefill] = true
			missing = append(missing, engineClusterEffects(clusters, p.Clusters.Decode, p.Clusters.Prefill)...)
			continue
		}
		cl, ok := byName[p.Clusters.Decode]
		need(ok, "cluster "+p.Clusters.Decode)
		policy := harness.Dig(cl, "loadBalancingPolicy", "policies", 0, "typedExtensionConfig")
		need(str(policy, "name") == "envoy.load_balancing_policies.override_host" &&
			str(policy, "typedConfig", "overrideHostSources", 0, "header") == "x-duet-decode-endpoint",
			"cluster "+p.Clusters.Decode+": override_host on x-duet-decode-endpoint")
		need(harness.Dig(cl, "perConnectionBufferLimitBytes") == float64(32<<20), "cluster "+p.Clusters.Decode+": 32 MiB buffer limit")
		need(harness.Dig(cl, "circuitBreakers", "thresholds", 0, "maxRetries") == float64(1024), "cluster "+p.Clusters.Decode+": circuit breakers")
		need(harness.Dig(cl, "typedExtensionProtocolOptions") == nil, "cluster "+p.Clusters.Decode+": no body-rank filter (an aggregated pool's decode leg)")
	}
	for name := range byName {
		if strings.HasPrefix(name, "httproute/") && !want[name] {
			missing = append(missing, "cluster "+name+": an engine cluster of no pool")
		}
	}
	slices.Sort(missing)
	return missing
}

// poolsBootstrap translates the two-pool manifests objs (which it changes)
// with egctl in dir, the Services' pods at the engines' addresses, and
// returns the static bootstrap for duet and Envoy at addrs. The
// translation must be accepted whole and have what poolEffects checks.
func poolsBootstrap(ctx context.Context, egctl, dir string, objs []object, addrs harness.Addresses, engines map[string][]string) ([]byte, error) {
	pools, err := duetPools(objs)
	if err != nil {
		return nil, err
	}
	pods, remap, err := poolPods(engines)
	if err != nil {
		return nil, err
	}
	tr, g, secrets, err := translateWhole(ctx, egctl, dir, objs, addrs.Credentials, "the two-pool manifests", func(extra []object) ([]byte, error) {
		return poolsTranslationInput(objs, extra, pods)
	})
	if err != nil {
		return nil, err
	}
	return tr.bootstrapChecked(addrs, remap, g, secrets, engineClusters(pools), func(listener any, routes, clusters []any) []string {
		return poolEffects(listener, routes, clusters, pools)
	})
}

// placeholderEngines gives every Service of the pools one engine on a
// loopback port, for translations that run no engine.
func placeholderEngines(pools []poolSpec) map[string][]string {
	out := map[string][]string{}
	port := 30001
	for _, p := range pools {
		for _, s := range p.services() {
			out[s] = []string{fmt.Sprintf("http://127.0.0.1:%d", port)}
			port++
		}
	}
	return out
}

// placeholderAddrs are loopback addresses for a translation that runs
// nothing.
func placeholderAddrs(creds harness.Credentials) harness.Addresses {
	return harness.Addresses{DuetGRPC: "127.0.0.1:9002", EnvoyListen: "127.0.0.1:10080", EnvoyAdmin: "127.0.0.1:10081", Credentials: creds}
}

// TestPoolsManifests: the two-pool example is the single-pool one with
// the pools' changes only. Its duet.yaml holds the same objects but for
// the ConfigMap's duet.yaml, whose sections other than pools and
// kubernetes (where the pools' Services are) are the single-pool ones;
// its patch.yaml is the single-pool one but for the mirror's jsonPath;
// every pool's Services are the HTTPRoute's backends (a PD pool's prefill
// Service its mirror) in the rule whose cluster the pool names; and the
// resources together are the single-pool example's plus the entry rule's
// HTTPRouteFilter. The aggregated (vLLM) pool's Service gives its engines'
// dp_size.
func TestPoolsManifests(t *testing.T) {
	single, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := loadPoolManifests()
	if err != nil {
		t.Fatal(err)
	}
	key := func(o object) string { return str(o, "kind") + "/" + str(o, "metadata", "name") }
	var singleKeys, poolKeys []string
	for _, o := range single {
		singleKeys = append(singleKeys, key(o))
	}
	for _, o := range objs {
		poolKeys = append(poolKeys, key(o))
	}
	slices.Sort(singleKeys)
	slices.Sort(poolKeys)
	wantKeys := slices.Sorted(slices.Values(append(slices.Clone(singleKeys), "HTTPRouteFilter/duet-no-pool")))
	if !slices.Equal(poolKeys, wantKeys) {
		t.Errorf("the two-pool example's resources:\n%v\nwant the single-pool example's and HTTPRouteFilter/duet-no-pool:\n%v", poolKeys, wantKeys)
	}
	for _, o := range objs {
		s := find(single, str(o, "kind"), str(o, "metadata", "name"))
		switch key(o) {
		case "HTTPRoute/duet", "HTTPRouteFilter/duet-no-pool":
			continue
		case "ConfigMap/duet":
			var a, b map[string]any
			if err := yaml.Unmarshal([]byte(str(o, "data", "duet.yaml")), &a); err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal([]byte(str(s, "data", "duet.yaml")), &b); err != nil {
				t.Fatal(err)
			}
			for _, m := range []map[string]any{a, b} {
				delete(m, "pools")
				delete(m, "kubernetes")
			}
			delete(b["envoy"].(map[string]any), "clusters")
			if len(b["envoy"].(map[string]any)) == 0 {
				delete(b, "envoy")
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("ConfigMap duet: duet.yaml differs from the single-pool one beyond pools and kubernetes:\n got %v\nwant %v", a, b)
			}
			continue
		case "EnvoyPatchPolicy/duet":
			a, b := list(harness.Dig(o, "spec", "jsonPatches")), list(harness.Dig(s, "spec", "jsonPatches"))
			diff := 0
			for i := range max(len(a), len(b)) {
				if i >= len(a) || i >= len(b) || !reflect.DeepEqual(a[i], b[i]) {
					diff++
					if i < len(a) && i < len(b) && str(a[i], "operation", "path") == "/request_mirror_policies" {
						continue
					}
					t.Errorf("EnvoyPatchPolicy duet: patch %d differs from the single-pool one and is not the mirror's", i)
				}
			}
			if diff != 1 {
				t.Errorf("EnvoyPatchPolicy duet: %d patches differ from the single-pool ones, want 1 (the mirror's jsonPath)", diff)
			}
			continue
		}
		if !reflect.DeepEqual(o, s) {
			t.Errorf("%s differs from the single-pool example's", key(o))
		}
	}

	pools, err := duetPools(objs)
	if err != nil {
		t.Fatal(err)
	}
	rules := list(harness.Dig(find(objs, "HTTPRoute", "duet"), "spec", "rules"))
	for _, p := range pools {
		var rule any
		for i, r := range rules {
			if fmt.Sprintf("httproute/%s/duet/rule/%d", namespace, i) == p.Clusters.Decode {
				rule = r
			}
		}
		if rule == nil {
			t.Errorf("pool %s: decode cluster %s is no rule of HTTPRoute duet", p.Name, p.Clusters.Decode)
			continue
		}
		refs := list(harness.Dig(rule, "backendRefs"))
		if len(refs) != 1 || str(refs[0], "name") != p.Kubernetes.Decode.Service {
			t.Errorf("pool %s: its rule sends to %v, want the pool's decode Service %s", p.Name, refs, p.Kubernetes.Decode.Service)
		}
		headers := list(harness.Dig(rule, "matches", 0, "headers"))
		if len(list(harness.Dig(rule, "matches"))) != 1 || len(headers) != 1 || str(headers[0], "name") != poolHeader || str(headers[0], "value") != p.Name {
			t.Errorf("pool %s: its rule matches %v, want %s: %s alone", p.Name, harness.Dig(rule, "matches"), poolHeader, p.Name)
		}
		var mirrors []string
		for _, f := range list(harness.Dig(rule, "filters")) {
			if m := str(f, "requestMirror", "backendRef", "name"); m != "" {
				mirrors = append(mirrors, m)
			}
		}
		switch {
		case p.pd() && (!slices.Equal(mirrors, []string{p.Kubernetes.Prefill.Service}) || p.Clusters.Prefill != p.Clusters.Decode+"-mirror-0"):
			t.Errorf("PD pool %s: its rule mirrors to %v and duet names prefill cluster %s; want the mirror to %s, cluster %s-mirror-0",
				p.Name, mirrors, p.Clusters.Prefill, p.Kubernetes.Prefill.Service, p.Clusters.Decode)
		case !p.pd() && len(mirrors) > 0:
			t.Errorf("aggregated pool %s: its rule mirrors to %v", p.Name, mirrors)
		}
		// The aggregated pool's vLLM engines serve no /server_info: without
		// its Service's dp_size the pool would never become ready.
		if !p.pd() && p.Kubernetes.Decode.DPSize < 1 {
			t.Errorf("aggregated (vLLM) pool %s: Service %s has dp_size %d, want its engines' DP size", p.Name, p.Kubernetes.Decode.Service, p.Kubernetes.Decode.DPSize)
		}
	}
}

// TestPoolsTranslation: Envoy Gateway v1.9.1 takes the two-pool example
// whole, and its xDS has per pool a route matched on x-duet-pool to the
// pool's decode cluster, the mirror on the PD pool's route only, the
// entry route that runs duet for requests not yet routed, and the pools'
// engine clusters with duet's load balancing (poolEffects); the result
// loads in Envoy. The checks catch a mirror on every route (the
// single-pool patch) and a missing entry rule.
func TestPoolsTranslation(t *testing.T) {
	egctl, creds := translateSetup(t)
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	objs, pools := loadPools(t)
	dir := t.TempDir()
	boot, err := poolsBootstrap(context.Background(), egctl, dir, objs, placeholderAddrs(creds), placeholderEngines(pools))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "envoy.json")
	if err := os.WriteFile(path, boot, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tools.Envoy, "--mode", "validate", "-c", path, "--disable-hot-restart").CombinedOutput(); err != nil {
		t.Fatalf("Envoy rejects the two-pool translation: %v\n%s", err, out)
	}

	for _, c := range []struct {
		name   string
		change func(objs []object)
		want   string
	}{
		{"the mirror on every route", func(objs []object) {
			for _, p := range list(harness.Dig(find(objs, "EnvoyPatchPolicy", "duet"), "spec", "jsonPatches")) {
				if str(p, "operation", "path") == "/request_mirror_policies" {
					harness.Dig(p, "operation").(map[string]any)["jsonPath"] = "$.virtual_hosts[*].routes[*].route"
				}
			}
		}, "(aggregated pool qwen): no mirror"},
		{"no entry rule", func(objs []object) {
			r := harness.Dig(find(objs, "HTTPRoute", "duet"), "spec").(map[string]any)
			rules := list(r["rules"])
			r["rules"] = rules[:len(rules)-1]
		}, "an entry route without x-duet-pool"},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, err := loadPoolManifests()
			if err != nil {
				t.Fatal(err)
			}
			c.change(objs)
			_, err = poolsBootstrap(context.Background(), egctl, t.TempDir(), objs, placeholderAddrs(creds), placeholderEngines(pools))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// poolsStack is the two-pool example running on loopback: the engines of
// each pool, one duet with the ConfigMap's pools (the engines listed in
// place of the Kubernetes Services), and Envoy on the bootstrap made from
// egctl's translation of the manifests.
type poolsStack struct {
	stack *harness.Stack // the fields WaitCompletions and DuetMetrics use
	pools []poolSpec
	// sims holds each pool's engines by role: prefill, decode.
	sims map[string]map[string][]*harness.Sim
	duet *harness.Process
}

// all returns every running engine of the stack.
func (ps *poolsStack) all() []*harness.Sim {
	var out []*harness.Sim
	for _, p := range ps.pools {
		for _, sim := range append(slices.Clone(ps.sims[p.Name]["prefill"]), ps.sims[p.Name]["decode"]...) {
			if !sim.Exited() {
				out = append(out, sim)
			}
		}
	}
	return out
}

// poolDuetConfig is the ConfigMap's duet.yaml made to run on loopback:
// listen addresses and credential files of the test, each pool's engines
// listed instead of found through Kubernetes (the test has no API server),
// no NATS (one replica), and load scrapes and discovery as the harness runs
// them. Each listed engine carries its Service's dp_size from the manifest,
// as discovery would give it to every engine of that Service: the vLLM
// engines serve no /server_info, so theirs comes from there alone.
func poolDuetConfig(objs []object, grpc, admin string, creds harness.Credentials, engines map[string]map[string][]string) ([]byte, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(str(find(objs, "ConfigMap", duetService), "data", "duet.yaml")), &cfg); err != nil {
		return nil, err
	}
	cfg["log_level"] = "debug"
	cfg["listen"] = map[string]any{"grpc": grpc, "admin": admin}
	cfg["auth"] = map[string]any{
		"tls": map[string]any{"cert_file": creds.DuetCertFile, "key_file": creds.DuetKeyFile,
			"client_ca_file": creds.CAFile, "client_names": []string{creds.ClientName}},
		"admin_token_file": creds.AdminTokenFile,
	}
	cfg["discovery"] = map[string]any{"interval": "2s", "timeout": "1s"}
	cfg["load"] = map[string]any{"interval": "200ms", "timeout": "1s"}
	delete(cfg, "sync")
	delete(cfg, "kubernetes")
	for _, p := range list(cfg["pools"]) {
		m := p.(map[string]any)
		services, _ := m["kubernetes"].(map[string]any)
		delete(m, "kubernetes")
		for role, urls := range engines[str(m, "name")] {
			dp, _ := harness.Dig(services, role, "dp_size").(int)
			var eps []any
			for _, u := range urls {
				ep := map[string]any{"url": u}
				if dp > 0 {
					ep["dp_size"] = dp
				}
				eps = append(eps, ep)
			}
			m[role] = eps
		}
	}
	return yaml.Marshal(cfg)
}

// startPools runs the two-pool example: for pool deepseek (PD) two SGLang
// prefill engines (dp 2 and dp 4) and two SGLang decode engines (dp 2),
// for pool qwen (aggregated) two vLLM engines (the dp_size of its Service in
// the manifest, 2), each serving its
// pool's first model name; duet; and Envoy on the translation.
func startPools(t *testing.T) *poolsStack {
	t.Helper()
	egctl, tools := findTools(t)
	objs, pools := loadPools(t)
	dir := keptDir(t, "duet-envoygateway-pools-")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ps := &poolsStack{pools: pools, sims: map[string]map[string][]*harness.Sim{}}
	var procs []*harness.Process
	t.Cleanup(func() {
		for _, p := range procs {
			if t.Failed() {
				t.Logf("%s", p.Tail(30))
			}
			p.Stop(5 * time.Second)
		}
	})
	byService := map[string][]string{}         // Service: engine URLs
	byPool := map[string]map[string][]string{} // pool: role: engine URLs
	for _, p := range pools {
		ps.sims[p.Name] = map[string][]*harness.Sim{}
		byPool[p.Name] = map[string][]string{}
		type engine struct {
			role, mode, service string
			spec                harness.SimSpec
		}
		var engines []engine
		model := []string{"--model", p.Models[0]}
		if p.pd() {
			for _, dp := range []int{2, 4} {
				engines = append(engines, engine{"prefill", "prefill", p.Kubernetes.Prefill.Service,
					harness.SimSpec{DPSize: dp, Args: append(slices.Clone(fastPrefill), model...)}})
			}
			for range 2 {
				engines = append(engines, engine{"decode", "decode", p.Kubernetes.Decode.Service, harness.SimSpec{DPSize: 2, Args: model}})
			}
		} else {
			// vLLM engines with the DP size the manifest gives their Service.
			dp := p.Kubernetes.Decode.DPSize
			if dp < 1 {
				t.Fatalf("pool %s: Service %s has no dp_size; its vLLM engines serve no /server_info", p.Name, p.Kubernetes.Decode.Service)
			}
			for range 2 {
				engines = append(engines, engine{"decode", "null", p.Kubernetes.Decode.Service,
					harness.SimSpec{DPSize: dp, Args: append([]string{"--flavor", "vllm"}, model...)}})
			}
		}
		for i, e := range engines {
			sim, err := harness.StartSim(ctx, dir, fmt.Sprintf("%s-%s-%d", p.Name, e.role, i), e.mode, e.spec)
			if sim != nil {
				procs = append(procs, sim.Process)
			}
			if err != nil {
				t.Fatalf("start engine (files in %s): %v", dir, err)
			}
			ps.sims[p.Name][e.role] = append(ps.sims[p.Name][e.role], sim)
			byService[e.service] = append(byService[e.service], sim.URL)
			byPool[p.Name][e.role] = append(byPool[p.Name][e.role], sim.URL)
		}
	}
	ports, err := harness.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	hp := func(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }
	creds, err := harness.MakeCredentials(ctx, tools.Duet, filepath.Join(dir, "credentials"))
	if err != nil {
		t.Fatal(err)
	}
	addrs := harness.Addresses{DuetGRPC: hp(ports[0]), DuetAdmin: hp(ports[1]), EnvoyListen: hp(ports[2]), EnvoyAdmin: hp(ports[3]), Credentials: creds}
	cfg, err := poolDuetConfig(objs, addrs.DuetGRPC, addrs.DuetAdmin, creds, byPool)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "duet.yaml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	ps.duet, err = harness.StartProcess(dir, "duet", tools.Duet, "serve", "-config", cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	procs = append(procs, ps.duet)
	if err := harness.WaitHTTP(ctx, ps.duet, "http://"+addrs.DuetAdmin+"/readyz"); err != nil {
		t.Fatalf("duet not ready (files in %s): %v", dir, err)
	}
	boot, err := poolsBootstrap(ctx, egctl, dir, objs, addrs, byService)
	if err != nil {
		t.Fatalf("the bootstrap (files in %s): %v", dir, err)
	}
	bootPath := filepath.Join(dir, "envoy.json")
	if err := os.WriteFile(bootPath, boot, 0o644); err != nil {
		t.Fatal(err)
	}
	envoy, err := harness.StartEnvoy(ctx, dir, bootPath, "http://"+addrs.EnvoyAdmin)
	if err != nil {
		t.Fatalf("start Envoy (files in %s): %v", dir, err)
	}
	procs = append(procs, envoy)
	ps.stack = &harness.Stack{Dir: dir, EnvoyURL: "http://" + addrs.EnvoyListen, EnvoyAdminURL: "http://" + addrs.EnvoyAdmin,
		DuetAdminURL: "http://" + addrs.DuetAdmin, DuetGRPC: addrs.DuetGRPC, Credentials: creds}
	return ps
}

// chatFor is a chat request for 4 tokens of model.
func chatFor(model string, stream bool) []byte {
	return bytes.Replace(chatBody(stream), []byte(`"model":"sim-model"`), []byte(`"model":`+strconv.Quote(model)), 1)
}

// TestEnvoyGatewayPools runs requests for both models of the two-pool
// example through the Envoy that Envoy Gateway's translation configures,
// with one duet: each is served by its own pool, with a mirrored prefill
// leg for the PD pool only and the access-log feedback attributed to the
// right legs; an alias reaches its pool under the served name; an unknown
// model gets duet's 404 at once; GET /v1/models lists both pools' models;
// a client's x-duet-pool cannot choose the pool; and with every engine of
// the aggregated pool dead, its requests get 503 while the PD pool serves
// on.
func TestEnvoyGatewayPools(t *testing.T) {
	ps := startPools(t)
	s := ps.stack
	pool := func(name string) poolSpec {
		i := slices.IndexFunc(ps.pools, func(p poolSpec) bool { return p.Name == name })
		if i < 0 {
			t.Fatalf("no pool %s in the ConfigMap", name)
		}
		return ps.pools[i]
	}
	pd, agg := pool("deepseek"), pool("qwen")

	// serve sends a chat request for model and checks that it was served
	// by pool p alone: the decode leg (with the served model name in its
	// body) on one of its decode engines, for a PD pool the mirror on one
	// of its prefill engines, nothing on any other engine.
	serve := func(t *testing.T, model string, stream bool, p poolSpec, hdr map[string]string) (dec, pre harness.Record, id string) {
		t.Helper()
		id = requestID(t, 0)
		h := map[string]string{"x-request-id": id}
		for k, v := range hdr {
			h[k] = v
		}
		resp, body := send(t, s, "/v1/chat/completions", h, chatFor(model, stream))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("model %s: status %d: %s", model, resp.StatusCode, body)
		}
		want := 1
		if p.pd() {
			want = 2
		}
		found := legs(t, ps.all(), id, want)
		time.Sleep(100 * time.Millisecond) // a stray leg would show up by now
		legs(t, ps.all(), id, want)
		for sim, recs := range found {
			role := ""
			for r, sims := range ps.sims[p.Name] {
				if slices.Contains(sims, sim) {
					role = r
				}
			}
			if role == "" {
				t.Fatalf("model %s: a leg reached %s, an engine of another pool", model, sim.Name)
			}
			rec := recs[0]
			if rec.Headers[poolHeader] != p.Name {
				t.Errorf("model %s: the %s leg carries %s %q, want %s", model, role, poolHeader, rec.Headers[poolHeader], p.Name)
			}
			if !bytes.Contains(rec.Body, []byte(`"model":`+strconv.Quote(p.Models[0]))) {
				t.Errorf("model %s: the %s leg's body does not name the served model %s: %s", model, role, p.Models[0], rec.Body)
			}
			if role == "prefill" {
				pre = rec
			} else {
				dec = rec
			}
		}
		if dec.Path == "" || (p.pd() && pre.Path == "") {
			t.Fatalf("model %s: legs %v, want a decode leg and, for a PD pool, a prefill leg", model, found)
		}
		return dec, pre, id
	}

	t.Run("each model is served by its own pool", func(t *testing.T) {
		for _, stream := range []bool{false, true} {
			dec, pre, _ := serve(t, pd.Models[0], stream, pd, nil)
			if pre.DPRank == nil || pre.Headers["x-data-parallel-rank"] != pre.Headers["x-duet-prefill-dp-rank"] {
				t.Errorf("PD pool, stream %v: the mirror is not pinned by its own rank: %v", stream, pre.Headers)
			}
			if dec.PrefillDPRank == nil || pre.DPRank == nil || *dec.PrefillDPRank != *pre.DPRank {
				t.Errorf("PD pool, stream %v: decode looked for KV on prefill rank %v, prefill ran on %v", stream, dec.PrefillDPRank, pre.DPRank)
			}
			dec, _, _ = serve(t, agg.Models[0], stream, agg, nil)
			if dec.Headers["x-duet-mirror"] != "" || dec.Headers["x-duet-prefill-endpoint"] != "" {
				t.Errorf("aggregated pool, stream %v: the leg carries a mirror: %v", stream, dec.Headers)
			}
		}
	})

	t.Run("an alias reaches its pool under the served name", func(t *testing.T) {
		if len(pd.Aliases) == 0 {
			t.Fatal("the manifest's PD pool has no alias to test")
		}
		serve(t, pd.Aliases[0], false, pd, nil)
	})

	t.Run("a client cannot choose the pool", func(t *testing.T) {
		serve(t, pd.Models[0], false, pd, map[string]string{poolHeader: agg.Name, "x-duet-mirror": agg.Clusters.Decode})
		serve(t, agg.Models[0], false, agg, map[string]string{poolHeader: pd.Name, "x-duet-mirror": pd.Clusters.Prefill})
		id := requestID(t, 1)
		resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id, poolHeader: pd.Name}, chatFor("no-such-model", false))
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("an unknown model with %s: %s: status %d, want 404: %s", poolHeader, pd.Name, resp.StatusCode, body)
		}
	})

	t.Run("an unknown model gets 404 from duet at once", func(t *testing.T) {
		id := requestID(t, 0)
		start := time.Now()
		resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatFor("no-such-model", false))
		took := time.Since(start)
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("status %d, want 404: %s", resp.StatusCode, body)
		}
		var e struct {
			Error struct{ Code, Param string } `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != "model_not_found" || e.Error.Param != "model" {
			t.Errorf("body %s, want OpenAI's model_not_found on param model", body)
		}
		if took > 200*time.Millisecond {
			t.Errorf("the 404 took %v", took)
		}
		time.Sleep(100 * time.Millisecond)
		legs(t, ps.all(), id, 0)
	})

	t.Run("GET /v1/models lists both pools' models", func(t *testing.T) {
		id := requestID(t, 0)
		resp, body := send(t, s, "/v1/models", map[string]string{"x-request-id": id}, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var l struct {
			Data []struct {
				ID      string `json:"id"`
				OwnedBy string `json:"owned_by"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &l); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, m := range l.Data {
			got[m.ID] = m.OwnedBy
		}
		want := map[string]string{}
		for _, p := range ps.pools {
			for _, m := range p.Models {
				want[m] = p.Name
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("models %v, want %v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
		legs(t, ps.all(), id, 0)
	})

	t.Run("access-log feedback names each pool's legs", func(t *testing.T) {
		for _, p := range []poolSpec{pd, agg} {
			_, _, id := serve(t, p.Models[0], false, p, nil)
			want := 2
			if p.pd() {
				want = 3
			}
			got := completions(t, s, id, want)
			legsWant := []accesslog.Leg{accesslog.LegRequest, accesslog.LegDecode}
			if p.pd() {
				legsWant = append(legsWant, accesslog.LegPrefill)
			}
			for _, leg := range legsWant {
				if c, ok := got[leg]; !ok || c.Failed || c.Status != http.StatusOK {
					t.Errorf("pool %s: %s entry %+v (found %v), want status 200", p.Name, leg, c, ok)
				}
			}
		}
		if n := duetByReason(t, s, "duet_feedback_untrusted_total"); len(n) != 0 {
			t.Errorf("duet_feedback_untrusted_total by reason %v: duet did not believe some of the gateway's entries", n)
		}
	})

	// Last: it kills the aggregated pool.
	t.Run("a pool without engines fails alone", func(t *testing.T) {
		for _, sim := range ps.sims[agg.Name]["decode"] {
			sim.Kill()
		}
		for i := range 3 {
			id := requestID(t, i)
			resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatFor(agg.Models[0], false))
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("pool %s without engines, request %d: status %d, want 503: %s", agg.Name, i, resp.StatusCode, body)
			}
			serve(t, pd.Models[0], i%2 == 1, pd, nil)
		}
	})
}
