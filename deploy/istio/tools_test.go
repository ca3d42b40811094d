package istio

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/duet-router/duet/e2e/harness"
)

// The manifests under test and the stand-in cluster objects they refer to.
// istioManifests are those that hold Istio objects; the others hold
// Kubernetes objects only (TestKubernetesObjects).
var (
	istioManifests = []string{"gateway.yaml", "envoyfilter.yaml", "auth.yaml"}
	manifests      = append(slices.Clone(istioManifests), "replicas.yaml", "nats.yaml")
	fixture        = filepath.Join("testdata", "cluster.yaml")
)

// istioTools are the executables and files `make istio-tools` builds.
type istioTools struct {
	Istioctl, Check, CRDs string
}

// findIstioTools locates the Istio tools: in DUET_ISTIO_TOOLS (set by the
// Makefile), else in .tools/istio at the repository root. A missing tool is
// an error telling how to build it, never a reason to skip.
func findIstioTools(t *testing.T) istioTools {
	t.Helper()
	dir := os.Getenv("DUET_ISTIO_TOOLS")
	if dir == "" {
		dir = filepath.Join("..", "..", ".tools", "istio")
	}
	tools := istioTools{
		Istioctl: filepath.Join(dir, "istioctl"),
		Check:    filepath.Join(dir, "duet-istio-check"),
		CRDs:     filepath.Join(dir, "crd-all.gen.yaml"),
	}
	for _, p := range []string{tools.Istioctl, tools.Check, tools.CRDs} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("missing %s: run `make istio-tools` (or `make test`, which builds it)", p)
		}
	}
	return tools
}

// envoyFilterWarning is the warning that istioctl analyze gives every
// EnvoyFilter; other problems in an EnvoyFilter come under the same code
// with another message.
const (
	envoyFilterWarning        = "IST0133"
	envoyFilterWarningMessage = "EnvoyFilter exposes internal implementation details"
)

// analyzerMessage is one entry of `istioctl analyze -o json`.
type analyzerMessage struct {
	Code    string `json:"code"`
	Level   string `json:"level"`
	Origin  string `json:"origin"`
	Message string `json:"message"`
}

// istioctlAnalyze runs istioctl analyze offline on files.
func istioctlAnalyze(t *testing.T, tools istioTools, files ...string) []analyzerMessage {
	t.Helper()
	args := []string{"analyze", "--use-kube=false", "--all-namespaces", "--output", "json", "--failure-threshold", "Error"}
	cmd := exec.Command(tools.Istioctl, append(args, files...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// Exit status 79: messages at or above the threshold, still JSON.
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 79 {
			t.Fatalf("istioctl analyze: %v\n%s%s", err, stdout.String(), stderr.String())
		}
	}
	return parseMessages(t, stdout.Bytes())
}

// clusterAnalyze runs the same analyzers with the Kubernetes objects of the
// files included (duet-istio-check analyze).
func clusterAnalyze(t *testing.T, tools istioTools, files ...string) []analyzerMessage {
	t.Helper()
	out := filepath.Join(t.TempDir(), "messages.json")
	cmd := exec.Command(tools.Check, append([]string{"analyze", "-o", out}, files...)...)
	if stderr, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("duet-istio-check analyze: %v\n%s", err, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return parseMessages(t, data)
}

func parseMessages(t *testing.T, data []byte) []analyzerMessage {
	t.Helper()
	var msgs []analyzerMessage
	if err := json.Unmarshal(data, &msgs); err != nil {
		t.Fatalf("analyzer output: %v\n%s", err, data)
	}
	return msgs
}

// checkClean fails on every error or warning except the one Istio gives
// every EnvoyFilter, which it requires (proof that the EnvoyFilter was read).
func checkClean(t *testing.T, msgs []analyzerMessage) {
	t.Helper()
	var sawEnvoyFilter bool
	for _, m := range msgs {
		switch {
		case m.Code == envoyFilterWarning && m.Origin == "EnvoyFilter inference/duet" && strings.Contains(m.Message, envoyFilterWarningMessage):
			sawEnvoyFilter = true
		case m.Level == "Error" || m.Level == "Warning":
			t.Errorf("%s %s %s: %s", m.Level, m.Code, m.Origin, m.Message)
		default:
			t.Logf("%s %s %s: %s", m.Level, m.Code, m.Origin, m.Message)
		}
	}
	if !sawEnvoyFilter {
		t.Errorf("no %s warning on the EnvoyFilter: was envoyfilter.yaml analyzed?", envoyFilterWarning)
	}
}

// analyzeCase breaks one manifest and names what the analysis must report.
type analyzeCase struct {
	name        string
	file        string
	old, new    string
	wantCode    string
	wantMessage string
}

// checkCatches runs analyze on the manifests with each case's mistake and
// fails unless the expected message comes out.
func checkCatches(t *testing.T, cases []analyzeCase, analyze func(t *testing.T, files ...string) []analyzerMessage) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			files := []string{fixture, mutated(t, tt.file, tt.old, tt.new)}
			for _, m := range manifests {
				if m != tt.file {
					files = append(files, m)
				}
			}
			var got []string
			for _, m := range analyze(t, files...) {
				if m.Code == tt.wantCode && strings.Contains(m.Message, tt.wantMessage) {
					return
				}
				got = append(got, m.Code+" "+m.Message)
			}
			t.Errorf("no %s %q; got %q", tt.wantCode, tt.wantMessage, got)
		})
	}
}

// istioctl analyze --use-kube=false must report nothing on the manifests but
// the warning every EnvoyFilter gets, and must catch a typo in a typed Envoy
// config inside a patch. (Offline, istioctl reads only the Istio objects of
// its files: selectors, ports and hosts are TestClusterAnalyze's.)
func TestIstioctlAnalyze(t *testing.T) {
	tools := findIstioTools(t)
	checkClean(t, istioctlAnalyze(t, tools, append(manifests, fixture)...))
	checkCatches(t, []analyzeCase{
		{"typo in a typed config", "envoyfilter.yaml", "failure_mode_allow: false", "failure_mode_alow: false",
			envoyFilterWarning, `unknown field "failure_mode_alow"`},
		{"relative insertion without priority", "envoyfilter.yaml", "priority: 10", "priority: 0", "IST0151", ""},
		{"timeout Istio refuses", "gateway.yaml", "retries:", "timeout: 0s\n    retries:", "IST0106", "duration"},
	}, func(t *testing.T, files ...string) []analyzerMessage { return istioctlAnalyze(t, tools, files...) })
}

// The same analyzers, with the stand-in Services and pods as a cluster
// would provide them, must report nothing either; and they must catch a
// gateway that selects no pod, a gateway port its Service lacks, a route to
// an unknown host, and an AuthorizationPolicy whose selector matches no pod
// (which would leave duet's gRPC port open to the whole mesh).
func TestClusterAnalyze(t *testing.T) {
	tools := findIstioTools(t)
	checkClean(t, clusterAnalyze(t, tools, append(manifests, fixture)...))
	checkCatches(t, []analyzeCase{
		{"gateway selects no pod", "gateway.yaml", "selector:\n    istio: duet-gateway", "selector:\n    istio: nobody", "IST0101", "istio=nobody"},
		{"gateway port not on its Service", "gateway.yaml", "number: 80, name: http", "number: 81, name: http", "IST0162", "port 81"},
		{"route to an unknown host", "gateway.yaml", "host: sglang-decode.inference", "host: sglang-decoder.inference", "IST0101", "sglang-decoder"},
		{"authorization policy selects no pod", "auth.yaml", "instance: duet\n  # ALLOW", "instance: duet-0\n  # ALLOW", "IST0127", "app.kubernetes.io/instance=duet-0"},
	}, func(t *testing.T, files ...string) []analyzerMessage { return clusterAnalyze(t, tools, files...) })
}

// mutated copies a manifest with old replaced by new into a temporary file.
func mutated(t *testing.T, file, old, new string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(old)) {
		t.Fatalf("%s does not contain %q", file, old)
	}
	path := filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(path, bytes.Replace(data, []byte(old), []byte(new), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Every Istio object must satisfy its CRD's OpenAPI schema, as the
// Kubernetes API server would check it on kubectl apply.
func TestCRDSchemas(t *testing.T) {
	tools := findIstioTools(t)
	out, err := exec.Command(tools.Check, append([]string{"crd", "-crds", tools.CRDs}, istioManifests...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("CRD schema validation: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	for _, m := range istioManifests {
		if !strings.Contains(string(out), m+":") {
			t.Errorf("no object of %s was validated", m)
		}
	}
	// A field the schema does not know, or a value it does not allow, must fail.
	for _, tt := range []struct{ name, file, old, new string }{
		{"unknown VirtualService field", "gateway.yaml", "gateways: [duet]", "gateway: [duet]"},
		{"unknown mTLS mode", "auth.yaml", "mode: STRICT", "mode: STRICTLY"},
		{"unknown authorization action", "auth.yaml", "action: ALLOW", "action: PERMIT"},
	} {
		broken := mutated(t, tt.file, tt.old, tt.new)
		if out, err := exec.Command(tools.Check, "crd", "-crds", tools.CRDs, broken).CombinedOutput(); err == nil {
			t.Errorf("%s: passed the schema check:\n%s", tt.name, out)
		}
	}
}

// The two pods of the fixture whose configuration Istio's generator builds:
// the gateway, and duet with its sidecar (duet-istio-check xds flags).
var (
	gatewayProxy = []string{"-proxy-type", "router", "-proxy-name", "duet-gateway", "-proxy-namespace", "inference",
		"-proxy-ip", "10.0.0.10", "-proxy-label", "app=duet-gateway", "-proxy-label", "istio=duet-gateway"}
	duetProxy = []string{"-proxy-type", "sidecar", "-proxy-name", "duet-0", "-proxy-namespace", "inference",
		"-proxy-ip", "10.0.0.20", "-proxy-label", "app.kubernetes.io/name=duet", "-proxy-label", "app.kubernetes.io/instance=duet"}
)

// generateGatewayConfig runs Istio's configuration generator on files for
// the duet-gateway pod of the fixture and returns the Envoy bootstrap and the
// list of Istio-only extensions removed from it.
func generateGatewayConfig(t *testing.T, tools istioTools, files ...string) (boot map[string]any, removed string) {
	t.Helper()
	return generateConfig(t, tools, gatewayProxy, files...)
}

// generateConfig runs Istio's configuration generator on files for the
// proxy that the duet-istio-check xds flags describe and returns the Envoy
// bootstrap and the list of Istio-only extensions removed from it.
func generateConfig(t *testing.T, tools istioTools, proxy []string, files ...string) (boot map[string]any, removed string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proxy.json")
	args := append([]string{"xds", "-o", path}, proxy...)
	cmd := exec.Command(tools.Check, append(args, files...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("generate the proxy's configuration: %v\n%s", err, stderr.String())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &boot); err != nil {
		t.Fatalf("generated bootstrap: %v", err)
	}
	var removedLines []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "removed Istio-only extension: ") {
			removedLines = append(removedLines, strings.TrimPrefix(line, "removed Istio-only extension: "))
		}
	}
	return boot, strings.Join(removedLines, "\n")
}

// gatewayFacts is what the test reads back from the generated configuration.
type gatewayFacts struct {
	clusters     map[string]bool
	httpFilters  []string // of the first HTTP connection manager
	earlyHeaders bool
	grpcLogs     []string // log names of every gRPC access logger
	route        map[string]any
	listenerBuf  float64
}

// readGateway collects the facts from a generated bootstrap (protojson
// field names).
func readGateway(t *testing.T, boot map[string]any) gatewayFacts {
	t.Helper()
	f := gatewayFacts{clusters: map[string]bool{}}
	res, _ := boot["staticResources"].(map[string]any)
	for _, c := range asList(res["clusters"]) {
		f.clusters[c.(map[string]any)["name"].(string)] = true
	}
	for _, l := range asList(res["listeners"]) {
		l := l.(map[string]any)
		if b, ok := l["perConnectionBufferLimitBytes"].(float64); ok {
			f.listenerBuf = b
		}
	}
	harness.Walk(res["listeners"], func(m map[string]any) {
		if m["@type"] == "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager" && f.httpFilters == nil {
			for _, h := range asList(m["httpFilters"]) {
				f.httpFilters = append(f.httpFilters, h.(map[string]any)["name"].(string))
			}
			f.earlyHeaders = len(asList(m["earlyHeaderMutationExtensions"])) > 0
		}
		if m["@type"] == "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig" {
			cc, _ := m["commonConfig"].(map[string]any)
			name, _ := cc["logName"].(string)
			f.grpcLogs = append(f.grpcLogs, name)
		}
		if m["name"] == "duet-inference" {
			if r, ok := m["route"].(map[string]any); ok {
				f.route = r
			}
		}
	})
	return f
}

// asList returns v as a JSON list, or nil.
func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// Istio's own configuration generator (the code istiod runs) must apply
// every patch to the gateway: duet's clusters, the filters before the
// router, both access logs, the header stripping, the listener buffer and
// the route. The result, Istio's whole gateway configuration, must then load
// in the real Envoy.
func TestIstioGeneratedGatewayLoadsInEnvoy(t *testing.T) {
	tools := findIstioTools(t)
	envoyTools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	boot, removed := generateGatewayConfig(t, tools, append(manifests, fixture)...)
	t.Logf("removed before loading in upstream Envoy:\n%s", removed)
	for _, line := range strings.Split(strings.TrimSpace(removed), "\n") {
		if line != "" && !strings.Contains(line, "istio.") {
			t.Errorf("removed an extension that is not Istio's own: %s", line)
		}
	}
	f := readGateway(t, boot)

	for _, c := range []string{"duet_extproc", "duet_feedback", "duet_decode", "duet_prefill"} {
		if !f.clusters[c] {
			t.Errorf("cluster %s missing from the generated configuration", c)
		}
	}
	want := []string{"envoy.filters.http.ext_proc", "envoy.filters.http.json_to_metadata", "envoy.filters.http.sse_to_metadata",
		"envoy.filters.http.lua", "envoy.filters.http.router"}
	if len(f.httpFilters) < len(want) || !slices.Equal(f.httpFilters[len(f.httpFilters)-len(want):], want) {
		t.Errorf("HTTP filters %v, want them to end with %v", f.httpFilters, want)
	}
	if !f.earlyHeaders {
		t.Error("no early header mutation: client routing headers would reach duet and the engines")
	}
	for _, name := range []string{"duet_downstream", "duet_upstream"} {
		if !slices.Contains(f.grpcLogs, name) {
			t.Errorf("no gRPC access log %s (have %v)", name, f.grpcLogs)
		}
	}
	if f.listenerBuf != 32<<20 {
		t.Errorf("listener per_connection_buffer_limit_bytes %v, want %d", f.listenerBuf, 32<<20)
	}
	if f.route == nil {
		t.Fatal("route duet-inference missing")
	}
	if f.route["cluster"] != "duet_decode" {
		t.Errorf("route cluster %v, want duet_decode", f.route["cluster"])
	}
	mirrors := asList(f.route["requestMirrorPolicies"])
	if len(mirrors) != 1 || mirrors[0].(map[string]any)["clusterHeader"] != "x-duet-mirror" {
		t.Errorf("route mirrors %v, want one by cluster_header x-duet-mirror", mirrors)
	}
	rp, _ := f.route["retryPolicy"].(map[string]any)
	if rp["retryOn"] != "connect-failure,reset-before-request" || rp["numRetries"] != float64(1) || len(rp) != 2 {
		t.Errorf("route retry policy %v, want exactly duet's (connect failures, once)", rp)
	}

	loadsInEnvoy(t, envoyTools.Envoy, boot, "Istio's gateway configuration")
}

// loadsInEnvoy fails t unless the Envoy binary envoy loads boot (what
// names it in the failure) in validate mode.
func loadsInEnvoy(t *testing.T, envoy string, boot map[string]any, what string) {
	t.Helper()
	data, err := json.Marshal(boot)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gateway.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(envoy, "--mode", "validate", "-c", path, "--disable-hot-restart").CombinedOutput()
	if err != nil {
		t.Fatalf("Envoy rejects %s: %v\n%s", what, err, out)
	}
}

// A patch that matches nothing in Istio's configuration is dropped without
// a word by Istio; the generated configuration must show it.
func TestIstioGeneratedGatewayShowsUnappliedPatch(t *testing.T) {
	tools := findIstioTools(t)
	broken := mutated(t, "envoyfilter.yaml", "route: {name: duet-inference}", "route: {name: no-such-route}")
	boot, _ := generateGatewayConfig(t, tools, "gateway.yaml", broken, fixture)
	f := readGateway(t, boot)
	if f.route == nil {
		t.Fatal("route duet-inference missing")
	}
	if f.route["cluster"] == "duet_decode" {
		t.Error("the route was patched although the patch names another route")
	}
}
