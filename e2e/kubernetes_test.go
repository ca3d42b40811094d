package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/scheduler/kubernetes/kubetest"
)

// k8sJoinDelay is duet's join delay in TestKubernetesDiscovery.
const k8sJoinDelay = 3 * time.Second

// dnsServer answers A queries over UDP on loopback from a mutable table,
// standing in for a cluster's DNS and its headless Services. Other names
// get NXDOMAIN; AAAA queries for known names get no answer.
type dnsServer struct {
	conn net.PacketConn
	mu   sync.Mutex
	a    map[string][]netip.Addr // FQDN with the trailing dot -> addresses
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{conn: conn, a: make(map[string][]netip.Addr)}
	var wg sync.WaitGroup
	wg.Go(d.serve)
	t.Cleanup(func() { conn.Close(); wg.Wait() })
	return d
}

// port is the server's UDP port.
func (d *dnsServer) port() int { return d.conn.LocalAddr().(*net.UDPAddr).Port }

// set makes name resolve to addrs.
func (d *dnsServer) set(name string, addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[name+"."] = nil
	for _, a := range addrs {
		d.a[name+"."] = append(d.a[name+"."], netip.MustParseAddr(a))
	}
}

func (d *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := d.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if out, err := d.answer(buf[:n]); err == nil {
			_, _ = d.conn.WriteTo(out, from)
		}
	}
}

// answer builds the response to one query.
func (d *dnsServer) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	addrs, known := d.a[strings.ToLower(q.Name.String())]
	d.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if q.Type == dnsmessage.TypeA {
		for _, a := range addrs {
			rr := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 0}
			if err := b.AResource(rr, dnsmessage.AResource{A: a.As4()}); err != nil {
				return nil, err
			}
		}
	}
	return b.Finish()
}

// podSlice is one engine pod's EndpointSlice in namespace inference.
func podSlice(service, pod, ip string, ready bool, ports map[string]int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: "inference",
			Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "inference", Name: pod},
		}},
	}
	for name, p := range ports {
		n, port := name, int32(p)
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &n, Port: &port})
	}
	return s
}

// chat sends one non-streamed chat request with the given request ID
// through Envoy at envoyURL and returns the engine that answered it (its
// X-Sim-Server header); anything but a 200 is an error.
func chat(ctx context.Context, envoyURL, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, body, err := harness.Send(ctx, envoyURL, http.MethodPost, "/v1/chat/completions",
		map[string]string{"x-request-id": id}, chatBody(false, ""))
	if err != nil {
		return "", fmt.Errorf("request %s: %w", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("request %s: status %d: %s", id, resp.StatusCode, body)
	}
	return resp.Header.Get("X-Sim-Server"), nil
}

// TestKubernetesDiscovery runs duet with Kubernetes discovery (an
// in-memory API server reached through a kubeconfig) behind the Envoy
// bootstrap `duet envoy-config` renders for it, whose engine clusters
// resolve headless Service names (through a DNS server standing in for the
// cluster's). The engines share one port on different loopback IPs, as pods
// do. A decode pod that becomes ready is scheduled after the join delay and
// Envoy routes to exactly the pod duet names among those the name resolves
// to; a pod that stops being ready gets nothing more; every request
// succeeds throughout.
func TestKubernetesDiscovery(t *testing.T) {
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ports, err := harness.FreePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	enginePort, bootstrapPort, grpcPort, adminPort, envoyPort, envoyAdminPort :=
		ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	const prefillName, decodeName = "sglang-prefill.inference.svc.cluster.local", "sglang-decode.inference.svc.cluster.local"
	const p0, d0, d1 = "127.0.0.2", "127.0.0.3", "127.0.0.4"

	var procs []*harness.Process
	t.Cleanup(func() {
		for _, p := range procs {
			if t.Failed() {
				t.Logf("%s log:\n%s", p.Name, p.Tail(6000))
			}
			p.Stop(5 * time.Second)
		}
	})
	startSim := func(name, mode, ip string) string {
		listen := net.JoinHostPort(ip, strconv.Itoa(enginePort))
		args := harness.SimArgs(mode, harness.SimSpec{}, listen, bootstrapPort,
			harness.Options{KVTimeout: 5 * time.Second, DecodeMsPerToken: 2})
		p, err := harness.StartProcess(dir, name, append([]string{tools.Sim}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		if err := harness.WaitHTTP(ctx, p, "http://"+listen+"/health"); err != nil {
			t.Fatal(err)
		}
		return listen
	}
	startSim("prefill-0", "prefill", p0)
	d0Addr, d1Addr := startSim("decode-0", "decode", d0), startSim("decode-1", "decode", d1)

	api := kubetest.Start()
	defer api.Close()
	kubeconfig, err := api.WriteKubeconfig(dir, "inference")
	if err != nil {
		t.Fatal(err)
	}
	dns := startDNS(t)
	dns.set(prefillName, p0)
	dns.set(decodeName, d0)
	api.Apply(podSlice("sglang-prefill", "prefill-0", p0, true, map[string]int{"http": enginePort, "bootstrap": bootstrapPort}))
	api.Apply(podSlice("sglang-decode", "decode-0", d0, true, map[string]int{"http": enginePort}))

	cfgPath := filepath.Join(dir, "duet.yaml")
	cfg := fmt.Sprintf(`listen: {grpc: "127.0.0.1:%d", admin: "127.0.0.1:%d"}
discovery: {interval: 1s}
kubernetes:
  kubeconfig: %q
  namespace: inference
  debounce: 50ms
  join_delay: %v
  prefill: {service: sglang-prefill, port: http, target_port: %d}
  decode: {service: sglang-decode, port: http, target_port: %d}
envoy: {listen: "127.0.0.1:%d", admin: "127.0.0.1:%d"}
`, grpcPort, adminPort, kubeconfig, k8sJoinDelay, enginePort, enginePort, envoyPort, envoyAdminPort)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	rendered, err := exec.Command(tools.Duet, "envoy-config", "-config", cfgPath).Output()
	if err != nil {
		t.Fatalf("duet envoy-config: %v", err)
	}
	for _, name := range []string{prefillName, decodeName} {
		if !strings.Contains(string(rendered), fmt.Sprintf(`address: %q, port_value: %d`, name, enginePort)) {
			t.Fatalf("the bootstrap does not resolve %s:%d:\n%s", name, enginePort, rendered)
		}
	}
	// The only change to the rendered bootstrap: its clusters ask the test's
	// DNS server instead of the host's resolvers.
	resolver := fmt.Sprintf(`    dns_refresh_rate: 1s
    typed_dns_resolver_config:
      name: envoy.network.dns_resolver.cares
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig
        resolvers: [{socket_address: {address: "127.0.0.1", port_value: %d, protocol: UDP}}]
        dns_resolver_options: {no_default_search_domain: true}
`, dns.port())
	if strings.Count(string(rendered), "    dns_refresh_rate: 1s\n") != 2 {
		t.Fatalf("want two headless clusters with dns_refresh_rate 1s:\n%s", rendered)
	}
	envoyPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(envoyPath, []byte(strings.ReplaceAll(string(rendered), "    dns_refresh_rate: 1s\n", resolver)), 0o644); err != nil {
		t.Fatal(err)
	}

	duet, err := harness.StartProcess(dir, "duet", tools.Duet, "-config", cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	procs = append(procs, duet)
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	if err := harness.WaitHTTP(ctx, duet, adminURL+"/readyz"); err != nil {
		t.Fatal(err)
	}
	envoy, err := harness.StartEnvoy(ctx, dir, envoyPath, fmt.Sprintf("http://127.0.0.1:%d", envoyAdminPort))
	if err != nil {
		t.Fatal(err)
	}
	procs = append(procs, envoy)

	envoyURL := fmt.Sprintf("http://127.0.0.1:%d", envoyPort)
	// chats sends n chat requests at once; each must succeed. It counts the
	// decode engines that served them. The requests overlap on purpose: with
	// one request at a time every engine is idle at each pick, and
	// least_tokens gives ties to the first candidate, so a new engine would
	// be chosen only when a scrape happened to catch the old one busy.
	// Overlapping requests hold reservations, which is what spreads them.
	chats := func(phase string, n int) map[string]int {
		t.Helper()
		type result struct {
			server string
			err    error
		}
		results := make(chan result, n)
		for i := range n {
			go func() {
				server, err := chat(ctx, envoyURL, requestID(t, i)+"-"+phase)
				results <- result{server, err}
			}()
		}
		got := map[string]int{}
		var errs []error
		for range n {
			r := <-results
			if r.err != nil {
				errs = append(errs, r.err)
				continue
			}
			got[r.server]++
		}
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%s: %v", phase, err)
		}
		return got
	}

	if got := chats("start", 4); got[d0Addr] != 4 {
		t.Fatalf("at start, decode engines %v; want all 4 on %s", got, d0Addr)
	}

	// decode-1 becomes ready: DNS and its slice list it at once; duet waits
	// for the join delay, then Envoy routes to it by name.
	dns.set(decodeName, d0, d1)
	added := time.Now()
	api.Apply(podSlice("sglang-decode", "decode-1", d1, true, map[string]int{"http": enginePort}))
	if got := chats("joining", 4); got[d0Addr] != 4 && time.Since(added) < k8sJoinDelay {
		t.Fatalf("within the join delay, decode engines %v; want all on %s", got, d0Addr)
	}
	for {
		got := chats("joined", 6)
		if got[d1Addr] > 0 {
			if waited := time.Since(added); waited < k8sJoinDelay {
				t.Errorf("decode-1 served a request %v after it appeared, before the join delay %v", waited, k8sJoinDelay)
			}
			break
		}
		if time.Since(added) > 20*time.Second {
			t.Fatalf("decode-1 never served a request; decode engines %v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// decode-0 stops being ready: nothing more reaches it.
	api.Apply(podSlice("sglang-decode", "decode-0", d0, false, map[string]int{"http": enginePort}))
	dns.set(decodeName, d1)
	// Until duet has applied the slice (after its debounce) a batch may
	// still land on decode-0, or may by chance miss it; only the metric says
	// the removal took effect.
	harness.WaitFor(t, 10*time.Second, "duet to drop decode-0", func() bool {
		mfs, err := harness.ScrapeMetrics(ctx, http.DefaultClient, adminURL+"/metrics")
		return err == nil && harness.SumMetric(mfs, "duet_discovery_endpoints", map[string]string{"role": "decode", "state": "scheduled"}) == 1
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := chats("leaving", 4)
		if got[d0Addr] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("decode-0 still gets requests: %v", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := chats("left", 8); got[d1Addr] != 8 {
		t.Errorf("after decode-0 left, decode engines %v; want all 8 on %s", got, d1Addr)
	}

	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`duet_discovery_endpoints{pool="default",role="decode",state="scheduled"} 1`,
		`duet_discovery_endpoints{pool="default",role="prefill",state="scheduled"} 1`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("duet /metrics lacks %s", want)
		}
	}
}
