package istio

import (
	"encoding/json"
	"fmt"
	"github.com/duet-router/duet/e2e/harness"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// meshIdentity returns the SPIFFE identity Istio gives the fixture's pod
// whose labels include key=value: its service account's, in the default
// trust domain.
func meshIdentity(t *testing.T, key, value string) string {
	t.Helper()
	for _, doc := range yamlDocs(t, fixture) {
		if doc["kind"] != "Pod" {
			continue
		}
		labels, _ := get(t, doc, "metadata", "labels").(obj)
		if labels[key] != value {
			continue
		}
		ns, _ := get(t, doc, "metadata", "namespace").(string)
		sa, _ := get(t, doc, "spec", "serviceAccountName").(string)
		if ns == "" || sa == "" {
			t.Fatalf("%s: the pod labelled %s=%s has no namespace or service account", fixture, key, value)
		}
		return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa
	}
	t.Fatalf("%s: no pod labelled %s=%s", fixture, key, value)
	return ""
}

// The gateway pod and duet's pod of the fixture.
const (
	gatewayLabel, gatewayLabelValue = "istio", "duet-gateway"
	duetLabel, duetLabelValue       = "app.kubernetes.io/instance", "duet"
	// istioDuetCluster is the cluster Istio itself generates for duet's
	// gRPC port; its mTLS transport socket is the reference.
	istioDuetCluster = "outbound|9002||duet.inference.svc.cluster.local"
)

// clustersByName indexes a generated bootstrap's static clusters.
func clustersByName(boot obj) map[string]obj {
	out := map[string]obj{}
	res, _ := boot["staticResources"].(obj)
	for _, c := range asList(res["clusters"]) {
		c := c.(obj)
		out[c["name"].(string)] = c
	}
	return out
}

// meshTLSProblems lists how the gateway's clusters to duet fall short of
// the mesh's mutual TLS: each must carry exactly the transport socket that
// Istio generates for its own cluster to duet's gRPC port when the peer
// has a sidecar (its "tlsMode-istio" match), and that socket must present
// the gateway's workload certificate and verify duet's identity.
func meshTLSProblems(t *testing.T, boot obj) []string {
	t.Helper()
	clusters := clustersByName(boot)
	var want any
	for _, m := range asList(clusters[istioDuetCluster]["transportSocketMatches"]) {
		if m := m.(obj); m["name"] == "tlsMode-istio" {
			want = m["transportSocket"]
		}
	}
	if want == nil {
		t.Fatalf("Istio generated no mTLS transport socket for %s: is duet's pod in the fixture?", istioDuetCluster)
	}
	var problems []string
	for _, name := range []string{"duet_extproc", "duet_feedback"} {
		c, ok := clusters[name]
		if !ok {
			problems = append(problems, name+": missing")
			continue
		}
		got, ok := c["transportSocket"]
		if !ok {
			problems = append(problems, name+": no transport socket (the gateway would reach duet in plain text)")
			continue
		}
		if !reflect.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			problems = append(problems, fmt.Sprintf("%s: transport socket differs from Istio's own for duet:\n got %s\nwant %s", name, g, w))
			continue
		}
		common := get(t, got, "typedConfig", "commonTlsContext").(obj)
		if secret := fmt.Sprint(get(t, common, "tlsCertificateSdsSecretConfigs", 0, "name")); secret != "default" {
			problems = append(problems, name+": presents the SDS secret "+secret+", not the workload's own certificate (default)")
		}
		validation := get(t, common, "combinedValidationContext").(obj)
		if ca := fmt.Sprint(get(t, validation, "validationContextSdsSecretConfig", "name")); ca != "ROOTCA" {
			problems = append(problems, name+": verifies duet against "+ca+", not the mesh CA (ROOTCA)")
		}
		sans := fmt.Sprint(get(t, validation, "defaultValidationContext", "matchSubjectAltNames"))
		if duet := meshIdentity(t, duetLabel, duetLabelValue); sans != fmt.Sprint([]any{obj{"exact": duet}}) {
			problems = append(problems, fmt.Sprintf("%s: verifies duet's certificate by %s, want exactly %s", name, sans, duet))
		}
	}
	return problems
}

// editedEnvoyFilter writes a copy of envoyfilter.yaml changed by edit,
// which gets the value of each CLUSTER patch by name.
func editedEnvoyFilter(t *testing.T, edit func(clusters map[string]obj)) string {
	t.Helper()
	data, err := os.ReadFile("envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ef obj
	if err := yaml.Unmarshal(data, &ef); err != nil {
		t.Fatal(err)
	}
	clusters := map[string]obj{}
	for _, p := range get(t, ef, "spec", "configPatches").([]any) {
		if p.(obj)["applyTo"] == "CLUSTER" {
			v := get(t, p, "patch", "value").(obj)
			clusters[v["name"].(string)] = v
		}
	}
	edit(clusters)
	return writeEnvoyFilter(t, ef)
}

// writeEnvoyFilter writes an edited EnvoyFilter as envoyfilter.yaml in a
// temporary directory of t's and returns its path.
func writeEnvoyFilter(t *testing.T, ef any) string {
	t.Helper()
	out, err := yaml.Marshal(ef)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "envoyfilter.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The gateway's two clusters to duet, which the EnvoyFilter adds and which
// therefore get none of Istio's mTLS by themselves, must carry the mesh's
// transport socket, field for field as Istio generates it for its own
// cluster to duet: the gateway then presents its workload identity (the
// one auth.yaml admits) and accepts only duet's. A cluster without it, or
// with a different peer identity, fails.
func TestGatewayReachesDuetOverMeshMTLS(t *testing.T) {
	tools := findIstioTools(t)
	for _, tt := range []struct {
		name string
		edit func(clusters map[string]obj) // nil: the manifests as shipped
		want string                        // in a problem; empty: none
	}{
		{"as shipped", nil, ""},
		{"access-log cluster in plain text", func(c map[string]obj) { delete(c["duet_feedback"], "transport_socket") },
			"duet_feedback: no transport socket"},
		{"another peer identity", func(c map[string]obj) {
			v := get(t, c["duet_extproc"], "transport_socket", "typed_config", "common_tls_context", "combined_validation_context", "default_validation_context").(obj)
			v["match_subject_alt_names"] = []any{obj{"exact": "spiffe://cluster.local/ns/inference/sa/other"}}
		}, "duet_extproc: transport socket differs"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			filter := "envoyfilter.yaml"
			if tt.edit != nil {
				filter = editedEnvoyFilter(t, tt.edit)
			}
			boot, _ := generateGatewayConfig(t, tools, "gateway.yaml", filter, "auth.yaml", fixture)
			problems := meshTLSProblems(t, boot)
			switch {
			case tt.want == "" && len(problems) > 0:
				t.Errorf("the gateway's clusters to duet:\n%s", strings.Join(problems, "\n"))
			case tt.want != "" && !strings.Contains(strings.Join(problems, "\n"), tt.want):
				t.Errorf("want a problem %q, got %q", tt.want, problems)
			}
		})
	}
}

// portPolicy is what a sidecar does with connections to one port of its
// pod, as read from the inbound listener Istio generates for the pod.
type portPolicy struct {
	// Plaintext: some filter chain for the port takes connections without
	// TLS (PERMISSIVE or no PeerAuthentication).
	Plaintext bool
	// Admitted are the principals the RBAC filter admits on the port
	// ("*": anyone; other matchers are shown as JSON).
	Admitted []string
}

// inboundPolicy reads, from a sidecar's configuration (duet's, NATS's),
// what its inbound listener lets through to port: the filter chains'
// transport and the ALLOW policies of their RBAC filter.
func inboundPolicy(t *testing.T, boot obj, port int) portPolicy {
	t.Helper()
	var p portPolicy
	admitted := map[string]bool{}
	chains := 0
	for _, l := range asList(get(t, boot, "staticResources", "listeners")) {
		if l.(obj)["name"] != "virtualInbound" {
			continue
		}
		for _, fc := range asList(l.(obj)["filterChains"]) {
			fc := fc.(obj)
			match, _ := fc["filterChainMatch"].(obj)
			if match["destinationPort"] != float64(port) {
				continue
			}
			chains++
			ts, _ := fc["transportSocket"].(obj)
			if match["transportProtocol"] != "tls" || ts == nil || get(t, ts, "typedConfig", "requireClientCertificate") != true {
				p.Plaintext = true
			}
			harness.Walk(fc["filters"], func(m obj) {
				// The HTTP RBAC filter on HTTP ports, the network one on TCP
				// ports (NATS's client port).
				if m["@type"] != "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC" &&
					m["@type"] != "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC" {
					return
				}
				rules, _ := m["rules"].(obj)
				if action, ok := rules["action"]; ok && action != "ALLOW" {
					t.Fatalf("RBAC action %v on port %d: this reader knows ALLOW policies only", action, port)
				}
				for _, pol := range rules["policies"].(obj) {
					pol := pol.(obj)
					if !appliesToPort(pol["permissions"], port) {
						continue
					}
					harness.Walk(pol["principals"], func(m obj) {
						if m["any"] == true {
							admitted["*"] = true
						}
						if a, ok := m["authenticated"].(obj); ok {
							if exact, ok := get(t, a, "principalName", "exact").(string); ok {
								admitted[exact] = true
							} else {
								j, _ := json.Marshal(a)
								admitted[string(j)] = true
							}
						}
					})
				}
			})
		}
	}
	if chains == 0 {
		t.Fatalf("duet's sidecar has no inbound filter chain for port %d", port)
	}
	for a := range admitted {
		p.Admitted = append(p.Admitted, a)
	}
	slices.Sort(p.Admitted)
	return p
}

// appliesToPort reports whether an RBAC policy's permissions can match a
// connection to port: they name that port, or no port at all (ports under
// a negation, Istio's notPorts, do not count). It reads conservatively: a
// policy that admits only some requests on the port counts.
func appliesToPort(permissions any, port int) bool {
	var ports []float64
	var visit func(v any)
	visit = func(v any) {
		switch n := v.(type) {
		case obj:
			if p, ok := n["destinationPort"].(float64); ok {
				ports = append(ports, p)
			}
			for k, c := range n {
				if k != "notRule" {
					visit(c)
				}
			}
		case []any:
			for _, c := range n {
				visit(c)
			}
		}
	}
	visit(permissions)
	return len(ports) == 0 || slices.Contains(ports, float64(port))
}

// Istio's generator, given auth.yaml, must build for duet's sidecar an
// inbound listener that takes only mutual TLS on the gRPC port and admits
// there only the gateway's identity (the service account of the pod the
// Gateway selects), while the admin port also takes plain text from
// anyone, for scrapers. A weaker policy must show.
func TestDuetSidecarAdmitsOnlyTheGateway(t *testing.T) {
	tools := findIstioTools(t)
	gateway := meshIdentity(t, gatewayLabel, gatewayLabelValue)
	scrapers := portPolicy{Plaintext: true, Admitted: []string{"*"}}
	for _, tt := range []struct {
		name      string
		old, new  string // a change to auth.yaml; empty: as shipped
		grpc      portPolicy
		adminPort portPolicy
	}{
		{"as shipped", "", "", portPolicy{Admitted: []string{gateway}}, scrapers},
		{"PERMISSIVE instead of STRICT", "mode: STRICT", "mode: PERMISSIVE",
			portPolicy{Plaintext: true, Admitted: []string{gateway}}, scrapers},
		{"another gateway's service account", "sa/duet-gateway]", "sa/other-gateway]",
			portPolicy{Admitted: []string{"spiffe://cluster.local/ns/inference/sa/other-gateway"}}, scrapers},
		{"the admin rule on every port", "        ports: [\"9003\"]\n", "",
			portPolicy{Admitted: []string{"*", gateway}}, scrapers},
	} {
		t.Run(tt.name, func(t *testing.T) {
			policy := "auth.yaml"
			if tt.old != "" {
				policy = mutated(t, "auth.yaml", tt.old, tt.new)
			}
			boot, _ := generateConfig(t, tools, duetProxy, "gateway.yaml", "envoyfilter.yaml", policy, fixture)
			for _, p := range []struct {
				port int
				want portPolicy
			}{{9002, tt.grpc}, {9003, tt.adminPort}} {
				if got := inboundPolicy(t, boot, p.port); !reflect.DeepEqual(got, p.want) {
					t.Errorf("port %d: got %+v, want %+v", p.port, got, p.want)
				}
			}
		})
	}
}
