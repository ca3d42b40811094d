package istio

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
)

// liveManifests writes copies of the manifests into dir with the stack's
// loopback addresses in place of the Kubernetes ones: the gateway port is
// Envoy's listen port, duet's clusters list duetAt (each replica's
// sidecar; in Kubernetes, DNS on the headless Service of replicas.yaml
// gives the pod addresses), and each engine cluster lists the simulated
// engines (DNS on the engines' headless Services). It returns the file
// paths.
func liveManifests(dir string, addrs harness.Addresses, duetAt []string) ([]string, error) {
	_, port, err := net.SplitHostPort(addrs.EnvoyListen)
	if err != nil {
		return nil, err
	}
	replace := func(file, out string, pairs ...string) (string, error) {
		data, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		for i := 0; i < len(pairs); i += 2 {
			if !bytes.Contains(data, []byte(pairs[i])) {
				return "", fmt.Errorf("%s does not contain %q", file, pairs[i])
			}
			data = bytes.ReplaceAll(data, []byte(pairs[i]), []byte(pairs[i+1]))
		}
		path := filepath.Join(dir, out)
		return path, os.WriteFile(path, data, 0o644)
	}
	gw, err := replace("gateway.yaml", "gateway.yaml", "number: 80, name: http", "number: "+port+", name: http")
	if err != nil {
		return nil, err
	}
	cl, err := replace(fixture, "cluster.yaml", "{name: http2, port: 80, targetPort: 80", "{name: http2, port: "+port+", targetPort: "+port)
	if err != nil {
		return nil, err
	}

	data, err := os.ReadFile("envoyfilter.yaml")
	if err != nil {
		return nil, err
	}
	var ef obj
	if err := yaml.Unmarshal(data, &ef); err != nil {
		return nil, err
	}
	hosts := map[string][]string{"duet_extproc": duetAt, "duet_feedback": duetAt}
	for _, role := range []struct {
		cluster string
		urls    []string
	}{{"duet_decode", addrs.Decode}, {"duet_prefill", addrs.Prefill}} {
		for _, u := range role.urls {
			parsed, err := url.Parse(u)
			if err != nil {
				return nil, err
			}
			hosts[role.cluster] = append(hosts[role.cluster], parsed.Host)
		}
	}
	seen := 0
	for _, p := range ef["spec"].(obj)["configPatches"].([]any) {
		v, _ := p.(obj)["patch"].(obj)["value"].(obj)
		list, ok := hosts[fmt.Sprint(v["name"])]
		if !ok || p.(obj)["applyTo"] != "CLUSTER" {
			continue
		}
		seen++
		var endpoints []any
		for _, hp := range list {
			host, port, err := net.SplitHostPort(hp)
			if err != nil {
				return nil, err
			}
			n, _ := strconv.Atoi(port)
			endpoints = append(endpoints, obj{"endpoint": obj{"address": obj{"socket_address": obj{"address": host, "port_value": n}}}})
		}
		v["type"] = "STATIC"
		delete(v, "dns_lookup_family")
		delete(v, "dns_refresh_rate")
		v["load_assignment"].(obj)["endpoints"] = []any{obj{"lb_endpoints": endpoints}}
	}
	if seen != len(hosts) {
		return nil, fmt.Errorf("envoyfilter.yaml: found %d of the %d clusters to readdress", seen, len(hosts))
	}
	out, err := yaml.Marshal(ef)
	if err != nil {
		return nil, err
	}
	efPath := filepath.Join(dir, "envoyfilter.yaml")
	return []string{gw, efPath, cl}, os.WriteFile(efPath, out, 0o644)
}

// generateXDS runs Istio's config generator (duet-istio-check xds) for the
// proxy that proxyArgs name over the manifests, writes the result to path
// and returns it decoded.
func generateXDS(ctx context.Context, tools istioTools, path string, proxyArgs, manifests []string) (obj, error) {
	args := append(append([]string{"xds", "-o", path}, proxyArgs...), manifests...)
	if out, err := exec.CommandContext(ctx, tools.Check, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("duet-istio-check xds: %v\n%s", err, out)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var boot obj
	if err := json.Unmarshal(data, &boot); err != nil {
		return nil, err
	}
	return boot, nil
}

// liveBootstrap generates the gateway's configuration from the readdressed
// manifests with Istio's generator, then binds its listeners to the
// stack's loopback address, adds Envoy's admin interface, drops what only
// istiod could serve and gives the gateway its mesh identity id (static
// secrets in place of the SDS secrets of Istio's agent).
func liveBootstrap(ctx context.Context, tools istioTools, dir string, addrs harness.Addresses, duetAt []string, ca *meshCA, id workload) ([]byte, error) {
	files, err := liveManifests(dir, addrs, duetAt)
	if err != nil {
		return nil, err
	}
	boot, err := generateXDS(ctx, tools, filepath.Join(dir, "istio-gateway.json"), gatewayProxy, files)
	if err != nil {
		return nil, err
	}
	withoutIstiod(boot)
	if err := withStaticSecrets(boot, ca, id); err != nil {
		return nil, fmt.Errorf("the gateway: %w", err)
	}
	listenHost, _, err := net.SplitHostPort(addrs.EnvoyListen)
	if err != nil {
		return nil, err
	}
	for _, l := range boot["staticResources"].(obj)["listeners"].([]any) {
		l.(obj)["address"].(obj)["socketAddress"].(obj)["address"] = listenHost
	}
	if err := withAdmin(boot, addrs.EnvoyAdmin); err != nil {
		return nil, err
	}
	return json.Marshal(boot)
}

// Istio's generated configurations serve PD traffic on the real Envoy
// through duet, over the mesh's mutual TLS: the gateway's (with the
// EnvoyFilter applied and the stack's addresses in place of the
// cluster's) reaches duet through duet's sidecar (Istio's inbound listener
// for duet's pod, with the PeerAuthentication's TLS and the
// AuthorizationPolicy's RBAC filter), each presenting the mesh identity of
// its pod. Every request is served, each leg reaches an engine of its role
// (the mirror with its own DP rank), the two access logs report every leg
// to duet, and the sidecar admitted all of it by the gateway's identity.
// Then callers other than the gateway try duet's gRPC port through the
// sidecar (see meshAttacks) and never reach duet.
//
// What stands in for the cluster: istiod's CA and agent (the two SDS
// secrets of each proxy become static secrets: certificates with the
// pods' SPIFFE identities from a test CA), iptables (the sidecar listens
// on its own loopback port), and Istio's proxy build (upstream Envoy, see
// docs/deploy/istio.md).
func TestIstioGatewayServesPD(t *testing.T) {
	tools := findIstioTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca, gatewayID, duetID := newMesh(t, dir)
	var sc *sidecar
	attempt := 0
	s, err := harness.Start(ctx, harness.Options{
		// Prefill DP sizes differ from decode so that the ranks of the two
		// legs of a request differ on some requests.
		Prefill: []harness.SimSpec{{DPSize: 2}, {DPSize: 4}},
		Decode:  []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		Dir:     dir,
		// duet as the recipe runs it: the mesh authenticates (its sidecar
		// admits only the gateway), so duet itself checks nobody. Its gRPC
		// port is on loopback here, reached through the sidecar only.
		Auth:     harness.AuthNone,
		DuetYAML: "auth:\n  unauthenticated: true\n",
		Bootstrap: func(ctx context.Context, addrs harness.Addresses) ([]byte, error) {
			attempt++
			var err error
			if sc, err = startSidecar(ctx, t, tools, filepath.Join(dir, fmt.Sprintf("sidecar-%d", attempt)), addrs.DuetGRPC, ca, duetID); err != nil {
				return nil, fmt.Errorf("duet's sidecar: %w", err)
			}
			return liveBootstrap(ctx, tools, dir, addrs, []string{sc.Listen}, ca, gatewayID)
		},
	})
	if err != nil {
		t.Fatalf("start the stack on Istio's gateway configuration (files in %s): %v", dir, err)
	}
	t.Cleanup(func() { s.CloseLoggingIfFailed(t) })

	client := &http.Client{Timeout: 30 * time.Second}
	const requests = 8
	for i := range requests {
		r := harness.Chat(ctx, client, s.EnvoyURL, i, i%2 == 0, 8)
		if r.Outcome != harness.OutcomeServed {
			t.Fatalf("request %d (stream %v): %s %d %s", i, i%2 == 0, r.Outcome, r.Status, r.Detail)
		}
	}
	// Each leg reached an engine of its role; the prefill leg (the mirror)
	// carries the prefill rank, which the mirror policy copied from
	// x-duet-prefill-dp-rank, not the decode rank of the main request.
	legs, differ := map[string]int{}, 0
	for role, sims := range map[string][]*harness.Sim{"prefill": s.Prefill, "decode": s.Decode} {
		for _, sim := range sims {
			recs, err := sim.Requests(ctx)
			if err != nil {
				t.Fatal(err)
			}
			legs[role] += len(recs)
			if role != "prefill" {
				continue
			}
			for _, rec := range recs {
				rank, prefillRank := rec.Headers["x-data-parallel-rank"], rec.Headers["x-duet-prefill-dp-rank"]
				if rank == "" || rank != prefillRank {
					t.Errorf("prefill leg has X-Data-Parallel-Rank %q, want the prefill rank %q", rank, prefillRank)
				}
				if rankOfDecodeLeg(t, s, rec.Headers["x-duet-request-id"]) != rank {
					differ++
				}
			}
		}
	}
	if legs["prefill"] != requests || legs["decode"] != requests {
		t.Errorf("legs reaching engines: %v, want %d of each", legs, requests)
	}
	if differ == 0 {
		t.Error("no request had different decode and prefill ranks: the per-leg rank is not shown")
	}

	// Feedback: one downstream entry per request and one per leg.
	want := map[string]float64{"request": requests, "decode": requests, "prefill": requests}
	deadline := time.Now().Add(10 * time.Second)
	var got map[string]float64
	for {
		got = feedbackEntries(t, s)
		if fmt.Sprint(got) == fmt.Sprint(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("duet's feedback entries by leg: %v, want %v", got, want)
	}

	// All of it came through duet's sidecar, which admitted the gateway's
	// identity and denied nothing.
	rbac := sidecarRBAC(t, sc)
	if rbac["allowed"] == 0 || rbac["denied"] != 0 {
		t.Errorf("duet's sidecar RBAC: %v, want only allowed streams", rbac)
	}
	meshAttacks(t, s, sc, ca)
}

// rankOfDecodeLeg returns the X-Data-Parallel-Rank of the decode leg of the
// request with duet's id.
func rankOfDecodeLeg(t *testing.T, s *harness.Stack, duetID string) string {
	t.Helper()
	for _, sim := range s.Decode {
		recs, err := sim.Requests(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if rec.Headers["x-duet-request-id"] == duetID {
				return rec.Headers["x-data-parallel-rank"]
			}
		}
	}
	t.Fatalf("no decode leg for request %s", duetID)
	return ""
}

// feedbackEntries sums duet_feedback_entries_total by leg.
func feedbackEntries(t *testing.T, s *harness.Stack) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mfs, err := s.DuetMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range mfs["duet_feedback_entries_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "leg" {
				out[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}
