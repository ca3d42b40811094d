package envoygateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
)

// Where the test finds the manifests and egctl.
const (
	manifestDir = "../../deploy/envoy-gateway"
	// egctlVersion is the Envoy Gateway release the Makefile builds egctl
	// from (EGCTL_VERSION); DUET_EGCTL_BIN overrides the path.
	egctlVersion = "v1.9.1"
)

// The engines' Services in route.yaml, and duet's Service. The translation
// input replaces the engines' Services by Envoy Gateway Backends with the
// simulated engines' loopback addresses (egctl has no EndpointSlices to
// resolve a Service's pods from), and gives duet's Service a placeholder
// ClusterIP that the bootstrap maps to duet's loopback gRPC address.
const (
	decodeService  = "sglang-decode"
	prefillService = "sglang-prefill"
	duetService    = "duet"
	duetClusterIP  = "10.96.0.9"
	duetGRPCPort   = 9002
	enginePort     = 30000
	namespace      = "inference"
)

// egctlPath locates egctl: $DUET_EGCTL_BIN, else where the Makefile builds
// it. A missing egctl is an error naming the make target, never a skip.
func egctlPath() (string, error) {
	if p := os.Getenv("DUET_EGCTL_BIN"); p != "" {
		return p, nil
	}
	p, err := filepath.Abs(filepath.Join("..", "..", ".tools", "egctl-"+egctlVersion, "egctl"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("egctl not found at %s: run `make egctl` (or `make test`, which builds it): %w", p, err)
	}
	return p, nil
}

// object is one Kubernetes resource, as decoded from YAML.
type object = map[string]any

// loadManifests reads every resource of deploy/envoy-gateway/*.yaml, in
// file order.
func loadManifests() ([]object, error) { return loadManifestsIn(manifestDir) }

// loadManifestsIn reads every resource of dir/*.yaml, in file order.
func loadManifestsIn(dir string) ([]object, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no manifests in %s", dir)
	}
	sort.Strings(files)
	return decodeManifests(files)
}

// decodeManifests reads every resource of files, in order.
func decodeManifests(files []string) ([]object, error) {
	var objs []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var o object
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if o != nil {
				objs = append(objs, o)
			}
		}
	}
	return objs, nil
}

// marshalYAML renders resources as one YAML stream, in order.
func marshalYAML(objs ...object) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	for _, o := range objs {
		if err := enc.Encode(o); err != nil {
			return nil, err
		}
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// find returns the resource of kind and name, or nil.
func find(objs []object, kind, name string) object {
	for _, o := range objs {
		if o["kind"] == kind && str(o, "metadata", "name") == name {
			return o
		}
	}
	return nil
}

func str(v any, path ...any) string {
	s, _ := harness.Dig(v, path...).(string)
	return s
}

// duetMaxBody reads request.max_body_bytes from the duet.yaml of duet's
// ConfigMap.
func duetMaxBody(objs []object) (int, error) {
	var cfg struct {
		Request struct {
			MaxBodyBytes int `yaml:"max_body_bytes"`
		} `yaml:"request"`
	}
	if err := yaml.Unmarshal([]byte(str(find(objs, "ConfigMap", duetService), "data", "duet.yaml")), &cfg); err != nil {
		return 0, fmt.Errorf("ConfigMap duet: duet.yaml: %w", err)
	}
	if cfg.Request.MaxBodyBytes <= 0 {
		return 0, errors.New("ConfigMap duet: duet.yaml sets no request.max_body_bytes")
	}
	return cfg.Request.MaxBodyBytes, nil
}

// duetClusters reads envoy.clusters from the duet.yaml of duet's ConfigMap.
func duetClusters(objs []object) (decode, prefill string, err error) {
	cm := find(objs, "ConfigMap", duetService)
	text := str(cm, "data", "duet.yaml")
	if text == "" {
		return "", "", errors.New("ConfigMap duet has no duet.yaml")
	}
	var cfg struct {
		Envoy struct {
			Clusters struct{ Decode, Prefill string } `yaml:"clusters"`
		} `yaml:"envoy"`
	}
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		return "", "", fmt.Errorf("ConfigMap duet: duet.yaml: %w", err)
	}
	c := cfg.Envoy.Clusters
	if c.Decode == "" || c.Prefill == "" {
		return "", "", errors.New("ConfigMap duet: duet.yaml names no envoy.clusters")
	}
	return c.Decode, c.Prefill, nil
}

// translationInput is the manifests as egctl gets them: the engines'
// Services replaced by Backends listing the simulated engines, duet's
// Service given a placeholder ClusterIP, the Deployment's plumbing (which
// egctl ignores) left out, and extra (the Secrets and ConfigMaps that a
// cluster would hold) added. It changes objs.
func translationInput(objs, extra []object, addrs harness.Addresses) ([]byte, error) {
	route := find(objs, "HTTPRoute", "duet")
	if route == nil {
		return nil, errors.New("no HTTPRoute duet")
	}
	rules, _ := harness.Dig(route, "spec", "rules").([]any)
	if len(rules) == 0 {
		return nil, errors.New("HTTPRoute duet has no rules")
	}
	backend := func(name string) object {
		return object{"group": "gateway.envoyproxy.io", "kind": "Backend", "name": name}
	}
	swapped := map[string]int{}
	for _, r := range rules {
		refs, _ := harness.Dig(r, "backendRefs").([]any)
		for i, ref := range refs {
			if name := str(ref, "name"); name == decodeService {
				refs[i] = backend(name)
				swapped[name]++
			}
		}
		filters, _ := harness.Dig(r, "filters").([]any)
		for _, f := range filters {
			if m, ok := harness.Dig(f, "requestMirror").(map[string]any); ok && str(m, "backendRef", "name") == prefillService {
				m["backendRef"] = backend(prefillService)
				swapped[prefillService]++
			}
		}
	}
	if swapped[decodeService] == 0 || swapped[prefillService] == 0 {
		return nil, fmt.Errorf("HTTPRoute duet does not send to Service %s and mirror to Service %s", decodeService, prefillService)
	}
	svc := find(objs, "Service", duetService)
	spec, ok := harness.Dig(svc, "spec").(map[string]any)
	if !ok {
		return nil, errors.New("no Service duet")
	}
	spec["clusterIP"] = duetClusterIP

	out := egctlObjects(objs, extra)
	for _, b := range []struct {
		name string
		pods []string
	}{{decodeService, podAddresses(decodeService, addrs.Decode)}, {prefillService, podAddresses(prefillService, addrs.Prefill)}} {
		out = append(out, podBackend(b.name, b.pods))
	}
	return marshalYAML(out...)
}

// egctlObjects are objs without the Deployment's plumbing (which egctl
// ignores), then extra.
func egctlObjects(objs, extra []object) []object {
	var out []object
	for _, o := range objs {
		switch o["kind"] {
		case "Deployment", "ServiceAccount", "Role", "RoleBinding":
			continue
		}
		out = append(out, o)
	}
	return append(out, extra...)
}

// podBackend is the Backend name that lists pods ("ip:port") as its
// endpoints, in place of the Service name.
func podBackend(name string, pods []string) object {
	var eps []any
	for _, pod := range pods {
		host, port, _ := net.SplitHostPort(pod)
		n, _ := strconv.Atoi(port)
		eps = append(eps, object{"ip": object{"address": host, "port": n}})
	}
	return object{
		"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "Backend",
		"metadata": object{"name": name, "namespace": namespace},
		"spec":     object{"endpoints": eps},
	}
}

// podAddresses gives each engine of a role a placeholder pod address,
// "10.0.<role>.<i+1>:30000" as a cluster would (Envoy Gateway refuses
// loopback Backend addresses outside its Host infrastructure); remap moves
// them back to the engines' loopback addresses in the bootstrap.
func podAddresses(service string, engines []string) []string {
	role := 1
	if service == prefillService {
		role = 2
	}
	out := make([]string, len(engines))
	for i := range engines {
		out[i] = fmt.Sprintf("10.0.%d.%d:%d", role, i+1, enginePort)
	}
	return out
}

// remap maps every placeholder address of the engines in the translation
// input to where the stack's engine really listens (duet's address becomes
// every replica's: duetReplicas).
func remap(addrs harness.Addresses) (map[string]string, error) {
	m := map[string]string{}
	for _, role := range []struct {
		service string
		urls    []string
	}{{decodeService, addrs.Decode}, {prefillService, addrs.Prefill}} {
		for i, pod := range podAddresses(role.service, role.urls) {
			u, err := url.Parse(role.urls[i])
			if err != nil {
				return nil, err
			}
			m[pod] = u.Host
		}
	}
	return m, nil
}

// translation is egctl's output: the resources with their status, and the
// xDS of each gateway as an Envoy config dump (protojson field names).
type translation struct {
	GatewayClass           object            `json:"gatewayClass"`
	BackendTLSPolicies     []object          `json:"backendTLSPolicies"`
	Gateways               []object          `json:"gateways"`
	HTTPRoutes             []object          `json:"httpRoutes"`
	EnvoyPatchPolicies     []object          `json:"envoyPatchPolicies"`
	ClientTrafficPolicies  []object          `json:"clientTrafficPolicies"`
	BackendTrafficPolicies []object          `json:"backendTrafficPolicies"`
	EnvoyExtensionPolicies []object          `json:"envoyExtensionPolicies"`
	Xds                    map[string]object `json:"xds"`
}

// translate runs `egctl x translate` from Gateway API resources to their
// status and xDS.
func translate(ctx context.Context, egctl, dir string, input []byte) (*translation, error) {
	in := filepath.Join(dir, "envoy-gateway-input.yaml")
	if err := os.WriteFile(in, input, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, egctl, "x", "translate", "--from", "gateway-api", "--to", "gateway-api,xds",
		"--output", "json", "--file", in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("egctl x translate: %w: %s", err, stderr.String())
	}
	if err := os.WriteFile(filepath.Join(dir, "envoy-gateway-output.json"), out, 0o644); err != nil {
		return nil, err
	}
	var tr translation
	if err := json.Unmarshal(out, &tr); err != nil {
		return nil, fmt.Errorf("egctl x translate output: %w", err)
	}
	return &tr, nil
}

// translateWhole fills in Envoy's side of mutual TLS with duet from creds
// (the gateway's half that objs give, readGatewayTLS), translates the
// input that input makes of objs' credential objects, and fails unless
// Envoy Gateway takes what (the manifests it names) whole. It returns the
// translation with the gateway's TLS and the secrets its clusters name
// over SDS.
func translateWhole(ctx context.Context, egctl, dir string, objs []object, creds harness.Credentials, what string,
	input func(extra []object) ([]byte, error)) (*translation, gatewayTLS, map[string]any, error) {
	g, err := readGatewayTLS(objs)
	if err != nil {
		return nil, g, nil, err
	}
	extra, err := credentialObjects(g, creds)
	if err != nil {
		return nil, g, nil, err
	}
	secrets, err := sdsSecrets(g, creds)
	if err != nil {
		return nil, g, nil, err
	}
	in, err := input(extra)
	if err != nil {
		return nil, g, nil, err
	}
	tr, err := translate(ctx, egctl, dir, in)
	if err != nil {
		return nil, g, nil, err
	}
	if p := tr.problems(); len(p) > 0 {
		return nil, g, nil, fmt.Errorf("Envoy Gateway did not take %s whole:\n  %s", what, strings.Join(p, "\n  "))
	}
	return tr, g, secrets, nil
}

// problems lists every condition of the translated resources that is not
// True: a route or policy Envoy Gateway did not accept, whose references
// did not resolve, or whose patches did not apply.
func (tr *translation) problems() []string {
	var out []string
	check := func(what string, conds any) {
		list, _ := conds.([]any)
		if len(list) == 0 {
			out = append(out, what+": no conditions")
		}
		for _, c := range list {
			if str(c, "status") != "True" {
				out = append(out, fmt.Sprintf("%s: %s=%s (%s) %s", what, str(c, "type"), str(c, "status"), str(c, "reason"), str(c, "message")))
			}
		}
	}
	check("GatewayClass", harness.Dig(tr.GatewayClass, "status", "conditions"))
	// A Gateway's own conditions need a running data plane; its listeners'
	// say whether the translation took them.
	for _, g := range tr.Gateways {
		listeners := list(harness.Dig(g, "status", "listeners"))
		if len(listeners) == 0 {
			out = append(out, "Gateway "+str(g, "metadata", "name")+": no listener status")
		}
		for _, l := range listeners {
			check("Gateway "+str(g, "metadata", "name")+" listener "+str(l, "name"), harness.Dig(l, "conditions"))
		}
	}
	for _, r := range tr.HTTPRoutes {
		parents, _ := harness.Dig(r, "status", "parents").([]any)
		if len(parents) == 0 {
			out = append(out, "HTTPRoute "+str(r, "metadata", "name")+": no parent status")
		}
		for _, p := range parents {
			check("HTTPRoute "+str(r, "metadata", "name"), harness.Dig(p, "conditions"))
		}
	}
	for kind, list := range map[string][]object{
		"EnvoyPatchPolicy": tr.EnvoyPatchPolicies, "ClientTrafficPolicy": tr.ClientTrafficPolicies,
		"BackendTrafficPolicy": tr.BackendTrafficPolicies, "EnvoyExtensionPolicy": tr.EnvoyExtensionPolicies,
		"BackendTLSPolicy": tr.BackendTLSPolicies,
	} {
		if len(list) == 0 {
			out = append(out, "no "+kind)
		}
		for _, p := range list {
			ancestors, _ := harness.Dig(p, "status", "ancestors").([]any)
			if len(ancestors) == 0 {
				out = append(out, kind+" "+str(p, "metadata", "name")+": no ancestor status")
			}
			for _, a := range ancestors {
				check(kind+" "+str(p, "metadata", "name"), harness.Dig(a, "conditions"))
			}
		}
	}
	slices.Sort(out)
	return out
}

// bootstrap turns the one gateway's xDS into a static Envoy bootstrap:
// its listener (on addrs.EnvoyListen) with the route configuration inlined,
// its clusters with their endpoints inlined, the secrets they name over SDS
// made static (from secrets, by name), and an admin interface on
// addrs.EnvoyAdmin. The endpoint of duet's Service becomes one per duet
// replica of the stack (duetReplicas), and remap rewrites the engines'
// endpoint addresses ("ip:port" to "ip:port"); every endpoint must end up
// on loopback. It fails unless the xDS has what the manifests configure for
// duet (patchEffects, replicaEffects, and authEffects for the mutual TLS of
// g).
func (tr *translation) bootstrap(addrs harness.Addresses, remap map[string]string, decodeCluster, prefillCluster string,
	g gatewayTLS, secrets map[string]any) ([]byte, error) {
	return tr.bootstrapChecked(addrs, remap, g, secrets, [][2]string{{decodeCluster, prefillCluster}},
		func(listener any, routes, clusters []any) []string {
			return patchEffects(listener, routes, clusters, decodeCluster, prefillCluster)
		})
}

// bootstrapChecked is bootstrap for engine clusters of any number of pools
// (decode and prefill cluster names, each pair a pool's), with effects
// listing what the xDS lacks of the manifests' patches.
func (tr *translation) bootstrapChecked(addrs harness.Addresses, remap map[string]string, g gatewayTLS, secrets map[string]any,
	engineClusters [][2]string, effects func(listener any, routes, clusters []any) []string) ([]byte, error) {
	if len(tr.Xds) != 1 {
		return nil, fmt.Errorf("xDS for %d gateways, want 1", len(tr.Xds))
	}
	var dump object
	for _, d := range tr.Xds {
		dump = d
	}
	var listeners, routes, clusters, endpoints []any
	configs, _ := harness.Dig(dump, "configs").([]any)
	for _, c := range configs {
		typ := str(c, "@type")
		switch {
		case strings.HasSuffix(typ, ".ListenersConfigDump"):
			for _, l := range list(harness.Dig(c, "dynamicListeners")) {
				// Envoy Gateway's own readiness listener is not the gateway's.
				if !strings.HasPrefix(str(l, "activeState", "listener", "name"), "envoy-gateway-proxy-ready-") {
					listeners = append(listeners, harness.Dig(l, "activeState", "listener"))
				}
			}
		case strings.HasSuffix(typ, ".RoutesConfigDump"):
			for _, r := range list(harness.Dig(c, "dynamicRouteConfigs")) {
				routes = append(routes, harness.Dig(r, "routeConfig"))
			}
		case strings.HasSuffix(typ, ".ClustersConfigDump"):
			for _, cl := range list(harness.Dig(c, "dynamicActiveClusters")) {
				clusters = append(clusters, harness.Dig(cl, "cluster"))
			}
		case strings.HasSuffix(typ, ".EndpointsConfigDump"):
			for _, e := range list(harness.Dig(c, "dynamicEndpointConfigs")) {
				endpoints = append(endpoints, harness.Dig(e, "endpointConfig"))
			}
		}
	}
	if len(listeners) != 1 {
		return nil, fmt.Errorf("%d listeners in the xDS, want 1", len(listeners))
	}
	if missing := effects(listeners[0], routes, clusters); len(missing) > 0 {
		return nil, fmt.Errorf("the translation lacks what the manifests ask for (egctl does not report EnvoyPatchPolicy status):\n  %s",
			strings.Join(missing, "\n  "))
	}
	routeByName := map[string]any{}
	for _, r := range routes {
		delete(r.(map[string]any), "@type")
		routeByName[str(r, "name")] = r
	}
	listener := listeners[0].(map[string]any)
	delete(listener, "@type")
	host, port, err := net.SplitHostPort(addrs.EnvoyListen)
	if err != nil {
		return nil, err
	}
	lport, _ := strconv.Atoi(port)
	listener["address"] = object{"socketAddress": object{"address": host, "portValue": lport}}
	var inlineErr error
	harness.Walk(listener, func(m map[string]any) {
		rds, ok := m["rds"].(map[string]any)
		if !ok {
			return
		}
		name := str(rds, "routeConfigName")
		rc, ok := routeByName[name]
		if !ok {
			inlineErr = fmt.Errorf("listener names route configuration %q, which the xDS lacks", name)
			return
		}
		delete(m, "rds")
		m["routeConfig"] = rc
	})
	if inlineErr != nil {
		return nil, inlineErr
	}

	assignment := map[string]any{}
	for _, e := range endpoints {
		delete(e.(map[string]any), "@type")
		assignment[str(e, "clusterName")] = e
	}
	if missing := replicaEffects(listeners[0], clusters, assignment); len(missing) > 0 {
		return nil, fmt.Errorf("the translation does not reach every duet replica and skip a dead one:\n  %s", strings.Join(missing, "\n  "))
	}
	for _, c := range clusters {
		cm := c.(map[string]any)
		delete(cm, "@type")
		if str(cm, "type") == "EDS" {
			la, ok := assignment[str(cm, "name")]
			if !ok {
				return nil, fmt.Errorf("EDS cluster %q has no endpoints in the xDS", str(cm, "name"))
			}
			cm["type"] = "STATIC"
			delete(cm, "edsClusterConfig")
			cm["loadAssignment"] = la
		}
	}
	for _, pool := range engineClusters {
		if missing := authEffects(listeners[0], clusters, g.hostname, pool[0], pool[1]); len(missing) > 0 {
			return nil, fmt.Errorf("the translation lacks mutual TLS to duet:\n  %s", strings.Join(missing, "\n  "))
		}
	}
	static, err := staticSecrets(clusters, secrets)
	if err != nil {
		return nil, err
	}
	if n := duetReplicas(clusters, net.JoinHostPort(duetClusterIP, strconv.Itoa(duetGRPCPort)), duetAddresses(addrs)); n != 3 {
		return nil, fmt.Errorf("duet's Service is an endpoint of %d clusters, want 3 (ext_proc and the two access logs)", n)
	}
	var remapErr error
	harness.Walk(clusters, func(m map[string]any) {
		sa, ok := m["socketAddress"].(map[string]any)
		if !ok {
			return
		}
		addr := net.JoinHostPort(str(sa, "address"), fmt.Sprint(harness.Dig(sa, "portValue")))
		if to, ok := remap[addr]; ok {
			h, p, _ := net.SplitHostPort(to)
			n, _ := strconv.Atoi(p)
			sa["address"], sa["portValue"] = h, n
			addr = to
		}
		if ip := net.ParseIP(str(sa, "address")); ip == nil || !ip.IsLoopback() {
			remapErr = fmt.Errorf("a cluster endpoint is at %s, not on loopback", addr)
		}
	})
	if remapErr != nil {
		return nil, remapErr
	}

	ahost, aport, err := net.SplitHostPort(addrs.EnvoyAdmin)
	if err != nil {
		return nil, err
	}
	ap, _ := strconv.Atoi(aport)
	return json.MarshalIndent(object{
		"admin": object{"address": object{"socketAddress": object{"address": ahost, "portValue": ap}}},
		"staticResources": object{
			"listeners": []any{listener},
			"clusters":  clusters,
			"secrets":   static,
		},
	}, "", "  ")
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

// patchEffects lists what the gateway's xDS lacks of duet's Envoy contract
// (docs/envoy-contract.md), whichever resource of deploy/envoy-gateway
// configures it. egctl reports no EnvoyPatchPolicy status, so a JSON patch
// that does not apply shows up here. Field names are protojson's.
func patchEffects(listener any, routes, clusters []any, decodeCluster, prefillCluster string) []string {
	missing := listenerEffects(listener)
	need := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}
	nroutes := 0
	for _, rc := range routes {
		for _, vh := range list(harness.Dig(rc, "virtualHosts")) {
			for _, r := range list(harness.Dig(vh, "routes")) {
				nroutes++
				name := str(r, "name")
				mirrors := list(harness.Dig(r, "route", "requestMirrorPolicies"))
				need(len(mirrors) == 1 && str(mirrors[0], "clusterHeader") == "x-duet-mirror" && str(mirrors[0], "cluster") == "" &&
					len(list(harness.Dig(mirrors[0], "requestHeadersMutations"))) == 2,
					"route "+name+": the one mirror by cluster_header x-duet-mirror with the prefill rank mutations")
				need(str(r, "route", "cluster") == decodeCluster, "route "+name+": cluster "+decodeCluster)
				need(str(r, "route", "timeout") == "0s", "route "+name+": timeout 0s")
				need(str(r, "route", "retryPolicy", "retryOn") == "connect-failure,reset-before-request", "route "+name+": retry on connect-failure,reset-before-request")
			}
		}
	}
	need(nroutes > 0, "routes")
	return append(missing, engineClusterEffects(clusters, decodeCluster, prefillCluster)...)
}

// listenerEffects lists what the gateway's listener lacks of duet's Envoy
// contract (patchEffects' listener half).
func listenerEffects(listener any) []string {
	var missing []string
	need := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}
	hcm := harness.Dig(listener, "defaultFilterChain", "filters", 0, "typedConfig")
	stripsPrefix, stripsRank := false, false
	for _, ext := range list(harness.Dig(hcm, "earlyHeaderMutationExtensions")) {
		for _, m := range list(harness.Dig(ext, "typedConfig", "mutations")) {
			stripsPrefix = stripsPrefix || str(m, "removeOnMatch", "keyMatcher", "prefix") == "x-duet-"
			stripsRank = stripsRank || str(m, "remove") == "x-data-parallel-rank"
		}
	}
	need(stripsPrefix && stripsRank, "early header mutation removing x-duet-* and x-data-parallel-rank")
	need(len(list(harness.Dig(hcm, "localReplyConfig", "mappers"))) == 9, "local_reply_config with duet's nine mappers")
	var names []string
	var router any
	for _, f := range list(harness.Dig(hcm, "httpFilters")) {
		names = append(names, str(f, "name"))
		if str(f, "name") == "envoy.filters.http.router" {
			router = f
		}
	}
	order := strings.Join(names, " ")
	need(strings.HasPrefix(order, "envoy.filters.http.ext_proc/") &&
		strings.HasSuffix(order, " envoy.filters.http.json_to_metadata envoy.filters.http.sse_to_metadata envoy.filters.http.lua envoy.filters.http.router"),
		"HTTP filters ext_proc, ..., json_to_metadata, sse_to_metadata, lua, router (got "+order+")")
	for _, l := range []struct {
		name string
		logs []any
	}{{"duet_downstream", list(harness.Dig(hcm, "accessLog"))}, {"duet_upstream", list(harness.Dig(router, "typedConfig", "upstreamLog"))}} {
		found := false
		for _, a := range l.logs {
			if str(a, "typedConfig", "commonConfig", "logName") == l.name {
				found = harness.Dig(a, "typedConfig", "commonConfig", "bufferSizeBytes") == float64(0)
			}
		}
		need(found, "access log "+l.name+" with buffer_size_bytes 0")
	}
	need(harness.Dig(router, "typedConfig", "upstreamLogOptions") == nil, "router without upstream_log_options (no entry when a leg starts)")
	return missing
}

// engineClusterEffects lists what one PD pool's engine clusters lack of
// duet's Envoy contract (patchEffects' cluster half): override_host on
// duet's header, the buffer and circuit breakers on both, the body-rank Lua
// filter on the decode cluster.
func engineClusterEffects(clusters []any, decodeCluster, prefillCluster string) []string {
	var missing []string
	need := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}
	byName := map[string]any{}
	for _, c := range clusters {
		byName[str(c, "name")] = c
	}
	for _, c := range []struct{ name, header string }{{decodeCluster, "x-duet-decode-endpoint"}, {prefillCluster, "x-duet-prefill-endpoint"}} {
		cl, ok := byName[c.name]
		need(ok, "cluster "+c.name)
		policy := harness.Dig(cl, "loadBalancingPolicy", "policies", 0, "typedExtensionConfig")
		need(str(policy, "name") == "envoy.load_balancing_policies.override_host" &&
			str(policy, "typedConfig", "overrideHostSources", 0, "header") == c.header,
			"cluster "+c.name+": override_host on "+c.header)
		need(harness.Dig(cl, "perConnectionBufferLimitBytes") == float64(32<<20), "cluster "+c.name+": 32 MiB buffer limit")
		need(harness.Dig(cl, "circuitBreakers", "thresholds", 0, "maxRetries") == float64(1024), "cluster "+c.name+": circuit breakers")
	}
	filters := list(harness.Dig(byName[decodeCluster], "typedExtensionProtocolOptions", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "httpFilters"))
	need(len(filters) == 2 && str(filters[0], "name") == "envoy.filters.http.lua", "cluster "+decodeCluster+": the body-rank Lua upstream filter")
	return missing
}
