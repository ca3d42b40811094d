package envoygateway

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/duet-router/duet/e2e/harness"
)

// gatewayTLS is the gateway's half of mutual TLS with duet, as the
// manifests configure it: the Secret with Envoy's client certificate
// (EnvoyProxy duet, spec.backendTLS.clientCertificateRef) and the
// BackendTLSPolicy on duet's gRPC port (the CA duet's certificate must chain
// to, and the name it must carry).
type gatewayTLS struct {
	// clientSecret names the kubernetes.io/tls Secret (tls.crt, tls.key)
	// with Envoy's client certificate.
	clientSecret string
	// policy names the BackendTLSPolicy.
	policy string
	// caRefs are its caCertificateRefs, kind and name, each holding ca.crt.
	caRefs []caRef
	// hostname is its validation.hostname: SNI, and a DNS SAN duet's
	// certificate must carry.
	hostname string
}

// caRef is one of a BackendTLSPolicy's caCertificateRefs.
type caRef struct{ kind, name string }

// readGatewayTLS reads the gateway's half of mutual TLS from the manifests.
// It fails unless the EnvoyProxy gives Envoy a client certificate and one
// BackendTLSPolicy puts TLS on duet's gRPC port (the port both the
// EnvoyExtensionPolicy and the access logs dial).
func readGatewayTLS(objs []object) (gatewayTLS, error) {
	var g gatewayTLS
	g.clientSecret = str(find(objs, "EnvoyProxy", "duet"), "spec", "backendTLS", "clientCertificateRef", "name")
	if g.clientSecret == "" {
		return g, errors.New("EnvoyProxy duet gives Envoy no client certificate (spec.backendTLS.clientCertificateRef)")
	}
	var policies []object
	for _, o := range objs {
		if o["kind"] != "BackendTLSPolicy" {
			continue
		}
		for _, ref := range list(harness.Dig(o, "spec", "targetRefs")) {
			if str(ref, "kind") == "Service" && str(ref, "name") == duetService && slices.Contains([]string{"", "grpc"}, str(ref, "sectionName")) {
				policies = append(policies, o)
			}
		}
	}
	if len(policies) != 1 {
		return g, fmt.Errorf("%d BackendTLSPolicies target Service %s port grpc, want 1", len(policies), duetService)
	}
	p := policies[0]
	g.policy = str(p, "metadata", "name")
	g.hostname = str(p, "spec", "validation", "hostname")
	for _, ref := range list(harness.Dig(p, "spec", "validation", "caCertificateRefs")) {
		g.caRefs = append(g.caRefs, caRef{str(ref, "kind"), str(ref, "name")})
	}
	if g.hostname == "" || len(g.caRefs) == 0 {
		return g, fmt.Errorf("BackendTLSPolicy %s names no CA (caCertificateRefs) or no hostname", g.policy)
	}
	return g, nil
}

// pem reads the credential files named, in order.
func pem(files ...string) ([]byte, error) {
	var out []byte
	for _, f := range files {
		if f == "" {
			return nil, errors.New("a credential file is not set (harness.Credentials)")
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// envoySide reads Envoy's client certificate and key and the CA of creds.
func envoySide(creds harness.Credentials) (cert, key, ca []byte, err error) {
	if cert, err = pem(creds.EnvoyCertFile); err != nil {
		return nil, nil, nil, err
	}
	if key, err = pem(creds.EnvoyKeyFile); err != nil {
		return nil, nil, nil, err
	}
	if ca, err = pem(creds.CAFile); err != nil {
		return nil, nil, nil, err
	}
	return cert, key, ca, nil
}

// credentialObjects are the Secret and the CA objects that the manifests
// name, filled with creds as docs/deploy/envoy-gateway.md fills them from
// `duet certs`: Envoy's client certificate and key, and the CA.
func credentialObjects(g gatewayTLS, creds harness.Credentials) ([]object, error) {
	cert, key, ca, err := envoySide(creds)
	if err != nil {
		return nil, err
	}
	b64 := base64.StdEncoding.EncodeToString
	meta := func(name string) object { return object{"name": name, "namespace": namespace} }
	out := []object{{
		"apiVersion": "v1", "kind": "Secret", "metadata": meta(g.clientSecret), "type": "kubernetes.io/tls",
		"data": object{"tls.crt": b64(cert), "tls.key": b64(key)},
	}}
	for _, r := range g.caRefs {
		switch r.kind {
		case "ConfigMap":
			out = append(out, object{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(r.name), "data": object{"ca.crt": string(ca)}})
		case "Secret":
			out = append(out, object{"apiVersion": "v1", "kind": "Secret", "metadata": meta(r.name), "data": object{"ca.crt": b64(ca)}})
		default:
			return nil, fmt.Errorf("BackendTLSPolicy %s: caCertificateRef of kind %q", g.policy, r.kind)
		}
	}
	return out, nil
}

// sdsSecrets are the secrets that the translated clusters name over SDS,
// by name, as static bootstrap secrets (protojson). egctl prints no
// secrets, so they are made from creds under the names Envoy Gateway
// v1.9.1 gives them: "<namespace>/<Secret>" for a client certificate
// (irTLSListenerConfigName, internal/gatewayapi/helpers.go) and
// "<BackendTLSPolicy>/<namespace>-ca" for its CA (getBackendTLSBundle,
// internal/gatewayapi/backendtlspolicy.go). A name the clusters use and
// this map lacks fails the bootstrap.
func sdsSecrets(g gatewayTLS, creds harness.Credentials) (map[string]any, error) {
	cert, key, ca, err := envoySide(creds)
	if err != nil {
		return nil, err
	}
	inline := func(b []byte) object { return object{"inlineBytes": base64.StdEncoding.EncodeToString(b)} }
	client := namespace + "/" + g.clientSecret
	trust := g.policy + "/" + namespace + "-ca"
	return map[string]any{
		client: object{"name": client, "tlsCertificate": object{"certificateChain": inline(cert), "privateKey": inline(key)}},
		trust:  object{"name": trust, "validationContext": object{"trustedCa": inline(ca)}},
	}, nil
}

// staticSecrets makes every SDS reference in clusters name a static secret
// of secrets (dropping its sdsConfig, which points at Envoy Gateway's xDS
// server) and returns the secrets used, in name order.
func staticSecrets(clusters []any, secrets map[string]any) ([]any, error) {
	used := map[string]bool{}
	var errs []error
	ref := func(sds any) {
		m, ok := sds.(map[string]any)
		if !ok {
			return
		}
		name := str(m, "name")
		if _, ok := secrets[name]; !ok {
			errs = append(errs, fmt.Errorf("a cluster names SDS secret %q, which the test cannot make", name))
		}
		delete(m, "sdsConfig")
		used[name] = true
	}
	harness.Walk(clusters, func(m map[string]any) {
		for _, s := range list(m["tlsCertificateSdsSecretConfigs"]) {
			ref(s)
		}
		ref(m["validationContextSdsSecretConfig"])
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []any
	for _, n := range names {
		out = append(out, secrets[n])
	}
	return out, nil
}

// authEffects lists what the gateway's xDS lacks of mutual TLS to duet:
// the cluster of the ext_proc filter and of each access log must reach
// every endpoint over TLS with Envoy's client certificate, a CA to verify
// duet with, SNI hostname and a DNS SAN check for it; the engines' clusters
// stay plain HTTP. Envoy Gateway puts TLS on an endpoint by a
// transport_socket_matches entry that the endpoint's metadata names (the
// cluster's own transport socket, for endpoints that name none, is an empty
// TLS context: none of duet's endpoints may use it). Field names are
// protojson's.
func authEffects(listener any, clusters []any, hostname, decodeCluster, prefillCluster string) []string {
	var missing []string
	toDuet := clustersToDuet(listener) // cluster name: what dials duet through it
	var users []string
	for _, u := range toDuet {
		users = append(users, u)
	}
	slices.Sort(users)
	if !slices.Contains(users, "ext_proc") || !slices.Contains(users, "duet_downstream") || !slices.Contains(users, "duet_upstream") {
		missing = append(missing, fmt.Sprintf("gRPC services of ext_proc, duet_downstream and duet_upstream (found %v)", users))
	}
	byName := map[string]any{}
	for _, c := range clusters {
		byName[str(c, "name")] = c
	}
	for name, user := range toDuet {
		what := fmt.Sprintf("cluster %s (%s): ", name, user)
		c, ok := byName[name]
		if !ok {
			missing = append(missing, what+"missing")
			continue
		}
		tls := map[string]any{} // match name: UpstreamTlsContext
		for _, m := range list(harness.Dig(c, "transportSocketMatches")) {
			if str(m, "transportSocket", "name") == "envoy.transport_sockets.tls" {
				tls[str(m, "match", "name")] = harness.Dig(m, "transportSocket", "typedConfig")
			}
		}
		endpoints := 0
		harness.Walk(harness.Dig(c, "loadAssignment"), func(m map[string]any) {
			if _, ok := m["endpoint"]; !ok {
				return
			}
			endpoints++
			ctx, ok := tls[str(m, "metadata", "filterMetadata", "envoy.transport_socket_match", "name")]
			if !ok {
				missing = append(missing, what+"an endpoint without TLS")
				return
			}
			common := harness.Dig(ctx, "commonTlsContext")
			san := harness.Dig(common, "combinedValidationContext", "defaultValidationContext", "matchTypedSubjectAltNames", 0)
			if len(list(harness.Dig(common, "tlsCertificateSdsSecretConfigs"))) != 1 ||
				str(common, "combinedValidationContext", "validationContextSdsSecretConfig", "name") == "" ||
				str(ctx, "sni") != hostname || str(san, "sanType") != "DNS" || str(san, "matcher", "exact") != hostname {
				missing = append(missing, fmt.Sprintf("%sTLS with a client certificate, a CA, SNI %s and the DNS SAN %s (got %v)", what, hostname, hostname, ctx))
			}
		})
		if endpoints == 0 {
			missing = append(missing, what+"no endpoints")
		}
	}
	for _, name := range []string{decodeCluster, prefillCluster} {
		c := byName[name]
		if harness.Dig(c, "transportSocket") != nil || harness.Dig(c, "transportSocketMatches") != nil {
			missing = append(missing, "cluster "+name+": TLS to the engines, which serve plain HTTP")
		}
	}
	slices.Sort(missing)
	return missing
}

// TestMissingCredentialsFailClosed: Envoy Gateway v1.9.1 does not take the
// manifests without the Secret or ConfigMap that mutual TLS with duet
// needs, and then fails closed: the EnvoyExtensionPolicy is not Accepted
// (its message names what is missing, as docs/deploy/envoy-gateway.md
// says) and every route answers 500 itself, reaching no engine.
func TestMissingCredentialsFailClosed(t *testing.T) {
	egctl, creds := translateSetup(t)
	addrs := harness.Addresses{DuetGRPC: "127.0.0.1:9002", Decode: []string{"http://127.0.0.1:30001"}, Prefill: []string{"http://127.0.0.1:30002"}}
	for _, c := range []struct {
		name, kind, object, message string
	}{
		{"no Secret with Envoy's client certificate", "Secret", "duet-gateway-tls", "failed to locate TLS secret for client auth: inference/duet-gateway-tls"},
		{"no ConfigMap with the CA", "ConfigMap", "duet-ca", "configmap duet-ca not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, err := loadManifests()
			if err != nil {
				t.Fatal(err)
			}
			g, err := readGatewayTLS(objs)
			if err != nil {
				t.Fatal(err)
			}
			all, err := credentialObjects(g, creds)
			if err != nil {
				t.Fatal(err)
			}
			var extra []object
			for _, o := range all {
				if o["kind"] != c.kind || str(o, "metadata", "name") != c.object {
					extra = append(extra, o)
				}
			}
			if len(extra) != len(all)-1 {
				t.Fatalf("the manifests name no %s %s", c.kind, c.object)
			}
			input, err := translationInput(objs, extra, addrs)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := translate(context.Background(), egctl, t.TempDir(), input)
			if err != nil {
				t.Fatal(err)
			}
			if p := strings.Join(tr.problems(), "\n"); !strings.Contains(p, "EnvoyExtensionPolicy duet: Accepted=False") || !strings.Contains(p, c.message) {
				t.Errorf("want the EnvoyExtensionPolicy not Accepted, saying %q; the translation's problems:\n%s", c.message, p)
			}
			routes := 0
			for _, d := range tr.Xds {
				var dumps []any // the gateway's routes (not the bootstrap's stats route)
				for _, c := range list(harness.Dig(d, "configs")) {
					if strings.HasSuffix(str(c, "@type"), ".RoutesConfigDump") {
						dumps = append(dumps, c)
					}
				}
				harness.Walk(dumps, func(m map[string]any) {
					if _, ok := m["match"]; !ok {
						return
					}
					routes++
					if harness.Dig(m, "directResponse", "status") != float64(500) || harness.Dig(m, "route") != nil {
						t.Errorf("route %s: %v, want a direct 500", str(m, "name"), m)
					}
				})
			}
			if routes == 0 {
				t.Error("no routes in the xDS")
			}
		})
	}
}

// translateSetup finds egctl and makes a set of credentials, for tests
// that translate the manifests without running a stack.
func translateSetup(t *testing.T) (egctl string, creds harness.Credentials) {
	t.Helper()
	egctl, tools := findTools(t)
	creds, err := harness.MakeCredentials(context.Background(), tools.Duet, filepath.Join(t.TempDir(), "credentials"))
	if err != nil {
		t.Fatal(err)
	}
	return egctl, creds
}

// findTools finds egctl and the binaries the harness runs.
func findTools(t *testing.T) (egctl string, tools harness.Tools) {
	t.Helper()
	egctl, err := egctlPath()
	if err != nil {
		t.Fatal(err)
	}
	if tools, err = harness.FindTools(); err != nil {
		t.Fatal(err)
	}
	return egctl, tools
}
