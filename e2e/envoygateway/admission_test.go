package envoygateway

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/extproc"
)

// admissionDir holds the admission example: a SecurityPolicy whose JWT
// filter sets the class and tenant headers that duet's ConfigMap names
// (docs/deploy/envoy-gateway.md, "Admission headers").
const admissionDir = "../../deploy/envoy-gateway/admission"

// The JWT filter as Envoy Gateway names it in the listener.
const jwtFilter = "envoy.filters.http.jwt_authn"

// duetAdmission is the admission section of duet's ConfigMap, as the tests
// read it.
type duetAdmission struct {
	Classes []struct {
		Name      string        `yaml:"name"`
		WaitLimit time.Duration `yaml:"wait_limit"`
	} `yaml:"classes"`
	ClassHeader        string `yaml:"class_header"`
	TenantHeader       string `yaml:"tenant_header"`
	TrustClientHeaders bool   `yaml:"trust_client_headers"`
}

// longestWait is the longest wait limit of the section's classes.
func (a duetAdmission) longestWait() time.Duration {
	var longest time.Duration
	for _, c := range a.Classes {
		longest = max(longest, c.WaitLimit)
	}
	return longest
}

// readAdmission reads the admission section of duet's ConfigMap in objs.
func readAdmission(objs []object) (duetAdmission, error) {
	var cfg struct {
		Admission duetAdmission `yaml:"admission"`
	}
	if err := yaml.Unmarshal([]byte(str(find(objs, "ConfigMap", duetService), "data", "duet.yaml")), &cfg); err != nil {
		return cfg.Admission, fmt.Errorf("ConfigMap duet: duet.yaml: %w", err)
	}
	return cfg.Admission, nil
}

// claimHeaders returns the headers a SecurityPolicy's JWT providers set
// from claims, header to claim.
func claimHeaders(policy object) map[string]string {
	out := map[string]string{}
	for _, p := range list(harness.Dig(policy, "spec", "jwt", "providers")) {
		for _, c := range list(harness.Dig(p, "claimToHeaders")) {
			out[str(c, "header")] = str(c, "claim")
		}
	}
	return out
}

// stripsDuetHeaders reports whether a listener's connection manager
// removes every x-duet-* header before any filter runs.
func stripsDuetHeaders(hcm any) bool {
	for _, ext := range list(harness.Dig(hcm, "earlyHeaderMutationExtensions")) {
		for _, m := range list(harness.Dig(ext, "typedConfig", "mutations")) {
			if str(m, "removeOnMatch", "keyMatcher", "prefix") == "x-duet-" {
				return true
			}
		}
	}
	return false
}

// TestAdmissionManifests: the admission example is one SecurityPolicy, on
// the route duet processes (the EnvoyExtensionPolicy's), whose JWT
// providers set exactly the class and tenant headers of duet's admission
// section; both are x-duet-* headers, which patch.yaml strips from clients
// before any filter runs, so duet need not (and does not) trust clients'
// headers.
func TestAdmissionManifests(t *testing.T) {
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	adm, err := loadManifestsIn(admissionDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(adm) != 1 || str(adm[0], "kind") != "SecurityPolicy" || str(adm[0], "metadata", "namespace") != namespace {
		t.Fatalf("%s holds %d resources, want one SecurityPolicy in %s", admissionDir, len(adm), namespace)
	}
	policy := adm[0]
	ext := find(objs, "EnvoyExtensionPolicy", duetService)
	if got, want := harness.Dig(policy, "spec", "targetRefs"), harness.Dig(ext, "spec", "targetRefs"); !reflectEqual(got, want) {
		t.Errorf("SecurityPolicy targets %v, want the route duet processes, %v", got, want)
	}
	a, err := readAdmission(objs)
	if err != nil {
		t.Fatal(err)
	}
	headers := claimHeaders(policy)
	for _, p := range harness.ClaimHeaderProblems(headers, harness.GatewayAdmission{ClassHeader: a.ClassHeader, TenantHeader: a.TenantHeader,
		TrustClientHeaders: a.TrustClientHeaders, Classes: len(a.Classes)}) {
		t.Error(p)
	}
	patched := false
	harness.Walk(harness.Dig(find(objs, "EnvoyPatchPolicy", duetService), "spec"), func(m map[string]any) {
		if km, ok := m["key_matcher"].(map[string]any); ok && km["prefix"] == "x-duet-" {
			patched = true
		}
	})
	if !patched {
		t.Error("EnvoyPatchPolicy duet does not strip x-duet-* headers: clients could set the admission headers")
	}
}

// reflectEqual compares decoded YAML values.
func reflectEqual(a, b any) bool {
	x, errA := json.Marshal(a)
	y, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(x) == string(y)
}

// TestAdmissionTranslation: Envoy Gateway v1.9.1 takes the manifests with
// the admission SecurityPolicy whole (the policy accepted), and its xDS
// strips clients' x-duet-* headers first, runs the JWT filter before
// duet's ext_proc, sets the admission headers from the token's claims,
// enables the JWT filter on every route that runs duet, and lets duet hold
// a queued request up to the ConfigMap's longest wait limit (patch.yaml's
// max_message_timeout).
func TestAdmissionTranslation(t *testing.T) {
	egctl, creds := translateSetup(t)
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	adm, err := loadManifestsIn(admissionDir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := readAdmission(objs)
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, adm...)
	addrs := placeholderAddrs(creds)
	addrs.Decode, addrs.Prefill = []string{"http://127.0.0.1:30001"}, []string{"http://127.0.0.1:30002"}
	dir := t.TempDir()
	tr, _, _, err := translateWhole(context.Background(), egctl, dir, objs, creds, "the manifests with the admission SecurityPolicy",
		func(extra []object) ([]byte, error) { return translationInput(objs, extra, addrs) })
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range securityPolicies(t, dir) {
		ancestors := list(harness.Dig(p, "status", "ancestors"))
		if len(ancestors) == 0 {
			t.Errorf("SecurityPolicy %s: no ancestor status", str(p, "metadata", "name"))
		}
		for _, an := range ancestors {
			for _, c := range list(harness.Dig(an, "conditions")) {
				if str(c, "status") != "True" {
					t.Errorf("SecurityPolicy %s: %s=%s (%s) %s", str(p, "metadata", "name"), str(c, "type"), str(c, "status"), str(c, "reason"), str(c, "message"))
				}
			}
		}
	}
	for _, m := range admissionEffects(tr, a.longestWait()+extproc.HoldMargin, a.ClassHeader, a.TenantHeader) {
		t.Error(m)
	}
}

// securityPolicies reads the SecurityPolicies, with their status, from
// the translation egctl wrote in dir.
func securityPolicies(t *testing.T, dir string) []object {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "envoy-gateway-output.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		SecurityPolicies []object `json:"securityPolicies"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.SecurityPolicies) == 0 {
		t.Fatal("the translation has no SecurityPolicy")
	}
	return out.SecurityPolicies
}

// admissionEffects lists what the translation's xDS lacks for duet's
// admission queue: the listener strips x-duet-* first, the JWT filter
// comes before duet's ext_proc and sets each header from a claim, every
// route that runs ext_proc runs the JWT filter too, and ext_proc lets duet
// hold a queued request's answer for at least hold.
func admissionEffects(tr *translation, hold time.Duration, headers ...string) []string {
	var missing []string
	need := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}
	var listeners, routes []any
	for _, dump := range tr.Xds {
		for _, c := range list(harness.Dig(dump, "configs")) {
			switch typ := str(c, "@type"); {
			case strings.HasSuffix(typ, ".ListenersConfigDump"):
				for _, l := range list(harness.Dig(c, "dynamicListeners")) {
					if !strings.HasPrefix(str(l, "activeState", "listener", "name"), "envoy-gateway-proxy-ready-") {
						listeners = append(listeners, harness.Dig(l, "activeState", "listener"))
					}
				}
			case strings.HasSuffix(typ, ".RoutesConfigDump"):
				for _, r := range list(harness.Dig(c, "dynamicRouteConfigs")) {
					routes = append(routes, harness.Dig(r, "routeConfig"))
				}
			}
		}
	}
	if len(listeners) != 1 {
		return []string{fmt.Sprintf("%d listeners in the xDS, want 1", len(listeners))}
	}
	hcm := harness.Dig(listeners[0], "defaultFilterChain", "filters", 0, "typedConfig")
	need(stripsDuetHeaders(hcm), "early header mutation removing x-duet-* before any filter")
	jwt, extProc := -1, -1
	var names []string
	set := map[string]bool{}
	for i, f := range list(harness.Dig(hcm, "httpFilters")) {
		name := str(f, "name")
		names = append(names, name)
		switch {
		case name == jwtFilter && jwt < 0:
			jwt = i
			providers, _ := harness.Dig(f, "typedConfig", "providers").(map[string]any)
			for _, p := range providers {
				for _, c := range list(harness.Dig(p, "claimToHeaders")) {
					set[str(c, "headerName")] = true
				}
			}
		case strings.HasPrefix(name, "envoy.filters.http.ext_proc/") && extProc < 0:
			extProc = i
			limit := seconds(harness.Dig(f, "typedConfig", "maxMessageTimeout"))
			need(limit >= hold, fmt.Sprintf("duet's ext_proc: max_message_timeout %v, want at least the longest admission wait limit and duet's margin, %v", limit, hold))
			// duet learns both timeouts from the stream's metadata.
			told := map[string]string{}
			for _, m := range list(harness.Dig(f, "typedConfig", "grpcService", "initialMetadata")) {
				told[str(m, "key")] = str(m, "value")
			}
			want := map[string]string{
				contract.MetadataMessageTimeout:    seconds(harness.Dig(f, "typedConfig", "messageTimeout")).String(),
				contract.MetadataMaxMessageTimeout: limit.String(),
			}
			for k, v := range want {
				got, err := time.ParseDuration(told[k])
				need(err == nil && got.String() == v, fmt.Sprintf("duet's ext_proc: initial_metadata %s = %q, want %s (the filter's own)", k, told[k], v))
			}
		}
	}
	need(jwt >= 0 && extProc > jwt, fmt.Sprintf("the JWT filter before duet's ext_proc (filters %v)", names))
	for _, h := range headers {
		need(set[h], "the JWT filter sets "+h+" from a claim")
	}
	nroutes := 0
	for _, rc := range routes {
		for _, vh := range list(harness.Dig(rc, "virtualHosts")) {
			for _, r := range list(harness.Dig(vh, "routes")) {
				perFilter, _ := harness.Dig(r, "typedPerFilterConfig").(map[string]any)
				runsDuet := slices.ContainsFunc(slices.Collect(maps.Keys(perFilter)), func(k string) bool { return strings.HasPrefix(k, "envoy.filters.http.ext_proc/") })
				if !runsDuet {
					continue
				}
				nroutes++
				_, runsJWT := perFilter[jwtFilter]
				need(runsJWT, "route "+str(r, "name")+" runs duet's ext_proc without the JWT filter")
			}
		}
	}
	need(nroutes > 0, "a route that runs duet's ext_proc")
	return missing
}
