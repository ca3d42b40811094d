package istio

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/sim"
)

// The engines the Istio recipe runs (docs/deploy/istio.md), with their KV
// event publisher, and the stand-ins for their pods.
var (
	helmEngines    = filepath.Join("..", "helm", "examples", "engines.yaml")
	enginesFixture = filepath.Join("testdata", "engines.yaml")
)

// engineEventPorts reads the KV event ports of the engines of
// deploy/helm/examples/engines.yaml: every DP rank's PUB and replay port
// (rank r: the --kv-events-config endpoint's port plus r), by the app
// label of the engine's pods.
func engineEventPorts(t *testing.T) map[string][]int {
	t.Helper()
	data, err := os.ReadFile(helmEngines)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var sts struct {
			Kind string
			Spec struct {
				Template struct {
					Metadata struct{ Labels map[string]string }
					Spec     struct{ Containers []struct{ Args []string } }
				}
			}
		}
		if err := dec.Decode(&sts); err != nil {
			break
		}
		if sts.Kind != "StatefulSet" {
			continue
		}
		dp, raw := 1, ""
		for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
			flag, v, _ := strings.Cut(a, "=")
			switch flag {
			case "--dp-size":
				if dp, err = strconv.Atoi(v); err != nil {
					t.Fatalf("%s: %s", helmEngines, a)
				}
			case "--kv-events-config":
				raw = v
			}
		}
		cfg, ok, err := sim.ParseKVEventsConfig(raw, false)
		if err != nil {
			t.Fatalf("%s: %v", helmEngines, err)
		}
		if !ok {
			continue
		}
		ranks, err := cfg.RankPorts(dp)
		if err != nil || cfg.ReplayEndpoint == nil {
			t.Fatalf("%s: --kv-events-config=%s: want PUB and replay endpoints (%v)", helmEngines, raw, err)
		}
		app := sts.Spec.Template.Metadata.Labels["app"]
		for _, r := range ranks {
			out[app] = append(out[app], r.PUB)
		}
		for _, r := range ranks {
			out[app] = append(out[app], r.Replay)
		}
	}
	if len(out) != 2 {
		t.Fatalf("%s: KV event ports for %v, want both roles' engines", helmEngines, out)
	}
	return out
}

// tcpRoute says how duet's sidecar forwards a connection to ip:port, as
// Envoy picks it: the listener bound to ip:port, else to 0.0.0.0:port,
// else the virtual outbound listener's filter chain for the port, else its
// catch-all. It returns the cluster of that chain's TCP proxy and what
// falls short: HTTP sniffing, another filter than a TCP proxy, or no
// single cluster.
func tcpRoute(t *testing.T, boot obj, ip string, port int) (cluster string, problems []string) {
	t.Helper()
	listeners := map[string]obj{}
	for _, l := range asList(get(t, boot, "staticResources", "listeners")) {
		listeners[fmt.Sprint(l.(obj)["name"])] = l.(obj)
	}
	at := fmt.Sprintf("%s:%d", ip, port)
	l, ok := listeners[fmt.Sprintf("%s_%d", ip, port)]
	if !ok {
		l, ok = listeners[fmt.Sprintf("0.0.0.0_%d", port)]
	}
	var chains []any
	if ok {
		chains = asList(l["filterChains"])
		for _, f := range asList(l["listenerFilters"]) {
			if f.(obj)["name"] == "envoy.filters.listener.http_inspector" {
				problems = append(problems, fmt.Sprintf("%s: listener %v sniffs for HTTP", at, l["name"]))
			}
		}
	} else {
		// The virtual outbound listener: a chain for this port, else one
		// for any port.
		var exact, any []any
		for _, fc := range asList(get(t, listeners["virtualOutbound"], "filterChains")) {
			m, _ := fc.(obj)["filterChainMatch"].(obj)
			switch p, has := m["destinationPort"]; {
			case !has:
				any = append(any, fc)
			case fmt.Sprint(p) == strconv.Itoa(port):
				exact = append(exact, fc)
			}
		}
		chains = any
		if len(exact) > 0 {
			chains = exact
		}
	}
	clusters := map[string]bool{}
	for _, fc := range chains {
		for _, f := range asList(fc.(obj)["filters"]) {
			f := f.(obj)
			if f["name"] != "envoy.filters.network.tcp_proxy" {
				problems = append(problems, fmt.Sprintf("%s: filter %v, want only a TCP proxy", at, f["name"]))
				continue
			}
			clusters[fmt.Sprint(get(t, f, "typedConfig", "cluster"))] = true
		}
	}
	if len(clusters) != 1 {
		problems = append(problems, fmt.Sprintf("%s: proxied to the clusters %v, want one", at, clusters))
		return "", problems
	}
	for c := range clusters {
		cluster = c
	}
	return cluster, problems
}

// eventRoutes checks, in duet's sidecar configuration, the way to every KV
// event port of the engine pods of testdata/engines.yaml: plain TCP, as it
// is, to the port duet dialled (an ORIGINAL_DST cluster: Istio's
// passthrough, or an outbound cluster of a port the engine Service
// declares), with no TLS, since the engines have no sidecar. It returns
// what falls short, a black hole first of all.
func eventRoutes(t *testing.T, boot obj, ports map[string][]int) []string {
	t.Helper()
	clusters := clustersByName(boot)
	var problems []string
	for app, ip := range map[string]string{"sglang-prefill": "10.0.0.40", "sglang-decode": "10.0.0.41"} {
		for _, port := range ports[app] {
			cluster, p := tcpRoute(t, boot, ip, port)
			problems = append(problems, p...)
			if cluster == "" {
				continue
			}
			c, ok := clusters[cluster]
			switch {
			case cluster == "BlackHoleCluster":
				problems = append(problems, fmt.Sprintf("%s:%d: BlackHoleCluster (outbound traffic REGISTRY_ONLY, the port not declared)", ip, port))
			case !ok:
				problems = append(problems, fmt.Sprintf("%s:%d: cluster %s is not defined", ip, port, cluster))
			case c["type"] != "ORIGINAL_DST":
				problems = append(problems, fmt.Sprintf("%s:%d: cluster %s is %v, want ORIGINAL_DST (the address duet dialled)", ip, port, cluster, c["type"]))
			case c["transportSocket"] != nil || c["transportSocketMatches"] != nil:
				problems = append(problems, fmt.Sprintf("%s:%d: cluster %s wraps the connection in TLS, which the engine without a sidecar cannot take", ip, port, cluster))
			}
		}
	}
	slices.Sort(problems)
	return slices.Compact(problems)
}

// TestDuetReachesEngineEvents: duet subscribes to every DP rank of every
// engine on the ports the engine's /server_info advertises (its KV event
// publisher, SGLang's --kv-events-config), which its Service does not
// declare. From the manifests as shipped, Istio's generator builds duet's
// sidecar to pass such connections through as plain TCP to the address
// duet dialled (the mesh's default outbound policy, ALLOW_ANY): no
// AuthorizationPolicy or Sidecar of the recipe stands in the way (auth.yaml
// governs what reaches duet and NATS, not what leaves duet), and the
// engines, out of the mesh, get no TLS. A mesh that admits only known
// destinations (REGISTRY_ONLY, here a Sidecar for duet's pods as
// meshConfig.outboundTrafficPolicy would make it) sends them to a black
// hole, which the check catches; declaring the event ports on the engines'
// Services as TCP (docs/deploy/istio.md, "KV events") opens them again,
// through Istio's own clusters, still plain TCP and unsniffed.
func TestDuetReachesEngineEvents(t *testing.T) {
	tools := findIstioTools(t)
	ports := engineEventPorts(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	registryOnly := write("registry-only.yaml", `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: duet
  namespace: inference
spec:
  workloadSelector:
    labels:
      app.kubernetes.io/name: duet
      app.kubernetes.io/instance: duet
  outboundTrafficPolicy:
    mode: REGISTRY_ONLY
`)
	// The engine Services (cluster.yaml) and their EndpointSlices
	// (engines.yaml) with every event port declared as TCP.
	pre, dec := ports["sglang-prefill"], ports["sglang-decode"]
	cluster := write("cluster.yaml", insertAfter(t, readFile(t, fixture),
		"  - {name: bootstrap, port: 8998, targetPort: 8998, appProtocol: tcp}\n", portLines(pre, "  ", true),
		"  selector: {app: sglang-decode}\n  ports:\n  - {name: http, port: 30000, targetPort: 30000}\n", portLines(dec, "  ", true)))
	engines := write("engines.yaml", insertAfter(t, readFile(t, enginesFixture),
		"- {name: bootstrap, port: 8998, protocol: TCP, appProtocol: tcp}\n", portLines(pre, "", false),
		"  labels: {kubernetes.io/service-name: sglang-decode}\naddressType: IPv4\nports:\n- {name: http, port: 30000, protocol: TCP}\n", portLines(dec, "", false)))

	for _, tt := range []struct {
		name  string
		files []string // the cluster stand-ins and extra manifests
		want  string   // in a problem; empty: none
	}{
		{"as shipped", []string{fixture, enginesFixture}, ""},
		{"REGISTRY_ONLY", []string{fixture, enginesFixture, registryOnly}, "BlackHoleCluster"},
		{"REGISTRY_ONLY, event ports declared TCP", []string{cluster, engines, registryOnly}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			boot, _ := generateConfig(t, tools, duetProxy, append(slices.Clone(manifests), tt.files...)...)
			problems := eventRoutes(t, boot, ports)
			switch {
			case tt.want == "" && len(problems) > 0:
				t.Errorf("duet's way to the engines' KV event ports:\n%s", strings.Join(problems, "\n"))
			case tt.want != "" && !strings.Contains(strings.Join(problems, "\n"), tt.want):
				t.Errorf("want a problem %q, got %q", tt.want, problems)
			}
		})
	}
}

// portLines are YAML list entries declaring ports as TCP: a Service's
// (service) or an EndpointSlice's.
func portLines(ports []int, indent string, service bool) string {
	var b strings.Builder
	for i, p := range ports {
		if service {
			fmt.Fprintf(&b, "%s- {name: tcp-kv-%d, port: %d, targetPort: %d, appProtocol: tcp}\n", indent, i, p, p)
		} else {
			fmt.Fprintf(&b, "%s- {name: tcp-kv-%d, port: %d, protocol: TCP, appProtocol: tcp}\n", indent, i, p)
		}
	}
	return b.String()
}

// insertAfter inserts, after each anchor of pairs (anchor, text, ...), its
// text, once; a missing anchor fails the test.
func insertAfter(t *testing.T, data string, pairs ...string) string {
	t.Helper()
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(data, pairs[i]) {
			t.Fatalf("no %q to insert after", pairs[i])
		}
		data = strings.Replace(data, pairs[i], pairs[i]+pairs[i+1], 1)
	}
	return data
}

// readFile returns the file's text.
func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
