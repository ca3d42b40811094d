package istio

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/duet-router/duet/e2e/harness"
)

// meshCA stands in for istiod's certificate authority: it issues workload
// certificates as Istio does, with the workload's SPIFFE identity as the
// only (URI) subject alternative name, for both TLS client and server use.
type meshCA struct {
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	CAFile string // the root, as Istio's SDS secret ROOTCA holds it
}

// workload is the certificate and key of one mesh identity, as Istio's
// SDS secret "default" holds them.
type workload struct {
	CertFile, KeyFile string
}

// newMesh makes the test mesh's CA in dir and the workload identities of
// the gateway and of duet, as istiod would issue them.
func newMesh(t *testing.T, dir string) (ca *meshCA, gateway, duet workload) {
	t.Helper()
	ca = newMeshCA(t, filepath.Join(dir, "mesh"), "mesh")
	gateway = ca.issue(t, "duet-gateway", meshIdentity(t, gatewayLabel, gatewayLabelValue))
	duet = ca.issue(t, "duet", meshIdentity(t, duetLabel, duetLabelValue))
	return ca, gateway, duet
}

// newMeshCA makes a root CA in dir.
func newMeshCA(t *testing.T, dir, name string) *meshCA {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{Organization: []string{name}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &meshCA{dir: dir, cert: cert, key: key, CAFile: filepath.Join(dir, name+"-root.pem")}
	writePEM(t, ca.CAFile, "CERTIFICATE", der)
	return ca
}

// issue makes the certificate of the SPIFFE identity id.
func (ca *meshCA) issue(t *testing.T, name, id string) workload {
	t.Helper()
	uri, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		URIs:         []*url.URL{uri},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	w := workload{CertFile: filepath.Join(ca.dir, name+".pem"), KeyFile: filepath.Join(ca.dir, name+"-key.pem")}
	writePEM(t, w.CertFile, "CERTIFICATE", der)
	writePEM(t, w.KeyFile, "PRIVATE KEY", keyDER)
	return w
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// withStaticSecrets replaces the two SDS secrets Istio's configuration
// asks its agent for, "default" (the workload's certificate) and "ROOTCA"
// (the mesh CA), by static secrets of the same names holding id's files:
// what istiod's CA and the agent would deliver, without either. Nothing
// else of the TLS contexts changes.
func withStaticSecrets(boot obj, ca *meshCA, id workload) error {
	replaced := 0
	harness.Walk(boot, func(m obj) {
		if name := m["name"]; (name == "default" || name == "ROOTCA") && m["sdsConfig"] != nil {
			delete(m, "sdsConfig")
			replaced++
		}
	})
	if replaced == 0 {
		return fmt.Errorf("no SDS secret to replace: the configuration carries no mesh TLS")
	}
	res := boot["staticResources"].(obj)
	res["secrets"] = []any{
		obj{"name": "default", "tlsCertificate": obj{
			"certificateChain": obj{"filename": id.CertFile}, "privateKey": obj{"filename": id.KeyFile}}},
		obj{"name": "ROOTCA", "validationContext": obj{"trustedCa": obj{"filename": ca.CAFile}}},
	}
	return nil
}

// withoutIstiod drops what only istiod could serve: the ADS source and the
// clusters it would fill (EDS), which nothing used here needs. Envoy
// would otherwise wait for them before it starts serving.
func withoutIstiod(boot obj) {
	res := boot["staticResources"].(obj)
	var kept []any
	for _, c := range res["clusters"].([]any) {
		if c.(obj)["type"] != "EDS" {
			kept = append(kept, c)
		}
	}
	res["clusters"] = kept
	delete(boot, "dynamicResources")
}

// withAdmin serves Envoy's admin interface on addr.
func withAdmin(boot obj, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	n, _ := strconv.Atoi(port)
	boot["admin"] = obj{"address": obj{"socketAddress": obj{"address": host, "portValue": n}}}
	return nil
}

// sidecar is duet's sidecar, running on loopback: Istio's generated
// inbound listener for duet's pod in front of duet's gRPC port.
type sidecar struct {
	Listen   string // where the gateway dials duet (duet's pod IP:9002 in a cluster)
	AdminURL string
	Process  *harness.Process
}

// startSidecar generates the configuration of duet's sidecar with Istio's
// generator (duet's pod of the fixture, the manifests' PeerAuthentication
// and AuthorizationPolicy), readies it for loopback and starts it on the
// real Envoy with duet's mesh identity. In a cluster iptables sends every
// connection for port 9002 to the sidecar's virtualInbound listener, which
// matches its filter chains and RBAC rules on that original port and
// forwards to duet through the cluster inbound|9002||; here the listener
// binds its own loopback port, which takes 9002's place in the chains'
// matches and the RBAC rules, and the cluster dials duet's loopback
// address. Everything else of the filter chains (mTLS, the RBAC filter)
// is Istio's as generated.
func startSidecar(ctx context.Context, t *testing.T, tools istioTools, dir, duetGRPC string, ca *meshCA, id workload) (*sidecar, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	boot, err := generateXDS(ctx, tools, filepath.Join(dir, "sidecar.json"), duetProxy, append(append([]string(nil), manifests...), fixture))
	if err != nil {
		return nil, err
	}
	ports, err := harness.FreePorts(2)
	if err != nil {
		return nil, err
	}
	sc := &sidecar{Listen: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		AdminURL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}

	res := boot["staticResources"].(obj)
	var inbound obj
	for _, l := range res["listeners"].([]any) {
		if l.(obj)["name"] == "virtualInbound" {
			inbound = l.(obj)
		}
	}
	if inbound == nil {
		return nil, fmt.Errorf("no virtualInbound listener in duet's sidecar configuration")
	}
	// Only the inbound side; no iptables, so no original destination.
	res["listeners"] = []any{inbound}
	inbound["address"] = obj{"socketAddress": obj{"address": "127.0.0.1", "portValue": ports[0]}}
	var filters []any
	for _, f := range asList(inbound["listenerFilters"]) {
		if f.(obj)["name"] != "envoy.filters.listener.original_dst" {
			filters = append(filters, f)
		}
	}
	inbound["listenerFilters"] = filters
	// Port 9002, as iptables would keep it: in the filter chain matches and
	// in the RBAC rules' destination ports.
	chains, rules := 0, 0
	for _, fc := range asList(inbound["filterChains"]) {
		if m, _ := fc.(obj)["filterChainMatch"].(obj); m["destinationPort"] == float64(9002) {
			m["destinationPort"] = ports[0]
			chains++
		}
		harness.Walk(fc.(obj)["filters"], func(m obj) {
			if m["destinationPort"] == float64(9002) {
				m["destinationPort"] = ports[0]
				rules++
			}
		})
	}
	if chains == 0 || rules == 0 {
		return nil, fmt.Errorf("duet's sidecar: %d inbound filter chains and %d RBAC rules for port 9002, want some of each", chains, rules)
	}
	withoutIstiod(boot)
	host, port, err := net.SplitHostPort(duetGRPC)
	if err != nil {
		return nil, err
	}
	portNum, _ := strconv.Atoi(port)
	found := false
	for _, c := range res["clusters"].([]any) {
		c := c.(obj)
		if c["name"] != "inbound|9002||" {
			continue
		}
		found = true
		c["type"], c["lbPolicy"] = "STATIC", "ROUND_ROBIN"
		delete(c, "cleanupInterval")
		c["loadAssignment"] = obj{"clusterName": c["name"], "endpoints": []any{obj{"lbEndpoints": []any{
			obj{"endpoint": obj{"address": obj{"socketAddress": obj{"address": host, "portValue": portNum}}}}}}}}
	}
	if !found {
		return nil, fmt.Errorf("no cluster inbound|9002|| in duet's sidecar configuration")
	}
	if err := withStaticSecrets(boot, ca, id); err != nil {
		return nil, fmt.Errorf("duet's sidecar: %w", err)
	}
	if err := withAdmin(boot, sc.AdminURL[len("http://"):]); err != nil {
		return nil, err
	}
	out, err := json.Marshal(boot)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "sidecar-envoy.json")
	if err := os.WriteFile(cfg, out, 0o644); err != nil {
		return nil, err
	}
	if sc.Process, err = harness.StartEnvoy(ctx, dir, cfg, sc.AdminURL); err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("----- duet's sidecar (%s)\n%s", sc.Process.LogPath, sc.Process.Tail(3000))
		}
		sc.Process.Stop(5 * time.Second)
	})
	return sc, nil
}

// sidecarRBAC sums the RBAC filter's counters of duet's sidecar by outcome
// (allowed, denied, and the shadow ones of dry-run policies).
func sidecarRBAC(t *testing.T, sc *sidecar) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	counters, err := harness.EnvoyCounters(ctx, sc.AdminURL, `\.rbac\.`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for name, v := range counters {
		out[name[strings.LastIndex(name, ".")+1:]] += v
	}
	return out
}

// duetCounters sums, by family, duet's metrics that move when a caller
// reaches its gRPC port: streams, requests, entries (believed or not),
// refusals and ejections.
func duetCounters(t *testing.T, s *harness.Stack) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mfs, err := s.DuetMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, name := range []string{"duet_feedback_streams", "duet_feedback_total", "duet_feedback_entries_total",
		"duet_feedback_untrusted_total", "duet_extproc_requests_total", "duet_ejections_total", "duet_auth_refused_total"} {
		out[name] = 0
		for _, m := range mfs[name].GetMetric() {
			out[name] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// clientTLS is a TLS client that does not check duet's certificate (an
// attacker has no reason to) and presents id's certificate, if any.
func clientTLS(t *testing.T, id *workload) credentials.TransportCredentials {
	t.Helper()
	cfg := &tls.Config{InsecureSkipVerify: true}
	if id != nil {
		cert, err := tls.LoadX509KeyPair(id.CertFile, id.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg)
}

// forgedLogs sends, on conn, issue 19's forged access-log message: every
// decode engine unreachable, for made-up request ids. It returns the
// stream's status.
func forgedLogs(conn *grpc.ClientConn, s *harness.Stack) error {
	var decodes []string
	for _, sim := range s.Decode {
		decodes = append(decodes, sim.Address)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return harness.SendAccessLogs(ctx, conn, harness.UnreachableDecodes(decodes, len(decodes)))
}

// openExtProc opens an ext_proc stream on conn and asks for a routing
// decision; it returns the stream's status.
func openExtProc(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return harness.AskRoute(ctx, conn)
}

// meshAttacks tries duet's gRPC port, through duet's sidecar, as callers
// other than the gateway. Each sends issue 19's forged access-log message
// and opens an ext_proc stream; the sidecar must refuse both before duet
// sees a byte: duet's counters (streams, entries, requests, refusals,
// ejections) do not move. Then a caller holding the gateway's identity
// sends the same message: the sidecar lets it through (the refusals were
// the policy's, by identity), and duet, which believes only entries about
// requests it routed, counts them as untrusted and ejects nothing.
func meshAttacks(t *testing.T, s *harness.Stack, sc *sidecar, ca *meshCA) {
	dir := filepath.Dir(ca.CAFile)
	stranger := ca.issue(t, "stranger", "spiffe://cluster.local/ns/inference/sa/default")
	impostor := newMeshCA(t, filepath.Join(dir, "foreign"), "foreign").issue(t, "impostor", meshIdentity(t, gatewayLabel, gatewayLabelValue))
	before, rbacBefore := duetCounters(t, s), sidecarRBAC(t, sc)
	// The gateway's own traffic so far: every entry believed.
	if n := before["duet_feedback_untrusted_total"]; n != 0 {
		t.Errorf("duet_feedback_untrusted_total = %v before any attack: duet did not believe some of the gateway's entries", n)
	}
	for _, tt := range []struct {
		name  string
		creds credentials.TransportCredentials
		want  codes.Code // Unavailable: the TLS handshake failed
	}{
		{"plain text", insecure.NewCredentials(), codes.Unavailable},
		{"TLS without a client certificate", clientTLS(t, nil), codes.Unavailable},
		{"the gateway's identity from another CA", clientTLS(t, &impostor), codes.Unavailable},
		{"a mesh workload other than the gateway", clientTLS(t, &stranger), codes.PermissionDenied},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := grpc.NewClient(sc.Listen, grpc.WithTransportCredentials(tt.creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := forgedLogs(conn, s); status.Code(err) != tt.want {
				t.Errorf("access-log stream: %v, want %s", err, tt.want)
			}
			if err := openExtProc(conn); status.Code(err) != tt.want {
				t.Errorf("ext_proc stream: %v, want %s", err, tt.want)
			}
		})
	}
	if after := duetCounters(t, s); !reflect.DeepEqual(after, before) {
		t.Errorf("the attacks reached duet: its counters went from %v to %v", before, after)
	}
	if denied := sidecarRBAC(t, sc)["denied"] - rbacBefore["denied"]; denied != 2 {
		t.Errorf("duet's sidecar denied %d streams by policy, want 2 (the other workload's)", denied)
	}

	t.Run("the gateway's own identity", func(t *testing.T) {
		gateway := ca.issue(t, "gateway-again", meshIdentity(t, gatewayLabel, gatewayLabelValue))
		conn, err := grpc.NewClient(sc.Listen, grpc.WithTransportCredentials(clientTLS(t, &gateway)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := forgedLogs(conn, s); err != nil {
			t.Fatalf("the gateway's identity was refused: %v", err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			after := duetCounters(t, s)
			if after["duet_feedback_untrusted_total"] >= before["duet_feedback_untrusted_total"]+float64(len(s.Decode)) {
				if after["duet_ejections_total"] != before["duet_ejections_total"] {
					t.Errorf("forged entries ejected engines: %v", after)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("duet did not count the %d forged entries as untrusted: %v", len(s.Decode), after)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}
