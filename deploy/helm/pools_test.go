package helm

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
)

// poolWant is one pool a value set must render: its name, whether it
// disaggregates prefill and decode, whether duet discovers its engines
// from Services (else it lists them by URL), and for a discovered pool the
// dp_size of its decode Service (0: read from each engine).
type poolWant struct {
	name          string
	pd, discovery bool
	decodeDP      int
}

// poolsHeader is the header on which the bootstrap's routes choose a
// pool's clusters (duet sets it from the body's model).
const poolsHeader = "x-duet-pool"

// checkPoolsConfig checks the pools section of duet's rendered
// configuration against the value set: the pools in order, each with its
// Services (and no lists) or its lists, PD or not; no top-level engines;
// and a top-level kubernetes section, without Services of its own, exactly
// when a pool is discovered.
func checkPoolsConfig(t *testing.T, vs valueSet, cfg map[string]any) {
	t.Helper()
	for _, key := range []string{"prefill", "decode"} {
		if _, ok := cfg[key]; ok {
			t.Errorf("duet.yaml has a top-level %s list beside its pools", key)
		}
	}
	pools, _ := cfg["pools"].([]any)
	if len(pools) != len(vs.pools) {
		t.Fatalf("duet.yaml has %d pools, want %d", len(pools), len(vs.pools))
	}
	discovery := false
	for i, want := range vs.pools {
		p, _ := pools[i].(map[string]any)
		if p["name"] != want.name {
			t.Errorf("pools[%d].name = %v, want %s", i, p["name"], want.name)
		}
		if models, _ := p["models"].([]any); len(models) == 0 {
			t.Errorf("pools[%d] (%s) serves no model", i, want.name)
		}
		k, discovered := p["kubernetes"].(map[string]any)
		discovery = discovery || discovered
		if discovered != want.discovery {
			t.Errorf("pools[%d] (%s): kubernetes set = %v, want %v", i, want.name, discovered, want.discovery)
		}
		var pd bool
		if discovered {
			_, pd = k["prefill"].(map[string]any)
			if p["prefill"] != nil || p["decode"] != nil {
				t.Errorf("pools[%d] (%s) lists engines beside its Services", i, want.name)
			}
			decode, _ := k["decode"].(map[string]any)
			if dp, _ := decode["dp_size"].(int); dp != want.decodeDP {
				t.Errorf("pools[%d] (%s): kubernetes.decode.dp_size = %v, want %d", i, want.name, decode["dp_size"], want.decodeDP)
			}
		} else {
			pre, _ := p["prefill"].([]any)
			pd = len(pre) > 0
		}
		if pd != want.pd {
			t.Errorf("pools[%d] (%s): PD = %v, want %v", i, want.name, pd, want.pd)
		}
	}
	k, ok := cfg["kubernetes"].(map[string]any)
	if ok != discovery {
		t.Errorf("top-level kubernetes section set = %v, want %v (a pool discovered)", ok, discovery)
	}
	for _, role := range []string{"prefill", "decode"} {
		if _, set := k[role]; set {
			t.Errorf("kubernetes.%s is set beside pools: each pool names its Services", role)
		}
	}
}

// checkPoolsBootstrap checks Envoy's bootstrap for a value set with pools:
// one route per pool, matched on x-duet-pool, to the pool's decode cluster;
// that cluster, and a prefill cluster exactly for a PD pool; and, for a
// discovered pool, the headless Services' names in its clusters.
func checkPoolsBootstrap(t *testing.T, vs valueSet, cfg map[string]any, bootstrap string) {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(bootstrap), &doc); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	routes := harness.HeaderRoutes(doc, poolsHeader) // pool -> cluster
	clusters := map[string]string{}                  // name -> its YAML
	sr, _ := doc["static_resources"].(map[string]any)
	list, _ := sr["clusters"].([]any)
	for _, c := range list {
		c, _ := c.(map[string]any)
		name, _ := c["name"].(string)
		data, err := yaml.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		clusters[name] = string(data)
	}
	var names []string
	pools, _ := cfg["pools"].([]any)
	for i, want := range vs.pools {
		names = append(names, want.name)
		p, _ := pools[i].(map[string]any)
		set, _ := p["clusters"].(map[string]any)
		decode, prefill := "duet_"+want.name+"_decode", "duet_"+want.name+"_prefill"
		if s, ok := set["decode"].(string); ok {
			decode = s
		}
		if s, ok := set["prefill"].(string); ok {
			prefill = s
		}
		if got := routes[want.name]; got != decode {
			t.Errorf("pool %s: the route matching %s: %s leads to cluster %q, want %s", want.name, poolsHeader, want.name, got, decode)
		}
		if _, ok := clusters[decode]; !ok {
			t.Errorf("pool %s: no cluster %s", want.name, decode)
		}
		if _, ok := clusters[prefill]; ok != want.pd {
			t.Errorf("pool %s: cluster %s present = %v, want %v", want.name, prefill, ok, want.pd)
		}
		k, _ := p["kubernetes"].(map[string]any)
		top, _ := cfg["kubernetes"].(map[string]any)
		for role, cluster := range map[string]string{"prefill": prefill, "decode": decode} {
			svc, ok := k[role].(map[string]any)
			if !ok {
				continue
			}
			host := fmt.Sprintf("%s.%s.svc.cluster.local", svc["service"], top["namespace"])
			if !strings.Contains(clusters[cluster], host) {
				t.Errorf("pool %s: cluster %s does not resolve the %s Service %s", want.name, cluster, role, host)
			}
		}
	}
	if got := slices.Sorted(maps.Keys(routes)); !slices.Equal(got, slices.Sorted(slices.Values(names))) {
		t.Errorf("the bootstrap routes the pools %v, want %v", got, names)
	}
}

// testPoolsEngineExample: the engines of examples/two-pools.yaml are those
// of examples/engines.yaml and of examples/engines-vllm.yaml, which
// kubeconform validates: every pool discovers them from a headless Service
// with the port the values name, whose StatefulSet's engines serve the
// pool's first model name. A Service's dp_size is its engines' DP size:
// required for vLLM, which serves no /server_info, and equal to
// --data-parallel-size (vLLM) or --dp-size (SGLang) wherever it is set.
func testPoolsEngineExample(t *testing.T, tk tools, schemas string) {
	type service struct {
		Service, Port string
		DPSize        int `yaml:"dp_size"`
	}
	var values struct {
		Engines struct{ Kubernetes struct{ Namespace string } }
		Pools   []struct {
			Name       string
			Models     []string
			Kubernetes *struct{ Prefill, Decode *service }
			Prefill    []any
			Decode     []any
		}
	}
	raw, err := os.ReadFile(filepath.Join("examples", "two-pools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	ns := values.Engines.Kubernetes.Namespace
	engines := map[string]object{}
	for _, f := range []string{"engines.yaml", "engines-vllm.yaml"} {
		data, err := os.ReadFile(filepath.Join("examples", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "engines-vllm.yaml" {
			if out, err := kubeconform(t, tk, schemas, string(data)); err != nil {
				t.Fatal(err)
			} else if !strings.Contains(out, "Valid: 2,") {
				t.Fatalf("kubeconform summary:\n%s", out)
			}
		}
		for id, o := range parseObjects(t, string(data)) {
			engines[id] = o
		}
	}
	type svcSpec struct {
		Spec struct {
			ClusterIP string
			Selector  map[string]string
			Ports     []struct {
				Name       string
				Port       int
				TargetPort any
			}
		}
	}
	type stsSpec struct {
		Spec struct {
			ServiceName string
			Template    struct {
				Metadata struct{ Labels map[string]string }
				Spec     struct {
					Containers []struct {
						Command []string
						Args    []string
					}
				}
			}
		}
	}
	if len(values.Pools) != 2 {
		t.Fatalf("two-pools.yaml has %d pools", len(values.Pools))
	}
	for _, p := range values.Pools {
		k := p.Kubernetes
		if k == nil || len(p.Prefill) > 0 || len(p.Decode) > 0 {
			t.Errorf("pool %s lists engines: want it discovered from its Services", p.Name)
			continue
		}
		for _, s := range []*service{k.Prefill, k.Decode} {
			if s == nil {
				continue
			}
			var svc svcSpec
			o, ok := engines["Service/"+ns+"/"+s.Service]
			if !ok {
				t.Errorf("pool %s: no Service %s/%s in the engine examples", p.Name, ns, s.Service)
				continue
			}
			o.into(t, &svc)
			if svc.Spec.ClusterIP != "None" || !slices.ContainsFunc(svc.Spec.Ports, func(sp struct {
				Name       string
				Port       int
				TargetPort any
			}) bool {
				return sp.Name == s.Port
			}) {
				t.Errorf("pool %s: Service %s is not headless with the port %s", p.Name, s.Service, s.Port)
			}
			var sts stsSpec
			engines["StatefulSet/"+ns+"/"+s.Service].into(t, &sts)
			if sts.Spec.ServiceName != s.Service || len(svc.Spec.Selector) == 0 || !subset(svc.Spec.Selector, sts.Spec.Template.Metadata.Labels) {
				t.Errorf("pool %s: Service %s does not select the pods of StatefulSet %s", p.Name, s.Service, s.Service)
			}
			cs := sts.Spec.Template.Spec.Containers
			if len(cs) == 0 {
				t.Errorf("pool %s: StatefulSet %s has no container", p.Name, s.Service)
				continue
			}
			c := cs[0]
			vllm := slices.Equal(c.Command, []string{"vllm", "serve"})
			// Its engines serve the pool's first model name: SGLang's
			// --model-path, vLLM's positional model or either's
			// --served-model-name.
			if !slices.Contains(c.Args, "--model-path="+p.Models[0]) && !slices.Contains(c.Args, "--served-model-name="+p.Models[0]) &&
				!(vllm && slices.Contains(c.Args, p.Models[0])) {
				t.Errorf("pool %s: the engines of Service %s do not serve %s (%v)", p.Name, s.Service, p.Models[0], c.Args)
			}
			// Their DP size, as the Service gives it to duet.
			flag := "--dp-size="
			if vllm {
				flag = "--data-parallel-size="
			}
			dp := 1
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, flag); ok {
					if dp, err = strconv.Atoi(v); err != nil {
						t.Errorf("pool %s: engines of Service %s: %s", p.Name, s.Service, a)
					}
				}
			}
			switch {
			case vllm && s.DPSize == 0:
				t.Errorf("pool %s: Service %s has vLLM engines (no /server_info) but no dp_size: the pool would never be ready", p.Name, s.Service)
			case s.DPSize != 0 && s.DPSize != dp:
				t.Errorf("pool %s: Service %s has dp_size %d, but its engines run %s%d", p.Name, s.Service, s.DPSize, flag, dp)
			}
		}
	}
}
