package helm

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/duet-router/duet/e2e/sim"
)

// duetNamespace is where examples/pd-discovery.yaml and
// examples/kv-events.yaml install the release "duet" (-n duet), away from
// the engines' namespace: examples/engines-networkpolicy.yaml admits duet's
// pods from there.
const duetNamespace = "duet"

// portRange is the ports lo to hi, both included: a NetworkPolicy port
// with its endPort, or one DP engine's sockets (rank r on lo + r).
type portRange struct{ lo, hi int }

func (r portRange) overlaps(o portRange) bool { return r.lo <= o.hi && o.lo <= r.hi }
func (r portRange) String() string            { return fmt.Sprintf("%d-%d", r.lo, r.hi) }

// engineEvents are one engine's KV event sockets, from its flags.
type engineEvents struct {
	dp          int
	pub, replay portRange
	// ports are the engine's other ports: its flags' and its container's.
	ports []int
}

// parseEngineEvents reads an SGLang container's --kv-events-config and DP
// size (flags in the --name=value form, as examples/engines.yaml writes
// them).
func parseEngineEvents(t *testing.T, name string, args []string, containerPorts []int) engineEvents {
	t.Helper()
	ev := engineEvents{dp: 1, ports: slices.Clone(containerPorts)}
	var raw []string
	for _, a := range args {
		flag, value, _ := strings.Cut(a, "=")
		switch flag {
		case "--kv-events-config":
			raw = append(raw, value)
		case "--dp-size":
			n, err := strconv.Atoi(value)
			if err != nil || n < 1 {
				t.Fatalf("%s: %s", name, a)
			}
			ev.dp = n
		case "--port", "--disaggregation-bootstrap-port":
			n, err := strconv.Atoi(value)
			if err != nil {
				t.Fatalf("%s: %s", name, a)
			}
			ev.ports = append(ev.ports, n)
		}
	}
	if len(raw) != 1 {
		t.Fatalf("%s: %d --kv-events-config flags, want one", name, len(raw))
	}
	cfg, _, err := sim.ParseKVEventsConfig(raw[0], true)
	if err != nil {
		t.Fatalf("%s: --kv-events-config %s: %v", name, raw[0], err)
	}
	ranks, err := cfg.ReachablePorts(ev.dp)
	if err != nil {
		t.Fatalf("%s: --kv-events-config %s: %v", name, raw[0], err)
	}
	first, last := ranks[0], ranks[ev.dp-1]
	ev.pub, ev.replay = portRange{first.PUB, last.PUB}, portRange{first.Replay, last.Replay}
	return ev
}

// selects reports whether a label selector (matchLabels and
// matchExpressions) selects a pod with labels.
func selects(t *testing.T, sel map[string]any, labels map[string]string) bool {
	t.Helper()
	var s struct {
		MatchLabels      map[string]string
		MatchExpressions []struct {
			Key, Operator string
			Values        []string
		}
	}
	data, _ := json.Marshal(sel)
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	if len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
		return true // the empty selector: every pod
	}
	if !subset(s.MatchLabels, labels) {
		return false
	}
	for _, e := range s.MatchExpressions {
		v, has := labels[e.Key]
		var ok bool
		switch e.Operator {
		case "In":
			ok = has && slices.Contains(e.Values, v)
		case "NotIn":
			ok = !has || !slices.Contains(e.Values, v)
		case "Exists":
			ok = has
		case "DoesNotExist":
			ok = !has
		default:
			t.Fatalf("selector operator %q", e.Operator)
		}
		if !ok {
			return false
		}
	}
	return true
}

// testEngineEventsExample: the engines of examples/engines.yaml publish
// their KV events, every DP rank on its own port, the PUB and replay ranges
// apart from each other and from the engine's other ports, bound on the
// pod's address; examples/engines-networkpolicy.yaml, valid, selects both
// roles' pods and admits duet's pods (as the chart labels them, from the
// namespace examples/kv-events.yaml installs them in) to the HTTP port and
// to exactly those ranges, and the engines to each other; and
// examples/kv-events.yaml's ports for engines that do not advertise them
// are these engines' rank 0 ports.
func testEngineEventsExample(t *testing.T, tk tools, schemas string) {
	data, err := os.ReadFile(filepath.Join("examples", "engines.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	engineObjs := parseObjects(t, string(data))
	type pod struct {
		namespace string
		labels    map[string]string
		events    engineEvents
		portNames []string
	}
	var pods []pod
	for _, id := range slices.Sorted(maps.Keys(engineObjs)) {
		o := engineObjs[id]
		if o.Kind != "StatefulSet" {
			continue
		}
		var sts struct {
			Spec struct {
				Template struct {
					Metadata struct{ Labels map[string]string }
					Spec     struct {
						Containers []struct {
							Args  []string
							Ports []struct {
								Name          string
								ContainerPort int
							}
						}
					}
				}
			}
		}
		o.into(t, &sts)
		c := sts.Spec.Template.Spec.Containers[0]
		var ports []int
		var names []string
		for _, p := range c.Ports {
			ports = append(ports, p.ContainerPort)
			names = append(names, p.Name)
		}
		ev := parseEngineEvents(t, id, c.Args, ports)
		if ev.pub.overlaps(ev.replay) {
			t.Errorf("%s: PUB ports %v and replay ports %v overlap (with --dp-size %d)", id, ev.pub, ev.replay, ev.dp)
		}
		for _, p := range ev.ports {
			for what, r := range map[string]portRange{"PUB": ev.pub, "replay": ev.replay} {
				if r.overlaps(portRange{p, p}) {
					t.Errorf("%s: %s ports %v take the engine's port %d", id, what, r, p)
				}
			}
		}
		pods = append(pods, pod{o.Metadata.Namespace, sts.Spec.Template.Metadata.Labels, ev, names})
	}
	if len(pods) != 2 {
		t.Fatalf("engines.yaml: %d StatefulSets, want the prefill and the decode engines", len(pods))
	}

	data, err = os.ReadFile(filepath.Join("examples", "engines-networkpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kubeconform(t, tk, schemas, string(data)); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(out, "Valid: 1,") {
		t.Fatalf("kubeconform summary:\n%s", out)
	}
	var np struct {
		Metadata struct{ Namespace string }
		Spec     struct {
			PodSelector map[string]any
			PolicyTypes []string
			Ingress     []struct {
				Ports []struct {
					Port     any
					EndPort  int
					Protocol string
				}
				From []struct{ PodSelector, NamespaceSelector map[string]any }
			}
		}
	}
	for _, o := range parseObjects(t, string(data)) {
		o.into(t, &np)
	}
	for _, p := range pods {
		if np.Metadata.Namespace != p.namespace || !selects(t, np.Spec.PodSelector, p.labels) {
			t.Errorf("engines-networkpolicy.yaml (namespace %s) does not select the engines %v in %s", np.Metadata.Namespace, p.labels, p.namespace)
		}
	}
	if !slices.Equal(np.Spec.PolicyTypes, []string{"Ingress"}) {
		t.Errorf("engines-networkpolicy.yaml: policy types %v, want Ingress", np.Spec.PolicyTypes)
	}
	// duet's pods, as the chart labels them for the release "duet".
	manifest, err := render(tk, chartDir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var dep deployment
	parseObjects(t, manifest)["Deployment/duet-system/duet"].into(t, &dep)
	duetPods := dep.Spec.Template.Metadata.Labels
	duetNS := map[string]string{"kubernetes.io/metadata.name": duetNamespace}
	var duetRules, engineRules int
	for i, rule := range np.Spec.Ingress {
		if len(rule.From) != 1 {
			t.Errorf("ingress[%d]: %d peers, want one", i, len(rule.From))
			continue
		}
		from := rule.From[0]
		switch {
		case from.NamespaceSelector != nil && selects(t, from.NamespaceSelector, duetNS) && selects(t, from.PodSelector, duetPods):
			duetRules++
			// Exactly the engines' HTTP port and every rank's sockets.
			var named []string
			var ranges []portRange
			for _, p := range rule.Ports {
				if p.Protocol != "TCP" {
					t.Errorf("ingress[%d]: port %v over %s, want TCP (ZMQ and HTTP)", i, p.Port, p.Protocol)
				}
				switch v := p.Port.(type) {
				case string:
					named = append(named, v)
				case float64:
					hi := int(v)
					if p.EndPort != 0 {
						hi = p.EndPort
					}
					ranges = append(ranges, portRange{int(v), hi})
				}
			}
			for _, n := range named {
				for _, p := range pods {
					if !slices.Contains(p.portNames, n) {
						t.Errorf("ingress[%d] admits duet to the port %q, which the engines %v do not name", i, n, p.labels)
					}
				}
			}
			if !slices.Equal(named, []string{"http"}) {
				t.Errorf("ingress[%d] admits duet to the named ports %v, want http", i, named)
			}
			var want []portRange
			for _, p := range pods {
				for _, r := range []portRange{p.events.pub, p.events.replay} {
					if !slices.Contains(want, r) {
						want = append(want, r)
					}
				}
			}
			slices.SortFunc(ranges, func(a, b portRange) int { return a.lo - b.lo })
			slices.SortFunc(want, func(a, b portRange) int { return a.lo - b.lo })
			if !slices.Equal(ranges, want) {
				t.Errorf("ingress[%d] admits duet to the ports %v, want the engines' KV event ports %v", i, ranges, want)
			}
		case from.NamespaceSelector == nil && len(rule.Ports) == 0:
			engineRules++
			for _, p := range pods {
				if !selects(t, from.PodSelector, p.labels) {
					t.Errorf("ingress[%d] does not admit the engines %v to each other", i, p.labels)
				}
			}
			if selects(t, from.PodSelector, duetPods) {
				t.Errorf("ingress[%d], the engines' rule, admits duet's pods to every port", i)
			}
		default:
			t.Errorf("ingress[%d] admits %+v to %+v: neither duet's pods nor the engines", i, from, rule.Ports)
		}
	}
	if duetRules != 1 || engineRules != 1 {
		t.Errorf("engines-networkpolicy.yaml: %d rules for duet and %d for the engines, want one each", duetRules, engineRules)
	}

	// examples/kv-events.yaml: ports for engines that do not advertise
	// them, which must be what these engines publish on.
	var values struct {
		Engines struct{ Kubernetes struct{ Namespace string } }
		Config  struct {
			KVEvents struct {
				Mode       string
				Port       int
				ReplayPort int `yaml:"replay_port"`
			} `yaml:"kv_events"`
		}
	}
	readYAML(t, filepath.Join("examples", "kv-events.yaml"), &values)
	k := values.Config.KVEvents
	for _, p := range pods {
		if values.Engines.Kubernetes.Namespace != p.namespace {
			t.Errorf("kv-events.yaml discovers the engines in %q, engines.yaml runs them in %s", values.Engines.Kubernetes.Namespace, p.namespace)
		}
		if k.Port != p.events.pub.lo || k.ReplayPort != p.events.replay.lo {
			t.Errorf("kv-events.yaml: kv_events.port %d, replay_port %d; the engines publish on %d and replay on %d",
				k.Port, k.ReplayPort, p.events.pub.lo, p.events.replay.lo)
		}
	}
}

// checkKVEvents: the chart passes config.kv_events through as it is, and
// renders none where the values set none (duet's defaults apply).
func checkKVEvents(t *testing.T, vs valueSet, objs map[string]object) {
	var want any
	for _, f := range vs.files {
		var values struct {
			Config map[string]any
		}
		readYAML(t, filepath.Join("examples", f), &values)
		if v, ok := values.Config["kv_events"]; ok {
			want = v
		}
	}
	got, ok := duetConfig(objs)["kv_events"]
	switch {
	case want == nil && ok:
		t.Errorf("kv_events rendered as %v, but the values set none", got)
	case want != nil && !reflect.DeepEqual(got, want):
		t.Errorf("kv_events rendered as %v, want the values' %v", got, want)
	}
}
