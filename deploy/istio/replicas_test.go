package istio

import (
	"fmt"
	"github.com/duet-router/duet/e2e/harness"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
)

// natsProxy is NATS's pod of the fixture, with its sidecar
// (duet-istio-check xds flags).
var natsProxy = []string{"-proxy-type", "sidecar", "-proxy-name", "nats-0", "-proxy-namespace", "inference",
	"-proxy-ip", "10.0.0.30", "-proxy-label", "app.kubernetes.io/name=nats"}

// kubeObjects decodes the Kubernetes objects of files strictly (an unknown
// or mistyped field fails), by "<Kind>/<name>"; Istio objects are skipped.
func kubeObjects(t *testing.T, files ...string) map[string]runtime.Object {
	t.Helper()
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Yaml: true, Strict: true})
	out := map[string]runtime.Object{}
	for _, f := range files {
		for _, doc := range yamlDocs(t, f) {
			if strings.HasSuffix(strings.SplitN(fmt.Sprint(doc["apiVersion"]), "/", 2)[0], ".istio.io") {
				continue
			}
			text, err := yaml.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			o, _, err := strict.Decode(text, nil, nil)
			if err != nil {
				t.Errorf("%s: %s %v: %v", f, doc["kind"], get(t, doc, "metadata", "name"), err)
				continue
			}
			out[fmt.Sprint(doc["kind"])+"/"+fmt.Sprint(get(t, doc, "metadata", "name"))] = o
		}
	}
	return out
}

// selects reports whether selector matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// policySelector returns the matchLabels of auth.yaml's object of kind and
// name.
func policySelector(t *testing.T, kind, name string) map[string]string {
	t.Helper()
	for _, doc := range yamlDocs(t, "auth.yaml") {
		if doc["kind"] == kind && get(t, doc, "metadata", "name") == name {
			out := map[string]string{}
			for k, v := range get(t, doc, "spec", "selector", "matchLabels").(obj) {
				out[k] = fmt.Sprint(v)
			}
			return out
		}
	}
	t.Fatalf("auth.yaml has no %s %s", kind, name)
	return nil
}

// podsSelected names the fixture's pods whose labels selector matches, and
// returns the container ports of the first by name.
func podsSelected(t *testing.T, selector map[string]string) (names []string, ports map[string]int32) {
	t.Helper()
	for _, o := range kubeObjects(t, fixture) {
		pod, ok := o.(*corev1.Pod)
		if !ok || !selects(selector, pod.Labels) {
			continue
		}
		names = append(names, pod.Name)
		if ports == nil {
			ports = map[string]int32{}
			for _, c := range pod.Spec.Containers {
				for _, p := range c.Ports {
					ports[p.Name] = p.ContainerPort
				}
			}
		}
	}
	slices.Sort(names)
	return names, ports
}

// The Kubernetes objects of replicas.yaml and nats.yaml decode strictly and
// fit together, with the stand-in pods and with the Helm chart's values for
// Istio. The headless Service that the gateway resolves selects every duet
// pod (those auth.yaml protects) and nothing else, on duet's gRPC port. The
// NATS Service selects the NATS Deployment's pods, which carry the labels
// auth.yaml's NATS policies select, run in the mesh as the NATS service
// account, and take the token of the Secret the chart mounts for duet; its
// port is declared TCP and is the port of the chart's sync.nats.url.
func TestKubernetesObjects(t *testing.T) {
	objs := kubeObjects(t, "replicas.yaml", "nats.yaml")
	var names []string
	for n := range objs {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"ConfigMap/nats", "Deployment/nats", "Service/duet-replicas", "Service/nats", "ServiceAccount/nats"}
	if !slices.Equal(names, want) {
		t.Fatalf("objects %v, want %v", names, want)
	}
	for _, n := range names {
		if ns := objs[n].(interface{ GetNamespace() string }).GetNamespace(); ns != "inference" {
			t.Errorf("%s in namespace %q, want inference", n, ns)
		}
	}

	// The gateway's way to every duet replica.
	replicas := objs["Service/duet-replicas"].(*corev1.Service)
	duetPods, duetPorts := podsSelected(t, policySelector(t, "AuthorizationPolicy", "duet"))
	if got, _ := podsSelected(t, replicas.Spec.Selector); replicas.Spec.ClusterIP != corev1.ClusterIPNone || !slices.Equal(got, duetPods) || len(got) < 2 {
		t.Errorf("Service duet-replicas: clusterIP %q selecting pods %v; want a headless Service selecting duet's pods %v", replicas.Spec.ClusterIP, got, duetPods)
	}
	if p := replicas.Spec.Ports; len(p) != 1 || p[0].Port != duetPorts[p[0].TargetPort.StrVal] || p[0].AppProtocol == nil || *p[0].AppProtocol != "kubernetes.io/h2c" {
		t.Errorf("Service duet-replicas ports %+v: want one HTTP/2 port targeting duet's gRPC port by name, with the same number", p)
	}

	// NATS.
	svc, d, conf := objs["Service/nats"].(*corev1.Service), objs["Deployment/nats"].(*appsv1.Deployment), objs["ConfigMap/nats"].(*corev1.ConfigMap)
	pod := d.Spec.Template
	if !selects(svc.Spec.Selector, pod.Labels) || !selects(d.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("the NATS pods %v are not selected by their Service (%v) or Deployment", pod.Labels, svc.Spec.Selector)
	}
	for _, kind := range []string{"PeerAuthentication", "AuthorizationPolicy"} {
		if !selects(policySelector(t, kind, "nats"), pod.Labels) {
			t.Errorf("auth.yaml's %s nats does not select the NATS pods %v", kind, pod.Labels)
		}
	}
	if pod.Labels["sidecar.istio.io/inject"] != "true" || pod.Spec.ServiceAccountName != objs["ServiceAccount/nats"].(*corev1.ServiceAccount).Name {
		t.Errorf("the NATS pods: injection label %q, service account %q; want a sidecar and the nats service account",
			pod.Labels["sidecar.istio.io/inject"], pod.Spec.ServiceAccountName)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].AppProtocol == nil || *svc.Spec.Ports[0].AppProtocol != "tcp" {
		t.Fatalf("Service nats ports %+v: want one port with appProtocol tcp (NATS speaks first)", svc.Spec.Ports)
	}
	client := svc.Spec.Ports[0]
	c := pod.Spec.Containers[0]
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == client.TargetPort.StrVal })
	text := conf.Data["nats.conf"]
	if i < 0 || !regexp.MustCompile(`(?m)^port: `+strconv.Itoa(int(c.Ports[i].ContainerPort))+`$`).MatchString(text) {
		t.Errorf("Service nats targets %s, which is not the port nats.conf listens on:\n%s", client.TargetPort.String(), text)
	}
	m := regexp.MustCompile(`token: \$([A-Z_]+)`).FindStringSubmatch(text)
	j := -1
	if m != nil {
		j = slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == m[1] })
	}
	if j < 0 || c.Env[j].ValueFrom == nil || c.Env[j].ValueFrom.SecretKeyRef == nil {
		t.Fatalf("nats.conf takes no token from an environment variable that a Secret fills:\n%s", text)
	}
	secret := c.Env[j].ValueFrom.SecretKeyRef

	// The Helm chart's values for Istio: duet's replicas dial this Service
	// with this token (the chart mounts the Secret's key "token").
	var values struct {
		ReplicaCount int `yaml:"replicaCount"`
		Sync         struct {
			NATS struct {
				URL         string `yaml:"url"`
				TokenSecret string `yaml:"tokenSecret"`
			} `yaml:"nats"`
		} `yaml:"sync"`
	}
	data, err := os.ReadFile(helmValues)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(values.Sync.NATS.URL)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(u.Host)
	if u.Scheme != "nats" || host != svc.Name+"."+svc.Namespace+".svc.cluster.local" || port != strconv.Itoa(int(client.Port)) {
		t.Errorf("%s: sync.nats.url %q, want nats://%s.%s.svc.cluster.local:%d", helmValues, values.Sync.NATS.URL, svc.Name, svc.Namespace, client.Port)
	}
	if values.Sync.NATS.TokenSecret != secret.Name || secret.Key != "token" {
		t.Errorf("%s: sync.nats.tokenSecret %q (key token); NATS takes its token from Secret %s key %s",
			helmValues, values.Sync.NATS.TokenSecret, secret.Name, secret.Key)
	}
	if values.ReplicaCount < 2 {
		t.Errorf("%s: replicaCount %d, want at least 2", helmValues, values.ReplicaCount)
	}
}

// helmValues are the duet chart's values for Istio, which the guide installs
// duet with.
const helmValues = "../helm/examples/istio.yaml"

// replicaProblems lists how the gateway's clusters to duet, in a generated
// configuration, fall short of reaching every replica and skipping a dead
// one: each must resolve, by DNS and for both address families, the name
// of a headless Service of the manifests on that Service's port, and carry
// gRPC health checks and outlier detection.
func replicaProblems(t *testing.T, boot obj) []string {
	t.Helper()
	headless := map[string]int32{} // DNS name: port
	for _, o := range kubeObjects(t, manifests...) {
		if s, ok := o.(*corev1.Service); ok && s.Spec.ClusterIP == corev1.ClusterIPNone {
			for _, p := range s.Spec.Ports {
				headless[net.JoinHostPort(s.Name+"."+s.Namespace+".svc.cluster.local", strconv.Itoa(int(p.Port)))] = p.Port
			}
		}
	}
	clusters := clustersByName(boot)
	var problems []string
	for _, name := range []string{"duet_extproc", "duet_feedback"} {
		c, ok := clusters[name]
		if !ok {
			problems = append(problems, name+": missing")
			continue
		}
		if c["type"] != "STRICT_DNS" || c["dnsLookupFamily"] != "ALL" {
			problems = append(problems, fmt.Sprintf("%s: type %v, DNS lookup family %v; want every address of a name (STRICT_DNS, ALL)", name, c["type"], c["dnsLookupFamily"]))
		}
		harness.Walk(c["loadAssignment"], func(m obj) {
			sa, ok := m["socketAddress"].(obj)
			if !ok {
				return
			}
			addr := net.JoinHostPort(fmt.Sprint(sa["address"]), fmt.Sprint(sa["portValue"]))
			if _, ok := headless[addr]; !ok {
				problems = append(problems, fmt.Sprintf("%s: %s is not a headless Service's name and port: it does not resolve to every duet replica", name, addr))
			}
		})
		hc := asList(c["healthChecks"])
		if len(hc) != 1 || hc[0].(obj)["grpcHealthCheck"] == nil {
			problems = append(problems, name+": no gRPC health checks")
		}
		if od, _ := c["outlierDetection"].(obj); od == nil || od["consecutiveLocalOriginFailure"] != float64(1) {
			problems = append(problems, name+": no ejection at the first refused connection")
		}
	}
	slices.Sort(problems)
	return problems
}

// In the gateway configuration Istio's generator builds, the clusters to
// duet resolve the headless Service of replicas.yaml, so that each duet
// replica is a host, and carry the health checks and outlier detection that
// skip a dead one (Istio passes them through untouched). The ClusterIP
// Service of the Helm chart in their place, or a cluster without health
// checks, fails.
func TestGatewayReachesEveryReplica(t *testing.T) {
	tools := findIstioTools(t)
	for _, tt := range []struct {
		name string
		edit func(clusters map[string]obj) // nil: as shipped
		want string
	}{
		{"as shipped", nil, ""},
		{"duet's cluster IP Service", func(c map[string]obj) {
			harness.Walk(c["duet_extproc"]["load_assignment"], func(m obj) {
				if sa, ok := m["socket_address"].(obj); ok {
					sa["address"] = "duet.inference.svc.cluster.local"
				}
			})
		}, "duet_extproc: duet.inference.svc.cluster.local:9002 is not a headless Service's name"},
		{"no health checks on the access-log cluster", func(c map[string]obj) { delete(c["duet_feedback"], "health_checks") },
			"duet_feedback: no gRPC health checks"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			filter := "envoyfilter.yaml"
			if tt.edit != nil {
				filter = editedEnvoyFilter(t, tt.edit)
			}
			files := append([]string{filter, fixture}, slices.DeleteFunc(slices.Clone(manifests), func(f string) bool { return f == "envoyfilter.yaml" })...)
			boot, _ := generateGatewayConfig(t, tools, files...)
			problems := replicaProblems(t, boot)
			switch {
			case tt.want == "" && len(problems) > 0:
				t.Errorf("the gateway's clusters to duet:\n%s", strings.Join(problems, "\n"))
			case tt.want != "" && !strings.Contains(strings.Join(problems, "\n"), tt.want):
				t.Errorf("want a problem %q, got %q", tt.want, problems)
			}
		})
	}
}

// natsRoute reads, from duet's sidecar configuration, how it forwards a
// connection to NATS's Service port: the listener for the port must proxy
// TCP as it is to Istio's cluster for NATS, without sniffing for HTTP (NATS
// speaks first, and a sniffing listener waits for the client), and that
// cluster must reach NATS's sidecar over mutual TLS, verifying NATS's
// identity. It returns what falls short.
func natsRoute(t *testing.T, boot obj, natsID string) []string {
	t.Helper()
	const cluster = "outbound|4222||nats.inference.svc.cluster.local"
	var problems []string
	listeners := 0
	for _, l := range asList(get(t, boot, "staticResources", "listeners")) {
		l := l.(obj)
		if !strings.HasSuffix(fmt.Sprint(l["name"]), "_4222") {
			continue
		}
		listeners++
		for _, f := range asList(l["listenerFilters"]) {
			if f.(obj)["name"] == "envoy.filters.listener.http_inspector" {
				problems = append(problems, fmt.Sprintf("listener %v sniffs for HTTP: NATS's port is not declared TCP", l["name"]))
			}
		}
		for _, fc := range asList(l["filterChains"]) {
			for _, f := range asList(fc.(obj)["filters"]) {
				f := f.(obj)
				if f["name"] != "envoy.filters.network.tcp_proxy" || get(t, f, "typedConfig", "cluster") != cluster {
					problems = append(problems, fmt.Sprintf("listener %v: filter %v, want only a TCP proxy to %s", l["name"], f["name"], cluster))
				}
			}
		}
	}
	if listeners == 0 {
		problems = append(problems, "duet's sidecar has no listener for NATS's port 4222")
	}
	var tls any
	for _, m := range asList(clustersByName(boot)[cluster]["transportSocketMatches"]) {
		if m.(obj)["name"] == "tlsMode-istio" {
			tls = m.(obj)["transportSocket"]
		}
	}
	if tls == nil {
		problems = append(problems, cluster+": no mesh TLS to NATS's sidecar")
	} else if sans := fmt.Sprint(get(t, tls, "typedConfig", "commonTlsContext", "combinedValidationContext", "defaultValidationContext", "matchSubjectAltNames")); sans != fmt.Sprint([]any{obj{"exact": natsID}}) {
		problems = append(problems, fmt.Sprintf("%s: verifies NATS by %s, want exactly %s", cluster, sans, natsID))
	}
	slices.Sort(problems)
	return problems
}

// NATS in the mesh, as Istio's generator builds it from nats.yaml and
// auth.yaml: duet's sidecar forwards duet's connections to NATS as plain
// TCP (no protocol sniffing) over mutual TLS to NATS's identity, and NATS's
// sidecar takes only mutual TLS on the client port and admits there only
// duet's identity. Each weakening shows: the port not declared TCP, NATS
// in PERMISSIVE mode, another service account admitted.
func TestNATSInTheMesh(t *testing.T) {
	tools := findIstioTools(t)
	duet := meshIdentity(t, duetLabel, duetLabelValue)
	natsID := meshIdentity(t, "app.kubernetes.io/name", "nats")
	for _, tt := range []struct {
		name, file, old, new string // a change to a manifest; empty: as shipped
		route                string // in a problem of natsRoute; empty: none
		inbound              portPolicy
	}{
		{"as shipped", "", "", "", "", portPolicy{Admitted: []string{duet}}},
		{"port not declared TCP", "nats.yaml", "{name: tcp-client, port: 4222, targetPort: client, protocol: TCP, appProtocol: tcp}",
			"{name: client, port: 4222, targetPort: client, protocol: TCP}", "sniffs for HTTP", portPolicy{Admitted: []string{duet}}},
		{"PERMISSIVE instead of STRICT", "auth.yaml", "      app.kubernetes.io/name: nats\n  mtls:\n    mode: STRICT",
			"      app.kubernetes.io/name: nats\n  mtls:\n    mode: PERMISSIVE", "", portPolicy{Plaintext: true, Admitted: []string{duet}}},
		{"another service account", "auth.yaml", "principals: [cluster.local/ns/inference/sa/duet]\n    to:\n    - operation:\n        ports: [\"4222\"]",
			"principals: [cluster.local/ns/inference/sa/default]\n    to:\n    - operation:\n        ports: [\"4222\"]", "",
			portPolicy{Admitted: []string{"spiffe://cluster.local/ns/inference/sa/default"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			files := []string{fixture}
			for _, m := range manifests {
				if m == tt.file {
					m = mutated(t, tt.file, tt.old, tt.new)
				}
				files = append(files, m)
			}
			duetBoot, _ := generateConfig(t, tools, duetProxy, files...)
			problems := natsRoute(t, duetBoot, natsID)
			switch {
			case tt.route == "" && len(problems) > 0:
				t.Errorf("duet's way to NATS:\n%s", strings.Join(problems, "\n"))
			case tt.route != "" && !strings.Contains(strings.Join(problems, "\n"), tt.route):
				t.Errorf("want a problem %q, got %q", tt.route, problems)
			}
			natsBoot, _ := generateConfig(t, tools, natsProxy, files...)
			if got := inboundPolicy(t, natsBoot, 4222); !reflect.DeepEqual(got, tt.inbound) {
				t.Errorf("NATS's client port: got %+v, want %+v", got, tt.inbound)
			}
		})
	}
}
