package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/duet-router/duet/envoy"
	"github.com/duet-router/duet/scheduler/kubernetes"
	"github.com/duet-router/duet/scheduler/kubernetes/kubetest"
)

// noEnv is an environment without POD_NAMESPACE, KUBECONFIG or a
// service-account namespace file.
var noEnv = kubernetes.Env{
	Getenv:   func(string) string { return "" },
	ReadFile: func(string) ([]byte, error) { return nil, fs.ErrNotExist },
}

// engineSlice returns an EndpointSlice of service listing the loopback
// engine at url (ready or not) under the port name "http".
func engineSlice(t *testing.T, name, service, url string, ready bool) *discoveryv1.EndpointSlice {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	port, portName := int32(n), "http"
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "inference",
			Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"127.0.0.1"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "inference", Name: name},
		}},
	}
}

// startAPI starts an in-memory API server and writes a kubeconfig for it
// (namespace inference).
func startAPI(t *testing.T) (*kubetest.APIServer, string) {
	t.Helper()
	api := kubetest.Start()
	t.Cleanup(api.Close)
	kubeconfig, err := api.WriteKubeconfig(t.TempDir(), "inference")
	if err != nil {
		t.Fatal(err)
	}
	return api, kubeconfig
}

// testEngine is an engine that serves /server_info with DP size 2 in the
// given disaggregation mode, or, with mode "vllm", none (as vLLM).
func testEngine(t *testing.T, mode string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/server_info" && mode != "vllm" {
			fmt.Fprintf(w, `{"dp_size":2,"disaggregation_mode":%q}`, mode)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// duet serves with a kubernetes section against an API server reached
// through a kubeconfig: not ready until the EndpointSlices list both pools,
// ready then, and not ready again when the decode pool empties; the
// discovery metrics are on /metrics.
func TestServeKubernetes(t *testing.T) {
	api, kubeconfig := startAPI(t)
	prefill, decode := testEngine(t, "prefill"), testEngine(t, "decode")
	admin := freeAddr(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: {grpc: %q, admin: %q}
load: {interval: -1s}
health: {interval: -1s}
kubernetes:
  kubeconfig: %q
  debounce: 10ms
  join_delay: -1s
  prefill: {service: sglang-prefill, port: http}
  decode: {service: sglang-decode}
`, freeAddr(t), admin, kubeconfig))

	stop := runDuet(cfg)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	get := func(path string) (int, string) { return adminGet(admin, path) }
	waitCode := func(path string, want int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			code, body := get(path)
			if code == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s = %d %q, want %d", path, code, body, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitCode("/healthz", 200)
	// The informer has listed (the namespace comes from the kubeconfig).
	for deadline := time.Now().Add(15 * time.Second); api.Requests() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("duet never called the API server")
		}
	}
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("/readyz = %d without engines, want 503", code)
	}
	api.Apply(engineSlice(t, "sglang-decode-a", "sglang-decode", decode.URL, true))
	time.Sleep(100 * time.Millisecond)
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("/readyz = %d without a prefill engine, want 503", code)
	}
	api.Apply(engineSlice(t, "sglang-prefill-a", "sglang-prefill", prefill.URL, true))
	waitCode("/readyz", 200)
	_, metrics := get("/metrics")
	for _, want := range []string{
		`duet_discovery_endpoints{pool="default",role="decode",state="scheduled"} 1`,
		`duet_discovery_endpoints{pool="default",role="prefill",state="scheduled"} 1`,
		`duet_discovery_updates_total{outcome="applied",pool="default"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	api.Apply(engineSlice(t, "sglang-decode-a", "sglang-decode", decode.URL, false))
	waitCode("/readyz", 503)
	api.Apply(engineSlice(t, "sglang-decode-a", "sglang-decode", decode.URL, true))
	waitCode("/readyz", 200)
	api.Delete("inference", "sglang-decode-a")
	waitCode("/readyz", 503)
}

func TestNewDiscovery(t *testing.T) {
	run, err := newDiscovery(mustParse(t, `decode: [{url: "http://10.0.0.1:30000"}]`), map[string]endpointSetter{"default": &fakeSetter{}}, noEnv, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	run(ctx) // without a kubernetes section: returns at once

	for _, tt := range []struct {
		name, yaml, want string
	}{
		{"not in a cluster", `kubernetes: {decode: {service: d}}`, "in-cluster configuration"},
		{"missing kubeconfig", `kubernetes: {kubeconfig: /nonexistent/kubeconfig, decode: {service: d}}`, "kubeconfig /nonexistent/kubeconfig"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := newDiscovery(mustParse(t, tt.yaml), map[string]endpointSetter{"default": &fakeSetter{}}, noEnv, zap.NewNop(), nil); err == nil ||
				!strings.Contains(err.Error(), tt.want) {
				t.Fatalf("newDiscovery: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestKubernetesEnvoyParams(t *testing.T) {
	podNS := kubernetes.Env{
		Getenv:   func(k string) string { return map[string]string{"POD_NAMESPACE": "from-pod"}[k] },
		ReadFile: noEnv.ReadFile,
	}
	tests := []struct {
		name            string
		yaml            string
		env             kubernetes.Env
		prefill, decode []envoy.Address
		wantErr         string
	}{
		{
			name:    "pd, numbered and named ports",
			yaml:    `kubernetes: {namespace: inference, prefill: {service: p, port: http, target_port: 30000}, decode: {service: d, port: 30001}}`,
			env:     noEnv,
			prefill: []envoy.Address{{Host: "p.inference.svc.cluster.local", Port: 30000}},
			decode:  []envoy.Address{{Host: "d.inference.svc.cluster.local", Port: 30001}},
		},
		{
			name:   "aggregated, duet's namespace, cluster domain",
			yaml:   `kubernetes: {cluster_domain: k8s.example, decode: {service: sglang, target_port: 8000}}`,
			env:    podNS,
			decode: []envoy.Address{{Host: "sglang.from-pod.svc.k8s.example", Port: 8000}},
		},
		{
			name:    "no port number",
			yaml:    `kubernetes: {namespace: n, prefill: {service: p}, decode: {service: d, port: 30000}}`,
			env:     noEnv,
			wantErr: "kubernetes.prefill.target_port",
		},
		{
			name:    "no namespace",
			yaml:    `kubernetes: {decode: {service: d, port: 30000}}`,
			env:     noEnv,
			wantErr: "set kubernetes.namespace",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p envoy.Params
			err := kubernetesEnvoyParams(&p, mustParse(t, tt.yaml).Kubernetes, tt.env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !p.Headless || fmt.Sprint(p.Prefill) != fmt.Sprint(tt.prefill) || fmt.Sprint(p.Decode) != fmt.Sprint(tt.decode) {
				t.Errorf("params headless %v, prefill %v, decode %v; want %v, %v", p.Headless, p.Prefill, p.Decode, tt.prefill, tt.decode)
			}
		})
	}
	// The whole bootstrap renders from such a file.
	var out strings.Builder
	if err := writeEnvoyConfig(&out, mustParse(t, `kubernetes: {namespace: inference, decode: {service: d, port: 30001}}`)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `address: "d.inference.svc.cluster.local", port_value: 30001`) ||
		!strings.Contains(out.String(), "dns_lookup_family: ALL") {
		t.Errorf("bootstrap lacks the headless decode cluster:\n%s", out.String())
	}
}

// With Kubernetes discovery a reload never touches the endpoint lists; a
// changed kubernetes section is named for a restart.
func TestReloadKubernetes(t *testing.T) {
	const running = "kubernetes: {namespace: inference, decode: {service: d}}\n"
	tests := []struct {
		name, file  string
		wantWarning bool
	}{
		{"same file", running, false},
		{"changed section", "kubernetes: {namespace: inference, decode: {service: other}}\n", true},
		{"static lists", `decode: [{url: "http://10.0.0.1:30000"}]` + "\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			set := &fakeSetter{}
			r := newReloader(writeConfig(t, tt.file), mustParse(t, running), map[string]endpointSetter{"default": set}, zap.New(core), nil)
			if got := r.reload(context.Background()); got != reloadOK {
				t.Fatalf("reload = %q", got)
			}
			if set.calls != 0 {
				t.Errorf("SetEndpoints called %d times", set.calls)
			}
			warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
			if got := len(warns) == 1 && strings.Contains(fmt.Sprint(warns[0].ContextMap()["fields"]), "kubernetes"); got != tt.wantWarning {
				t.Errorf("warnings %v, want one naming kubernetes: %v", warns, tt.wantWarning)
			}
		})
	}
}

// With pools, each pool's Services feed that pool's scheduler only: a PD
// pool of SGLang engines and an aggregated pool of vLLM engines (no
// /server_info: the Service's dp_size gives their DP size). duet is ready
// once one pool can serve, and each pool's discovery metrics carry its
// label.
func TestServeKubernetesPools(t *testing.T) {
	api, kubeconfig := startAPI(t)
	prefill, decode, vllm := testEngine(t, "prefill"), testEngine(t, "decode"), testEngine(t, "vllm")
	admin := freeAddr(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: {grpc: %q, admin: %q}
load: {interval: -1s}
health: {interval: -1s}
discovery: {timeout: 1s}
kubernetes: {kubeconfig: %q, debounce: 10ms, join_delay: -1s}
pools:
- name: ds
  models: [deepseek-ai/DeepSeek-V3]
  kubernetes:
    prefill: {service: sglang-prefill, port: http}
    decode: {service: sglang-decode}
- name: qwen
  models: [Qwen/Qwen3-8B]
  kubernetes:
    decode: {service: vllm, dp_size: 3}
`, freeAddr(t), admin, kubeconfig))
	stop := runDuet(cfg)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	ready := func() bool { code, _ := adminGet(admin, "/readyz"); return code == 200 }
	waitFor("the API server to be called", func() bool { return api.Requests() > 0 })
	if ready() {
		t.Fatal("ready without engines")
	}
	api.Apply(engineSlice(t, "vllm-a", "vllm", vllm.URL, true))
	waitFor("ready with the vLLM pool alone", ready)

	api.Apply(engineSlice(t, "sglang-decode-a", "sglang-decode", decode.URL, true))
	api.Apply(engineSlice(t, "sglang-prefill-a", "sglang-prefill", prefill.URL, true))
	type pool struct {
		Name      string
		Ready     bool
		Endpoints []struct {
			URL    string
			DPSize int `json:"dp_size"`
		}
	}
	var page struct{ Pools []pool }
	waitFor("both pools ready", func() bool {
		_, body := adminGet(admin, "/status.json")
		return json.Unmarshal([]byte(body), &page) == nil && len(page.Pools) == 2 && page.Pools[0].Ready && page.Pools[1].Ready
	})
	urls := func(p pool) (out []string) {
		for _, e := range p.Endpoints {
			out = append(out, fmt.Sprintf("%s/%d", e.URL, e.DPSize))
		}
		slices.Sort(out)
		return out
	}
	want := []string{fmt.Sprintf("%s/2", decode.URL), fmt.Sprintf("%s/2", prefill.URL)}
	slices.Sort(want)
	if got := urls(page.Pools[0]); !slices.Equal(got, want) {
		t.Errorf("pool ds has %v, want %v", got, want)
	}
	if got := urls(page.Pools[1]); !slices.Equal(got, []string{vllm.URL + "/3"}) {
		t.Errorf("pool qwen has %v, want %s with DP size 3", got, vllm.URL)
	}
	_, metrics := adminGet(admin, "/metrics")
	for _, want := range []string{
		`duet_discovery_endpoints{pool="ds",role="prefill",state="scheduled"} 1`,
		`duet_discovery_endpoints{pool="ds",role="decode",state="scheduled"} 1`,
		`duet_discovery_endpoints{pool="qwen",role="decode",state="scheduled"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
