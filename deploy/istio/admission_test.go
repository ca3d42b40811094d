package istio

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/extproc"
)

// The admission example: a RequestAuthentication on the gateway whose JWT
// filter sets the class and tenant headers of duet's admission section,
// and an AuthorizationPolicy that requires a token (docs/deploy/istio.md,
// "Admission headers"). duet's configuration for Istio is the Helm
// chart's example values.
var (
	admissionManifest = filepath.Join("admission", "requestauthentication.yaml")
	istioHelmValues   = filepath.Join("..", "helm", "examples", "istio.yaml")
)

// jwtFilter is the JWT filter as Istio names it in the gateway's listener.
const jwtFilter = "envoy.filters.http.jwt_authn"

// helmAdmission is config.admission of the chart's Istio example, as the
// tests read it.
type helmAdmission struct {
	Classes []struct {
		Name      string        `yaml:"name"`
		WaitLimit time.Duration `yaml:"wait_limit"`
	} `yaml:"classes"`
	ClassHeader        string `yaml:"class_header"`
	TenantHeader       string `yaml:"tenant_header"`
	TrustClientHeaders bool   `yaml:"trust_client_headers"`
}

// readHelmAdmission reads config.admission of the chart's Istio example.
func readHelmAdmission(t *testing.T) helmAdmission {
	t.Helper()
	var values struct {
		Config struct {
			Admission helmAdmission `yaml:"admission"`
		} `yaml:"config"`
	}
	readYAMLFile(t, istioHelmValues, &values)
	return values.Config.Admission
}

// readYAMLFile decodes the YAML file at path into v.
func readYAMLFile(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestAdmissionManifests: the RequestAuthentication selects the gateway's
// pods (the Gateway's selector) and sets exactly the class and tenant
// headers of duet's admission section from JWT claims; both are x-duet-*
// headers, which the EnvoyFilter strips from clients, so duet need not
// (and does not) trust clients' headers; the AuthorizationPolicy beside it
// admits, on the same pods, only requests with a verified token. The
// EnvoyFilters let a queued request wait out the longest wait limit.
func TestAdmissionManifests(t *testing.T) {
	a := readHelmAdmission(t)
	docs := map[string]obj{}
	for _, d := range append(yamlDocs(t, "gateway.yaml"), yamlDocs(t, admissionManifest)...) {
		docs[d["kind"].(string)] = d
	}
	gateway, auth, authz := docs["Gateway"], docs["RequestAuthentication"], docs["AuthorizationPolicy"]
	if gateway == nil || auth == nil || authz == nil || len(yamlDocs(t, admissionManifest)) != 2 {
		t.Fatalf("want the Gateway, and a RequestAuthentication and an AuthorizationPolicy alone in %s", admissionManifest)
	}
	selector := get(t, gateway, "spec", "selector")
	for _, o := range []obj{auth, authz} {
		if got := get(t, o, "spec", "selector", "matchLabels"); !reflect.DeepEqual(got, selector) {
			t.Errorf("%v selects %v, want the gateway's pods %v", o["kind"], got, selector)
		}
	}
	headers := map[string]string{}
	for _, r := range asList(get(t, auth, "spec", "jwtRules")) {
		for _, c := range asList(get(t, r, "outputClaimToHeaders")) {
			h, _ := get(t, c, "header").(string)
			claim, _ := get(t, c, "claim").(string)
			headers[h] = claim
		}
	}
	for _, p := range harness.ClaimHeaderProblems(headers, harness.GatewayAdmission{ClassHeader: a.ClassHeader, TenantHeader: a.TenantHeader,
		TrustClientHeaders: a.TrustClientHeaders, Classes: len(a.Classes)}) {
		t.Error(p)
	}
	// The EnvoyFilters let a queued request's answer wait out the longest
	// wait limit (the single-pool one as bootstrapParams says; the
	// two-pool one as duet renders testdata/duet-pools.yaml, whose
	// admission section must be the chart's).
	var longest time.Duration
	for _, c := range a.Classes {
		longest = max(longest, c.WaitLimit)
	}
	if got := bootstrapParams().MaxMessageTimeout; got < longest+extproc.HoldMargin {
		t.Errorf("the EnvoyFilter's max_message_timeout %v is below the longest admission wait limit %v plus duet's margin %v", got, longest, extproc.HoldMargin)
	}
	var pools struct {
		Admission any `yaml:"admission"`
	}
	var chart struct {
		Config struct {
			Admission any `yaml:"admission"`
		} `yaml:"config"`
	}
	readYAMLFile(t, poolsDuetConfig, &pools)
	readYAMLFile(t, istioHelmValues, &chart)
	if !reflect.DeepEqual(pools.Admission, chart.Config.Admission) {
		t.Errorf("%s: admission %v, want the chart's Istio values' %v", poolsDuetConfig, pools.Admission, chart.Config.Admission)
	}

	rules := asList(get(t, authz, "spec", "rules"))
	if get(t, authz, "spec", "action") != "ALLOW" || len(rules) != 1 ||
		!reflect.DeepEqual(get(t, rules[0], "from", 0, "source"), obj{"requestPrincipals": []any{"*"}}) {
		t.Errorf("AuthorizationPolicy %v: want ALLOW for requestPrincipals [*] alone", authz["spec"])
	}
}

// istioctl analyze, offline and with the stand-in cluster objects, reports
// nothing on the manifests with the admission example but the EnvoyFilter
// warning, and its objects satisfy Istio's CRD schemas.
func TestAdmissionAnalyze(t *testing.T) {
	tools := findIstioTools(t)
	files := append(slices.Clone(manifests), admissionManifest, fixture)
	checkClean(t, istioctlAnalyze(t, tools, files...))
	checkClean(t, clusterAnalyze(t, tools, files...))
	out, err := exec.Command(tools.Check, "crd", "-crds", tools.CRDs, admissionManifest).CombinedOutput()
	if err != nil {
		t.Fatalf("CRD schema validation: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), admissionManifest+":") {
		t.Errorf("no object of %s was validated:\n%s", admissionManifest, out)
	}
}

// Istio's own configuration generator, given the manifests and the
// admission example, builds a gateway that strips clients' x-duet-*
// headers first, runs the JWT filter before duet's ext_proc, and sets
// both admission headers from the token's claims; the result loads in the
// real Envoy.
func TestAdmissionGatewayConfig(t *testing.T) {
	tools := findIstioTools(t)
	envoyTools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	a := readHelmAdmission(t)
	boot, _ := generateGatewayConfig(t, tools, append(slices.Clone(manifests), admissionManifest, fixture)...)
	f := readGateway(t, boot)
	if !f.earlyHeaders {
		t.Error("no early header mutation: clients could set the admission headers")
	}
	jwt, extProc := slices.Index(f.httpFilters, jwtFilter), slices.Index(f.httpFilters, "envoy.filters.http.ext_proc")
	if jwt < 0 || extProc < jwt {
		t.Errorf("HTTP filters %v: want the JWT filter before duet's ext_proc", f.httpFilters)
	}
	set := map[string]bool{}
	harness.Walk(boot["staticResources"], func(m map[string]any) {
		if m["name"] != jwtFilter {
			return
		}
		providers, _ := get(t, m, "typedConfig", "providers").(obj)
		for _, p := range providers {
			for _, c := range asList(p.(obj)["claimToHeaders"]) {
				h, _ := c.(obj)["headerName"].(string)
				set[h] = true
			}
		}
	})
	for _, h := range []string{a.ClassHeader, a.TenantHeader} {
		if !set[h] {
			t.Errorf("the JWT filter does not set %s from a claim (sets %v)", h, slices.Sorted(maps.Keys(set)))
		}
	}
	loadsInEnvoy(t, envoyTools.Envoy, boot, "Istio's gateway configuration with the admission example")
}
