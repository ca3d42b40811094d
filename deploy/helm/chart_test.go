package helm

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/deploy/helm/internal/kubeschema"
)

const (
	chartDir = "duet"
	release  = "duet"
	// namespace is the release's namespace in every rendering.
	namespace = "duet-system"
	// kubeVersion is the cluster version helm renders for; the schemas come
	// from the same minor (K8S_OPENAPI_VERSION in the Makefile).
	kubeVersion = "1.37.2"
)

// tools are the executables and schema sources the tests use, all pinned
// and installed by `make helm-tools` (part of `make test`).
type tools struct {
	helm, kubeconform, openAPIDir, crdDir, certManagerCRDDir, duet, envoy string
}

// findTools reads the tools' paths from the environment the Makefile
// exports. A missing tool fails the test (it is never a reason to skip).
func findTools(t *testing.T) tools {
	t.Helper()
	tk := tools{
		helm:        os.Getenv("DUET_HELM_BIN"),
		kubeconform: os.Getenv("DUET_KUBECONFORM_BIN"),
		openAPIDir:  os.Getenv("DUET_K8S_OPENAPI_DIR"),
		crdDir:      os.Getenv("DUET_K8S_CRD_DIR"),
		envoy:       os.Getenv("DUET_ENVOY_BIN"),

		certManagerCRDDir: os.Getenv("DUET_CERT_MANAGER_CRD_DIR"),
	}
	if dir := os.Getenv("DUET_BIN_DIR"); dir != "" {
		tk.duet = filepath.Join(dir, "duet")
	}
	var missing []string
	for _, p := range []struct{ env, path string }{
		{"DUET_HELM_BIN", tk.helm}, {"DUET_KUBECONFORM_BIN", tk.kubeconform},
		{"DUET_K8S_OPENAPI_DIR", tk.openAPIDir}, {"DUET_K8S_CRD_DIR", tk.crdDir},
		{"DUET_CERT_MANAGER_CRD_DIR", tk.certManagerCRDDir},
		{"DUET_BIN_DIR", tk.duet}, {"DUET_ENVOY_BIN", tk.envoy},
	} {
		if p.path == "" {
			missing = append(missing, p.env+" unset")
		} else if _, err := os.Stat(p.path); err != nil {
			missing = append(missing, p.path)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("missing %s: run `make test` (it builds duet, installs Envoy and the pinned helm tools)", strings.Join(missing, ", "))
	}
	return tk
}

// writeSchemas generates the strict JSON schemas of every Kubernetes kind
// and of the ServiceMonitor and cert-manager Certificate CRDs into a
// temporary directory, and returns kubeconform's schema location for them.
func writeSchemas(t *testing.T, tk tools) string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(tk.openAPIDir, "*.json"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no OpenAPI documents in %s (%v)", tk.openAPIDir, err)
	}
	var data [][]byte
	for _, d := range docs {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b)
	}
	set, err := kubeschema.FromOpenAPI(data...)
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range []string{
		filepath.Join(tk.crdDir, "monitoring.coreos.com_servicemonitors.yaml"),
		filepath.Join(tk.certManagerCRDDir, "cert-manager.io_certificates.yaml"),
	} {
		data, err := os.ReadFile(crd)
		if err != nil {
			t.Fatal(err)
		}
		kinds, err := kubeschema.FromCRD(data)
		if err != nil {
			t.Fatalf("%s: %v", crd, err)
		}
		if err := set.Merge(kinds); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	if err := set.Write(dir); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "{{ .ResourceKind }}{{ .KindSuffix }}.json")
}

// command runs a tool and returns its combined output.
func command(name string, args ...string) (string, error) {
	stdout, stderr, err := command2(name, args...)
	return stdout + stderr, err
}

// command2 runs a tool and returns its standard output and error apart; an
// error carries both.
func command2(name string, args ...string) (string, string, error) {
	cmd := exec.Command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w\n%s%s", filepath.Base(name), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String(), err
}

// helmArgs are the arguments common to helm lint and helm template.
func helmArgs(chart string, files []string, set []string) []string {
	args := []string{chart, "--namespace", namespace, "--kube-version", kubeVersion}
	for _, f := range files {
		args = append(args, "--values", filepath.Join("examples", f))
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// render runs helm template and returns the manifest. Anything helm
// prints on its standard error (coalescing warnings, deprecations) is an
// error: the chart's own values must render cleanly.
func render(tk tools, chart string, files, set []string) (string, error) {
	stdout, stderr, err := command2(tk.helm, append([]string{"template", release}, helmArgs(chart, files, set)...)...)
	if err == nil && stderr != "" {
		err = fmt.Errorf("helm template warns:\n%s", stderr)
	}
	return stdout, err
}

// object is one rendered Kubernetes object.
type object struct {
	APIVersion string
	Kind       string
	Metadata   struct {
		Name, Namespace     string
		Labels, Annotations map[string]string
	}
	// doc is the whole object, for decoding into a kind's own shape.
	doc any
}

func (o object) id() string { return o.Kind + "/" + o.Metadata.Namespace + "/" + o.Metadata.Name }

// into decodes the object into v; encoding/json matches field names case
// insensitively, so v's fields need no tags.
func (o object) into(t *testing.T, v any) {
	t.Helper()
	data, err := json.Marshal(o.doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", o.id(), err)
	}
}

func parseObjects(t *testing.T, manifest string) map[string]object {
	t.Helper()
	out := map[string]object{}
	dec := yaml.NewDecoder(strings.NewReader(manifest))
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rendered YAML: %v", err)
		}
		if doc == nil {
			continue
		}
		o := object{doc: doc}
		o.into(t, &o)
		if _, dup := out[o.id()]; dup {
			t.Errorf("%s rendered twice", o.id())
		}
		out[o.id()] = o
	}
	return out
}

type labelSelector struct{ MatchLabels map[string]string }

type container struct {
	Name, Image, ImagePullPolicy string
	Args                         []string
	Env                          []struct {
		Name      string
		ValueFrom *struct {
			FieldRef *struct{ FieldPath string }
		}
	}
	Ports []struct {
		Name          string
		ContainerPort int
	}
	LivenessProbe, ReadinessProbe *struct {
		HTTPGet *struct {
			Path string
			Port any
		}
		TCPSocket *struct{ Port any }
	}
	SecurityContext struct {
		ReadOnlyRootFilesystem, AllowPrivilegeEscalation *bool
		Capabilities                                     struct{ Drop []string }
	}
	Resources struct {
		Requests map[string]any
	}
	VolumeMounts []mount
}

type mount struct {
	Name, MountPath string
	ReadOnly        bool
}

type volume struct {
	Name      string
	ConfigMap *struct{ Name string }
	EmptyDir  *struct{ Medium string }
	Secret    *struct {
		SecretName string
		Items      []struct{ Key, Path string }
	}
}

type deployment struct {
	Spec struct {
		Replicas int
		Selector labelSelector
		Template struct {
			Metadata struct{ Labels, Annotations map[string]string }
			Spec     struct {
				ServiceAccountName           string
				AutomountServiceAccountToken *bool
				SecurityContext              struct {
					RunAsNonRoot *bool
					RunAsUser    int
				}
				InitContainers, Containers []container
				Volumes                    []volume
			}
		}
	}
}

type service struct {
	Spec struct {
		ClusterIP string
		Selector  map[string]string
		Ports     []struct {
			Name       string
			Port       int
			TargetPort any
		}
	}
}

// valueSet is one way of installing the chart, and what it must render.
type valueSet struct {
	name  string
	files []string // under examples/
	set   []string // --set arguments after the files
	// objects are the Kind/namespace/name of every object rendered.
	objects []string
	// replicas, envoy and pd are what the Deployment and configuration must say.
	replicas int
	envoy    bool
	pd       bool
	// auth is how duet must authenticate Envoy (auth.mode), admin whether
	// its status page has a token.
	auth  string
	admin bool
	// external are the Secrets the pods mount that the user creates (the
	// chart renders the others, or cert-manager writes them).
	external []string
	// sync is the NATS URL duet's sync section must name ("": no sync
	// section), natsToken whether duet sends a token from a Secret, subject
	// the subject ("": the chart's default for the release).
	sync, subject string
	natsToken     bool
	// pools are the pools duet's configuration must hold, in order (none:
	// no pools section, pd says what the one pool is).
	pools []poolWant
	// tokenizerClaim is the PVC duet must mount read-only at
	// /models/tokenizer ("": no tokenizer volume).
	tokenizerClaim string
	// admissionClasses are the admission classes duet's configuration
	// must name, in order (nil: not checked).
	admissionClasses []string
	// otlp is duet's otlp section as it must be rendered (nil: none,
	// tracing off; checkTracing).
	otlp map[string]any
}

// defaultSubject is the chart's NATS subject for the release in namespace.
const defaultSubject = "duet." + namespace + "." + release

// The NATS of examples/nats.yaml, as the duet examples name it.
const (
	natsURL    = "nats://nats.duet.svc.cluster.local:4222"
	natsSecret = "duet-nats"
)

// The objects of the chart's default values, apart from its Secrets.
var defaultObjects = []string{
	"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
	"Service/duet-system/duet-envoy", "ServiceAccount/duet-system/duet",
	"Role/duet-system/duet-endpointslices", "RoleBinding/duet-system/duet-endpointslices",
	"NetworkPolicy/duet-system/duet", "PodDisruptionBudget/duet-system/duet",
}

var valueSets = []valueSet{
	{
		// Two Envoy + duet pairs that share nothing.
		name: "default", replicas: 2, envoy: true, pd: true, auth: "mtls", admin: true,
		objects: append(slices.Clone(defaultObjects),
			"Secret/duet-system/duet-tls", "Secret/duet-system/duet-envoy-tls", "Secret/duet-system/duet-admin-token"),
	},
	{
		// The model's tokenizer from the weights' PVC (docs/tokenizer.md).
		name: "tokenizer", replicas: 2, envoy: true, pd: true, auth: "mtls", admin: true,
		set: []string{"tokenizer.volume.persistentVolumeClaim.claimName=qwen3-weights", "tokenizer.volume.persistentVolumeClaim.readOnly=true",
			"config.tokenizer.file=/models/tokenizer/tokenizer.json", "config.tokenizer.config=/models/tokenizer/tokenizer_config.json",
			"config.tokenizer.page_size=64"},
		objects: append(slices.Clone(defaultObjects),
			"Secret/duet-system/duet-tls", "Secret/duet-system/duet-envoy-tls", "Secret/duet-system/duet-admin-token"),
		tokenizerClaim: "qwen3-weights",
	},
	{
		// The tokenizer and the engines' KV events (docs/kv-events.md),
		// with the ports of engines that do not advertise them.
		name: "kv-events", files: []string{"kv-events.yaml"}, replicas: 2, envoy: true, pd: true, auth: "mtls", admin: true,
		objects: []string{
			"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
			"Service/duet-system/duet-envoy", "ServiceAccount/duet-system/duet",
			"Role/inference/duet-endpointslices", "RoleBinding/inference/duet-endpointslices",
			"NetworkPolicy/duet-system/duet", "PodDisruptionBudget/duet-system/duet",
			"Secret/duet-system/duet-tls", "Secret/duet-system/duet-envoy-tls", "Secret/duet-system/duet-admin-token",
		},
		tokenizerClaim: "deepseek-v3-weights",
	},
	{
		// The admission queue: two priority classes, chosen by API key
		// (docs/configuration.md, "Admission").
		name: "admission", files: []string{"admission.yaml"}, replicas: 2, envoy: true, pd: true, auth: "mtls", admin: true,
		objects: append(slices.Clone(defaultObjects),
			"Secret/duet-system/duet-tls", "Secret/duet-system/duet-envoy-tls", "Secret/duet-system/duet-admin-token"),
		admissionClasses: []string{"interactive", "batch"},
	},
	{
		// Tracing: every Envoy traces 1 % of the requests and exports
		// its spans, duet its decisions, to a collector
		// (docs/tracing.md).
		name: "tracing", files: []string{"tracing.yaml"}, replicas: 2, envoy: true, pd: true, auth: "mtls", admin: true,
		objects: append(slices.Clone(defaultObjects),
			"Secret/duet-system/duet-tls", "Secret/duet-system/duet-envoy-tls", "Secret/duet-system/duet-admin-token"),
		otlp: map[string]any{"endpoint": "otel-collector.observability.svc.cluster.local:4317", "sampling_percent": 1,
			"service_name": "duet", "envoy_service_name": "duet-envoy"},
	},
	{
		name: "pd-discovery", files: []string{"pd-discovery.yaml"}, replicas: 2, envoy: true, pd: true, auth: "mtls", admin: true,
		sync: natsURL, natsToken: true, external: []string{natsSecret},
		objects: []string{
			"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
			"Service/duet-system/duet-envoy", "ServiceAccount/duet-system/duet",
			"Role/inference/duet-endpointslices", "RoleBinding/inference/duet-endpointslices",
			"PodDisruptionBudget/duet-system/duet", "ServiceMonitor/duet-system/duet", "NetworkPolicy/duet-system/duet",
			"Certificate/duet-system/duet-tls", "Certificate/duet-system/duet-envoy-tls", "Secret/duet-system/duet-admin-token",
		},
	},
	{
		name: "pd-static", files: []string{"pd-static.yaml"}, replicas: 2, envoy: true, pd: true, auth: "token", admin: true,
		objects: []string{
			"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
			"Service/duet-system/duet-envoy", "ServiceAccount/duet-system/duet", "NetworkPolicy/duet-system/duet",
			"PodDisruptionBudget/duet-system/duet", "Secret/duet-system/duet-token",
		},
		external: []string{"duet-admin"},
	},
	{
		name: "aggregated-static", files: []string{"aggregated-static.yaml"}, replicas: 2, auth: "mtls", admin: true,
		sync: natsURL, natsToken: true,
		objects: []string{
			"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
			"NetworkPolicy/duet-system/duet", "PodDisruptionBudget/duet-system/duet", "Secret/duet-system/duet-admin-token",
		},
		external: []string{"duet-server-tls", natsSecret},
	},
	{
		name: "aggregated-discovery", files: []string{"aggregated-discovery.yaml"}, replicas: 2, envoy: true, auth: "both", admin: true,
		objects: append(slices.Clone(defaultObjects),
			"Secret/duet-system/duet-tls", "Secret/duet-system/duet-envoy-tls", "Secret/duet-system/duet-admin-token"),
		external: []string{"duet-grpc-token"},
	},
	{
		name: "istio", files: []string{"istio.yaml"}, replicas: 2, pd: true, auth: "none", admin: true,
		sync: "nats://nats.inference.svc.cluster.local:4222", natsToken: true, external: []string{natsSecret},
		objects: []string{
			"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
			"ServiceAccount/duet-system/duet", "Role/duet-system/duet-endpointslices",
			"RoleBinding/duet-system/duet-endpointslices", "NetworkPolicy/duet-system/duet",
			"PodDisruptionBudget/duet-system/duet", "Secret/duet-system/duet-admin-token",
		},
		// The classes the tier claim of deploy/istio/admission names.
		admissionClasses: []string{"interactive", "batch"},
	},
	{
		// Two models, each pool discovered from its Services: a PD one
		// (SGLang) and an aggregated one (vLLM, its DP size given with
		// its Service); the pairs share through NATS.
		name: "two-pools", files: []string{"two-pools.yaml"}, replicas: 2, envoy: true, auth: "mtls", admin: true,
		sync: natsURL, natsToken: true, external: []string{natsSecret},
		pools: []poolWant{{name: "deepseek", pd: true, discovery: true}, {name: "qwen", discovery: true, decodeDP: 2}},
		objects: []string{
			"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
			"Service/duet-system/duet-envoy", "ServiceAccount/duet-system/duet",
			"Role/inference/duet-endpointslices", "RoleBinding/inference/duet-endpointslices",
			"NetworkPolicy/duet-system/duet", "PodDisruptionBudget/duet-system/duet",
			"Secret/duet-system/duet-tls", "Secret/duet-system/duet-envoy-tls", "Secret/duet-system/duet-admin-token",
		},
	},
	{
		// Two pools listed by URL, for a gateway outside the chart: no
		// Kubernetes API access at all.
		name: "static pools for a gateway", replicas: 1, auth: "token",
		pools: []poolWant{{name: "a", pd: true}, {name: "b"}},
		set: []string{"envoy.enabled=false", "replicaCount=1", "auth.mode=token", "auth.adminToken.enabled=false",
			"networkPolicy.enabled=false", "podDisruptionBudget.enabled=false",
			"pools[0].name=a", "pools[0].models={model-a}", "pools[0].prefill[0].url=http://a-prefill:30000", "pools[0].decode[0].url=http://a-decode:30000",
			"pools[1].name=b", "pools[1].models={model-b,model-b-2}", "pools[1].aliases={b}", "pools[1].decode[0].url=http://b:8000", "pools[1].decode[0].dp_size=2",
			"pools[1].policy.decode=least_tokens", "pools[1].clusters.decode=model_b"},
		objects: []string{
			"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
			"ServiceAccount/duet-system/duet", "Secret/duet-system/duet-token",
		},
	},
	{
		// One duet for a gateway outside the chart, which needs no NATS,
		// behind a headless Service too; the gateway sends a generated
		// token; no status page token, no NetworkPolicy, no budget. The
		// gateway traces; duet's spans join its traces, under a service
		// name of its own. The Envoy-only values (unused: no Envoy
		// beside duet) pass through, a sampling of 0 kept, an empty
		// Envoy service name left to duet's default.
		name: "token for a gateway", replicas: 1, pd: true, auth: "token",
		set: []string{"envoy.enabled=false", "replicaCount=1", "service.headless=true", "auth.mode=token",
			"auth.adminToken.enabled=false", "networkPolicy.enabled=false", "podDisruptionBudget.enabled=false",
			"otlp.enabled=true", "otlp.endpoint=jaeger-collector.observability:4317", "otlp.envoyEndpoint=10.0.0.9:4317",
			"otlp.samplingPercent=0", "otlp.serviceName=duet-inference", "otlp.envoyServiceName="},
		otlp: map[string]any{"endpoint": "jaeger-collector.observability:4317", "envoy_endpoint": "10.0.0.9:4317",
			"sampling_percent": 0, "service_name": "duet-inference"},
		objects: []string{
			"ConfigMap/duet-system/duet", "Deployment/duet-system/duet", "Service/duet-system/duet",
			"Service/duet-system/duet-headless", "ServiceAccount/duet-system/duet", "Role/duet-system/duet-endpointslices",
			"RoleBinding/duet-system/duet-endpointslices", "Secret/duet-system/duet-token",
		},
	},
	{
		// Names of one's own: the server name Envoy verifies, the one
		// client name duet admits.
		name: "mtls with other names", replicas: 2, envoy: true, pd: true, auth: "mtls",
		set:     []string{"auth.tls.serverName=duet-grpc.internal", "auth.tls.clientNames={gateway}", "auth.adminToken.enabled=false"},
		objects: append(slices.Clone(defaultObjects), "Secret/duet-system/duet-tls", "Secret/duet-system/duet-envoy-tls"),
	},
	{
		// duet beside its Envoy without credentials: its gRPC port is on
		// loopback. Three pairs share through a NATS that asks for no
		// token, on a subject of their own.
		name: "no auth beside envoy", replicas: 3, envoy: true, pd: true, auth: "none",
		sync: "nats://nats.shared:4222", subject: "duet.pairs",
		set: []string{"auth.mode=none", "auth.adminToken.enabled=false", "replicaCount=3",
			"sync.nats.url=nats://nats.shared:4222", "sync.nats.unauthenticated=true", "sync.subject=duet.pairs"},
		objects: slices.Clone(defaultObjects),
	},
}

// TestChart lints and renders the chart for every value set and checks what
// it renders: the Kubernetes schemas (kubeconform), how the objects refer to
// each other, duet's configuration (loaded by duet) and Envoy's bootstrap
// (rendered by duet as the init container does, validated by Envoy).
func TestChart(t *testing.T) {
	tk := findTools(t)
	schemas := writeSchemas(t, tk)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			if out, err := command(tk.helm, append([]string{"lint", "--strict"}, helmArgs(chartDir, vs.files, vs.set)...)...); err != nil {
				t.Fatal(err)
			} else if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
			manifest, err := render(tk, chartDir, vs.files, vs.set)
			if err != nil {
				t.Fatal(err)
			}
			t.Run("kubeconform", func(t *testing.T) {
				if out, err := kubeconform(t, tk, schemas, manifest); err != nil {
					t.Fatal(err)
				} else if want := fmt.Sprintf("Valid: %d,", len(vs.objects)); !strings.Contains(out, want) {
					t.Fatalf("kubeconform summary lacks %q:\n%s", want, out)
				}
			})
			objs := parseObjects(t, manifest)
			if got := slices.Sorted(maps.Keys(objs)); !slices.Equal(got, slices.Sorted(slices.Values(vs.objects))) {
				t.Fatalf("objects = %v\nwant      %v", got, vs.objects)
			}
			t.Run("objects", func(t *testing.T) { checkObjects(t, vs, objs) })
			t.Run("tokenizer", func(t *testing.T) { checkTokenizer(t, vs, manifest, objs) })
			t.Run("kv events", func(t *testing.T) { checkKVEvents(t, vs, objs) })
			t.Run("admission", func(t *testing.T) { checkAdmission(t, vs, objs) })
			t.Run("auth", func(t *testing.T) { checkAuth(t, vs, objs) })
			t.Run("sync", func(t *testing.T) { checkSync(t, vs, objs) })
			t.Run("tracing", func(t *testing.T) { checkTracing(t, vs, objs) })
			t.Run("duet and envoy", func(t *testing.T) { checkDuetAndEnvoy(t, tk, vs, objs) })
		})
	}
	t.Run("engine example", func(t *testing.T) { testEngineExample(t, tk, schemas) })
	t.Run("two-pools engines", func(t *testing.T) { testPoolsEngineExample(t, tk, schemas) })
	t.Run("engines' KV events", func(t *testing.T) { testEngineEventsExample(t, tk, schemas) })
	t.Run("nats example", func(t *testing.T) { testNATSExample(t, tk, schemas) })
	t.Run("notes", func(t *testing.T) { testNotes(t, tk) })
	t.Run("broken templates fail", func(t *testing.T) { testBrokenTemplates(t, tk, schemas) })
	t.Run("invalid values fail", func(t *testing.T) { testInvalidValues(t, tk) })
	t.Run("config change rolls pods", func(t *testing.T) { testChecksum(t, tk) })
}

// kubeconform validates a manifest strictly against the generated schemas;
// a kind without a schema is an error.
func kubeconform(t *testing.T, tk tools, schemas, manifest string) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return command(tk.kubeconform, "-strict", "-summary", "-schema-location", schemas, path)
}

// checkObjects checks how the rendered objects fit together.
func checkObjects(t *testing.T, vs valueSet, objs map[string]object) {
	var dep deployment
	objs["Deployment/duet-system/duet"].into(t, &dep)
	pod := dep.Spec.Template
	if dep.Spec.Replicas != vs.replicas {
		t.Errorf("replicas = %d, want %d", dep.Spec.Replicas, vs.replicas)
	}
	if len(dep.Spec.Selector.MatchLabels) == 0 || !subset(dep.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("selector %v does not select the pod labels %v", dep.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}
	if len(pod.Metadata.Annotations["checksum/config"]) != 64 {
		t.Errorf("pod annotation checksum/config = %q, want a sha256", pod.Metadata.Annotations["checksum/config"])
	}
	if sc := pod.Spec.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want runAsNonRoot and a non-zero user", sc)
	}
	discovery := objs["Role/"+engineNamespace(objs)+"/duet-endpointslices"].Kind != ""
	if tok := pod.Spec.AutomountServiceAccountToken; tok == nil || *tok != discovery {
		t.Errorf("automountServiceAccountToken = %v, want %v (only discovery talks to the API)", tok, discovery)
	}
	var names []string
	ports := map[string]int{}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		names = append(names, c.Name)
		sc := c.SecurityContext
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			!slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
			t.Errorf("container %s security context %+v: want a read-only root, no privilege escalation, every capability dropped", c.Name, sc)
		}
		if c.Resources.Requests["cpu"] == nil || c.Resources.Requests["memory"] == nil {
			t.Errorf("container %s requests %v: want cpu and memory", c.Name, c.Resources.Requests)
		}
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
		for _, m := range c.VolumeMounts {
			if !slices.ContainsFunc(pod.Spec.Volumes, func(v volume) bool { return v.Name == m.Name }) {
				t.Errorf("container %s mounts the undefined volume %s", c.Name, m.Name)
			}
		}
	}
	wantNames := []string{"duet"}
	if vs.envoy {
		wantNames = []string{"envoy-config", "duet", "envoy"}
	}
	if !slices.Equal(names, wantNames) {
		t.Errorf("containers = %v, want %v", names, wantNames)
	}
	// Beside its Envoy, duet's gRPC port is on loopback: no pod port, no
	// Service port.
	if _, grpc := ports["grpc"]; grpc == vs.envoy {
		t.Errorf("container port grpc declared = %v, want %v (gRPC beyond the pod only without Envoy)", grpc, !vs.envoy)
	}
	duet := pod.Spec.Containers[0]
	for _, p := range []struct {
		name  string
		probe *struct {
			HTTPGet *struct {
				Path string
				Port any
			}
			TCPSocket *struct{ Port any }
		}
		path string
	}{{"liveness", duet.LivenessProbe, "/healthz"}, {"readiness", duet.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != "admin" {
			t.Errorf("duet %s probe: want GET %s on the admin port", p.name, p.path)
		}
	}
	if cm := pod.Spec.Volumes[0].ConfigMap; cm == nil || objs["ConfigMap/duet-system/"+cm.Name].Kind == "" {
		t.Errorf("the config volume does not name the chart's ConfigMap")
	}
	// Services select the pods and name container ports.
	for _, id := range []string{"Service/duet-system/duet", "Service/duet-system/duet-envoy", "Service/duet-system/duet-headless"} {
		o, ok := objs[id]
		if !ok {
			continue
		}
		var svc service
		o.into(t, &svc)
		// The headless Service gives a gateway of one's own every replica:
		// no virtual IP, duet's gRPC port alone.
		if id == "Service/duet-system/duet-headless" && (svc.Spec.ClusterIP != "None" || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "grpc") {
			t.Errorf("%s: clusterIP %q, ports %+v; want a headless Service of the grpc port", id, svc.Spec.ClusterIP, svc.Spec.Ports)
		}
		if id == "Service/duet-system/duet" && slices.ContainsFunc(svc.Spec.Ports, func(p struct {
			Name       string
			Port       int
			TargetPort any
		}) bool {
			return p.Name == "grpc"
		}) == vs.envoy {
			t.Errorf("%s: a grpc port = %v, want %v", id, vs.envoy, !vs.envoy)
		}
		if !subset(svc.Spec.Selector, pod.Metadata.Labels) || len(svc.Spec.Selector) == 0 {
			t.Errorf("%s selector %v does not select the pods %v", id, svc.Spec.Selector, pod.Metadata.Labels)
		}
		for _, p := range svc.Spec.Ports {
			if name, _ := p.TargetPort.(string); ports[name] == 0 {
				t.Errorf("%s port %s targets %v, which no container names", id, p.Name, p.TargetPort)
			}
		}
	}
	checkRBAC(t, objs, dep)
	if o, ok := objs["ServiceMonitor/duet-system/duet"]; ok {
		var sm struct {
			Spec struct {
				Selector          labelSelector
				NamespaceSelector struct{ MatchNames []string }
				Endpoints         []struct{ Port, Path string }
			}
		}
		o.into(t, &sm)
		if !subset(sm.Spec.Selector.MatchLabels, objs["Service/duet-system/duet"].Metadata.Labels) ||
			!slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
			t.Errorf("ServiceMonitor selects %v in %v, not duet's Service", sm.Spec.Selector.MatchLabels, sm.Spec.NamespaceSelector.MatchNames)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor endpoints = %+v, want /metrics on admin", sm.Spec.Endpoints)
		}
	}
	if o, ok := objs["PodDisruptionBudget/duet-system/duet"]; ok {
		var pdb struct {
			Spec struct {
				Selector                     labelSelector
				MinAvailable, MaxUnavailable any
			}
		}
		o.into(t, &pdb)
		if !subset(pdb.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
			t.Errorf("PodDisruptionBudget selects %v, not the pods", pdb.Spec.Selector.MatchLabels)
		}
		// A drain may take one replica, never every one.
		if down := disruptionsAllowed(t, pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable, vs.replicas); down < 1 || (vs.replicas > 1 && down >= vs.replicas) {
			t.Errorf("PodDisruptionBudget (minAvailable %v, maxUnavailable %v) lets %d of %d pods go at once; want at least one and not all",
				pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable, down, vs.replicas)
		}
	} else if vs.replicas > 1 {
		t.Errorf("%d replicas without a PodDisruptionBudget: a drain may take them all at once", vs.replicas)
	}
}

// disruptionsAllowed is how many of n healthy pods a PodDisruptionBudget
// lets a voluntary disruption take at once, as Kubernetes counts
// (percentages of minAvailable and maxUnavailable round up).
func disruptionsAllowed(t *testing.T, minAvailable, maxUnavailable any, n int) int {
	t.Helper()
	count := func(v any) int {
		switch v := v.(type) {
		case float64:
			return int(v)
		case string:
			pct, err := strconv.Atoi(strings.TrimSuffix(v, "%"))
			if err != nil || !strings.HasSuffix(v, "%") {
				t.Fatalf("PodDisruptionBudget value %q", v)
			}
			return (pct*n + 99) / 100
		}
		t.Fatalf("PodDisruptionBudget value %v (%T)", v, v)
		return 0
	}
	if minAvailable != nil {
		return max(n-count(minAvailable), 0)
	}
	return min(count(maxUnavailable), n)
}

// engineNamespace is where the value set's Role must be: the engines'
// namespace from the rendered duet configuration.
func engineNamespace(objs map[string]object) string {
	cfg := duetConfig(objs)
	if k, ok := cfg["kubernetes"].(map[string]any); ok {
		ns, _ := k["namespace"].(string)
		return ns
	}
	return ""
}

func duetConfig(objs map[string]object) map[string]any {
	var cm struct{ Data map[string]string }
	data, _ := json.Marshal(objs["ConfigMap/duet-system/duet"].doc)
	_ = json.Unmarshal(data, &cm)
	var cfg map[string]any
	_ = yaml.Unmarshal([]byte(cm.Data["duet.yaml"]), &cfg)
	return cfg
}

// checkRBAC: with discovery, exactly the contract's permissions, in the
// engines' namespace, for duet's service account; none without.
func checkRBAC(t *testing.T, objs map[string]object, dep deployment) {
	ns := engineNamespace(objs)
	role, ok := objs["Role/"+ns+"/duet-endpointslices"]
	if ns == "" {
		for id := range objs {
			if strings.HasPrefix(id, "Role") {
				t.Errorf("%s rendered without Kubernetes discovery", id)
			}
		}
		return
	}
	if !ok {
		t.Fatalf("no Role in the engines' namespace %s", ns)
	}
	var r struct {
		Rules []struct{ APIGroups, Resources, Verbs, ResourceNames, NonResourceURLs []string }
	}
	role.into(t, &r)
	if len(r.Rules) != 1 || !slices.Equal(r.Rules[0].APIGroups, []string{"discovery.k8s.io"}) ||
		!slices.Equal(r.Rules[0].Resources, []string{"endpointslices"}) || !slices.Equal(r.Rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("Role rules = %+v, want get, list, watch on discovery.k8s.io endpointslices alone", r.Rules)
	}
	var rb struct {
		RoleRef  struct{ APIGroup, Kind, Name string }
		Subjects []struct{ Kind, Name, Namespace string }
	}
	objs["RoleBinding/"+ns+"/duet-endpointslices"].into(t, &rb)
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Metadata.Name {
		t.Errorf("RoleBinding refers to %+v, not the Role %s", rb.RoleRef, role.Metadata.Name)
	}
	sa := dep.Spec.Template.Spec.ServiceAccountName
	if len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != sa || rb.Subjects[0].Namespace != namespace {
		t.Errorf("RoleBinding subjects = %+v, want the pods' service account %s/%s", rb.Subjects, namespace, sa)
	}
}

func subset(sub, of map[string]string) bool {
	for k, v := range sub {
		if w, ok := of[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// authConfig is duet's auth section and Envoy's side of it, as rendered.
type authConfig struct {
	Listen struct{ GRPC string }
	Auth   struct {
		TLS *struct {
			CertFile     string   `yaml:"cert_file"`
			KeyFile      string   `yaml:"key_file"`
			ClientCAFile string   `yaml:"client_ca_file"`
			ClientNames  []string `yaml:"client_names"`
		}
		TokenFile       string `yaml:"token_file"`
		Unauthenticated bool
		AdminTokenFile  string `yaml:"admin_token_file"`
	}
	Envoy struct {
		DuetTLS *struct {
			CertFile   string `yaml:"cert_file"`
			KeyFile    string `yaml:"key_file"`
			CAFile     string `yaml:"ca_file"`
			ServerName string `yaml:"server_name"`
		} `yaml:"duet_tls"`
	}
}

func parseAuthConfig(t *testing.T, data string) authConfig {
	t.Helper()
	var cfg authConfig
	if err := yaml.Unmarshal([]byte(data), &cfg); err != nil {
		t.Fatalf("duet.yaml: %v", err)
	}
	return cfg
}

// certificate is a cert-manager Certificate.
type certificate struct {
	Spec struct {
		SecretName, CommonName string
		DNSNames               []string
		Usages                 []string
		IssuerRef              struct{ Name, Kind, Group string }
	}
}

// networkPolicy is a NetworkPolicy, its ports by name.
type networkPolicy struct {
	Spec struct {
		PodSelector labelSelector
		PolicyTypes []string
		Ingress     []struct {
			Ports []struct {
				Port     any
				Protocol string
			}
			From []map[string]any
		}
	}
}

// checkAuth checks how duet authenticates its callers: the auth section
// against the value set's mode, where duet listens, that every Secret the
// pod mounts is rendered, written by a rendered Certificate or named as the
// user's (once each), what the Certificates ask for, and that the
// NetworkPolicy admits only what each port is for.
func checkAuth(t *testing.T, vs valueSet, objs map[string]object) {
	var cm struct{ Data map[string]string }
	objs["ConfigMap/duet-system/duet"].into(t, &cm)
	cfg := parseAuthConfig(t, cm.Data["duet.yaml"])
	a := cfg.Auth
	host, _, err := net.SplitHostPort(cfg.Listen.GRPC)
	if err != nil || (host == "127.0.0.1") != vs.envoy {
		t.Errorf("listen.grpc %q: want 127.0.0.1 exactly when Envoy is beside duet (%v)", cfg.Listen.GRPC, vs.envoy)
	}
	wantTLS, wantToken := vs.auth == "mtls" || vs.auth == "both", vs.auth == "token" || vs.auth == "both"
	if got := (a.TLS != nil); got != wantTLS || (cfg.Envoy.DuetTLS != nil) != wantTLS {
		t.Errorf("auth.tls set %v, envoy.duet_tls set %v; want both %v (auth mode %s)", got, cfg.Envoy.DuetTLS != nil, wantTLS, vs.auth)
	}
	if got := a.TokenFile != ""; got != wantToken {
		t.Errorf("auth.token_file set %v, want %v (auth mode %s)", got, wantToken, vs.auth)
	}
	if want := vs.auth == "none" && !vs.envoy; a.Unauthenticated != want {
		t.Errorf("auth.unauthenticated %v, want %v (only with mode none beyond loopback)", a.Unauthenticated, want)
	}
	if got := a.AdminTokenFile != ""; got != vs.admin {
		t.Errorf("auth.admin_token_file set %v, want %v", got, vs.admin)
	}

	var dep deployment
	objs["Deployment/duet-system/duet"].into(t, &dep)
	pod := dep.Spec.Template
	certs := map[string]certificate{} // by secretName
	for _, o := range objs {
		if o.Kind == "Certificate" {
			var c certificate
			o.into(t, &c)
			certs[c.Spec.SecretName] = c
		}
	}
	mounted := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.Name == "envoy-config" && wantToken && (v.EmptyDir == nil || v.EmptyDir.Medium != "Memory") {
			t.Errorf("volume envoy-config holds the token in Envoy's bootstrap: want an emptyDir in memory, got %+v", v.EmptyDir)
		}
		if v.Secret == nil {
			continue
		}
		name := v.Secret.SecretName
		mounted[name] = true
		secret, rendered := objs["Secret/duet-system/"+name]
		_, issued := certs[name]
		if n := btoi(rendered) + btoi(issued) + btoi(slices.Contains(vs.external, name)); n != 1 {
			t.Errorf("volume %s mounts Secret %s: rendered %v, by a Certificate %v, the user's %v; want exactly one",
				v.Name, name, rendered, issued, slices.Contains(vs.external, name))
		}
		if rendered {
			var sec struct{ Data map[string]string }
			secret.into(t, &sec)
			for _, it := range v.Secret.Items {
				if sec.Data[it.Key] == "" {
					t.Errorf("volume %s wants key %s, which Secret %s lacks", v.Name, it.Key, name)
				}
			}
		}
	}
	for _, name := range vs.external {
		if !mounted[name] {
			t.Errorf("the user's Secret %s is mounted nowhere", name)
		}
	}
	for name, c := range certs {
		if !mounted[name] && !(name == "duet-envoy-tls" && !vs.envoy) {
			t.Errorf("Certificate for Secret %s: no pod mounts it", name)
		}
		if c.Spec.IssuerRef.Name == "" || c.Spec.IssuerRef.Kind == "" {
			t.Errorf("Certificate for %s: issuerRef %+v", name, c.Spec.IssuerRef)
		}
		names := append([]string{c.Spec.CommonName}, c.Spec.DNSNames...)
		switch {
		case slices.Contains(c.Spec.Usages, "server auth"):
			for _, want := range []string{cfg.Envoy.DuetTLS.ServerName, "duet.duet-system.svc"} {
				if !slices.Contains(c.Spec.DNSNames, want) {
					t.Errorf("duet's Certificate names %v, not %s", c.Spec.DNSNames, want)
				}
			}
		case slices.Contains(c.Spec.Usages, "client auth"):
			if len(a.TLS.ClientNames) > 0 && !slices.ContainsFunc(names, func(n string) bool { return slices.Contains(a.TLS.ClientNames, n) }) {
				t.Errorf("Envoy's Certificate names %v, none of which duet admits (%v)", names, a.TLS.ClientNames)
			}
		default:
			t.Errorf("Certificate for %s: usages %v name neither server auth nor client auth", name, c.Spec.Usages)
		}
	}

	o, ok := objs["NetworkPolicy/duet-system/duet"]
	if !ok {
		return
	}
	var np networkPolicy
	o.into(t, &np)
	// Ingress alone: duet's pods dial the engines (HTTP, and their KV
	// event ports, which /server_info names), NATS and the API server, so
	// the policy must restrict no egress.
	if !subset(np.Spec.PodSelector.MatchLabels, pod.Metadata.Labels) || len(np.Spec.PodSelector.MatchLabels) == 0 ||
		!slices.Equal(np.Spec.PolicyTypes, []string{"Ingress"}) {
		t.Errorf("NetworkPolicy selects %v (%v), want duet's pods, Ingress only", np.Spec.PodSelector.MatchLabels, np.Spec.PolicyTypes)
	}
	ports := map[string]bool{}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			ports[p.Name] = true
		}
	}
	open := map[string][]map[string]any{} // port name -> sources (nil: any)
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			name, named := p.Port.(string)
			if !named {
				continue // a number: networkPolicy.extraIngress
			}
			if !ports[name] {
				t.Errorf("NetworkPolicy opens port %v, which no container names", p.Port)
			}
			open[name] = rule.From
		}
	}
	want := []string{"admin", "grpc"}
	if vs.envoy {
		want = []string{"admin", "http"}
	}
	if got := slices.Sorted(maps.Keys(open)); !slices.Equal(got, want) {
		t.Errorf("NetworkPolicy opens %v, want %v", got, want)
	}
	if from, ok := open["grpc"]; ok && len(from) == 0 {
		t.Error("NetworkPolicy opens duet's gRPC port to any source, want the gateway's pods")
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkDuetAndEnvoy runs what the pod runs, on the rendered files: duet
// loads the configuration, the init container's command renders Envoy's
// bootstrap, and Envoy validates it. Every volume is a directory here: the
// ConfigMap's holds its data, a Secret's the rendered Secret's data or, for
// a Secret the chart does not render (the user's, cert-manager's), files
// `duet certs` makes. Paths in the configuration and the bootstrap are the
// containers' own, mapped onto those directories through each container's
// mounts, so a file that a container does not mount is not found.
func checkDuetAndEnvoy(t *testing.T, tk tools, vs valueSet, objs map[string]object) {
	var cm struct{ Data map[string]string }
	objs["ConfigMap/duet-system/duet"].into(t, &cm)
	var dep deployment
	objs["Deployment/duet-system/duet"].into(t, &dep)
	pod := dep.Spec.Template.Spec
	dirs := map[string]string{}
	var made string // `duet certs` output, made on first need
	for _, v := range pod.Volumes {
		dirs[v.Name] = t.TempDir()
		if v.Secret != nil {
			if objs["Secret/duet-system/"+v.Secret.SecretName].Kind == "" && made == "" {
				made = t.TempDir()
				if _, err := command(tk.duet, "certs", "-out", made); err != nil {
					t.Fatal(err)
				}
			}
			writeSecret(t, v, objs, made, dirs[v.Name])
		}
	}
	// local maps a container's paths in text onto the directories.
	local := func(c container, text string) string {
		mounts := slices.Clone(c.VolumeMounts)
		slices.SortFunc(mounts, func(a, b mount) int { return len(b.MountPath) - len(a.MountPath) })
		var pairs []string
		for _, m := range mounts {
			pairs = append(pairs, m.MountPath+"/", dirs[m.Name]+"/")
		}
		return strings.NewReplacer(pairs...).Replace(text)
	}
	localArgs := func(c container, args []string) []string {
		out := slices.Clone(args)
		for i, a := range out {
			out[i] = local(c, a)
		}
		return out
	}
	duet := pod.Containers[0]
	if !slices.Equal(duet.Args[:2], []string{"serve", "-config"}) {
		t.Fatalf("duet args = %v, want serve -config <file>", duet.Args)
	}
	// The ConfigMap's files, with duet's paths made local.
	for _, v := range pod.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		for name, data := range cm.Data {
			if err := os.WriteFile(filepath.Join(dirs[v.Name], name), []byte(local(duet, data)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	// envoy-config loads and validates the file exactly as serve does.
	cfgPath := localArgs(duet, duet.Args)[2]
	if _, err := command(tk.duet, "envoy-config", "-config", cfgPath); err != nil {
		t.Fatalf("duet rejects the rendered configuration: %v", err)
	}
	cfg := duetConfig(objs)
	if len(vs.pools) > 0 {
		checkPoolsConfig(t, vs, cfg)
	} else if _, isPD := cfg["prefill"]; isPD != vs.pd && cfg["kubernetes"] == nil {
		t.Errorf("static prefill list present = %v, want %v", isPD, vs.pd)
	}
	if k, ok := cfg["kubernetes"].(map[string]any); ok && len(vs.pools) == 0 {
		if _, isPD := k["prefill"]; isPD != vs.pd {
			t.Errorf("kubernetes.prefill present = %v, want %v", isPD, vs.pd)
		}
	}
	// Every file duet's auth section names is where duet mounts it.
	auth := parseAuthConfig(t, cm.Data["duet.yaml"])
	duetFiles := []string{auth.Auth.TokenFile, auth.Auth.AdminTokenFile}
	if s := parseSyncConfig(t, cm.Data["duet.yaml"]).Sync; s != nil {
		duetFiles = append(duetFiles, s.NATS.TokenFile)
	}
	if tls := auth.Auth.TLS; tls != nil {
		duetFiles = append(duetFiles, tls.CertFile, tls.KeyFile, tls.ClientCAFile)
	}
	for _, f := range duetFiles {
		if f == "" {
			continue
		}
		if _, err := os.Stat(local(duet, f)); err != nil {
			t.Errorf("duet's configuration names %s, which duet does not mount: %v", f, err)
		}
	}
	if !vs.envoy {
		// The gateway's credentials, where the chart makes them.
		if auth.Auth.TLS != nil && objs["Secret/duet-system/duet-envoy-tls"].Kind != "" {
			client := t.TempDir()
			for _, key := range []string{"tls.crt", "tls.key", "ca.crt"} {
				writeFile(t, filepath.Join(client, key), secretData(t, objs, "duet-envoy-tls", key))
			}
			a := auth.Auth.TLS
			checkHandshake(t, local(duet, a.CertFile), local(duet, a.KeyFile), local(duet, a.ClientCAFile), a.ClientNames,
				filepath.Join(client, "tls.crt"), filepath.Join(client, "tls.key"), filepath.Join(client, "ca.crt"), auth.Envoy.DuetTLS.ServerName)
		}
		return
	}
	init := pod.InitContainers[0]
	if init.Image != duet.Image {
		t.Errorf("the init container runs %s, not duet's image %s", init.Image, duet.Image)
	}
	// The init container reads the token where duet does (it writes it into
	// the bootstrap).
	if f := auth.Auth.TokenFile; f != "" && local(init, f) != local(duet, f) {
		t.Errorf("the init container does not mount the token file %s as duet does", f)
	}
	if _, err := command(tk.duet, localArgs(init, init.Args)...); err != nil {
		t.Fatalf("the init container's command fails: %v", err)
	}
	envoy := pod.Containers[1]
	args := localArgs(envoy, envoy.Args)
	i := slices.Index(args, "-c")
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("envoy args %v name no bootstrap", envoy.Args)
	}
	raw, err := os.ReadFile(args[i+1])
	if err != nil {
		t.Fatalf("envoy's bootstrap is not where the init container wrote it: %v", err)
	}
	bootstrap := string(raw)
	if !strings.Contains(bootstrap, fmt.Sprintf("port_value: %d", envoy.Ports[0].ContainerPort)) {
		t.Errorf("bootstrap lacks Envoy's listener port %d", envoy.Ports[0].ContainerPort)
	}
	checkTracingBootstrap(t, vs, bootstrap)
	if len(vs.pools) > 0 {
		checkPoolsBootstrap(t, vs, cfg, bootstrap)
	} else if !strings.Contains(bootstrap, "duet_decode") {
		t.Error("bootstrap lacks the cluster duet_decode")
	}
	// With discovery, Envoy resolves the headless Services.
	if k, ok := cfg["kubernetes"].(map[string]any); ok && len(vs.pools) == 0 {
		for _, role := range []string{"prefill", "decode"} {
			pool, ok := k[role].(map[string]any)
			if !ok {
				continue
			}
			host := fmt.Sprintf("%s.%s.svc.cluster.local", pool["service"], k["namespace"])
			if !strings.Contains(bootstrap, host) {
				t.Errorf("bootstrap does not resolve the %s Service %s", role, host)
			}
		}
	}
	if len(vs.pools) == 0 && strings.Contains(bootstrap, "duet_prefill") != vs.pd {
		t.Errorf("bootstrap has a prefill cluster = %v, want %v", !vs.pd, vs.pd)
	}
	// Envoy's side of auth: its client certificate (mounted), the token.
	if got, want := strings.Contains(bootstrap, "envoy.transport_sockets.tls"), auth.Auth.TLS != nil; got != want {
		t.Errorf("bootstrap has a TLS transport socket = %v, want %v", got, want)
	}
	if got, want := strings.Contains(bootstrap, "Bearer "), auth.Auth.TokenFile != ""; got != want {
		t.Errorf("bootstrap sends a bearer token = %v, want %v", got, want)
	}
	if e := auth.Envoy.DuetTLS; e != nil {
		for _, f := range []string{e.CertFile, e.KeyFile, e.CAFile} {
			if _, err := os.Stat(local(envoy, f)); err != nil {
				t.Errorf("Envoy's client certificate file %s is not mounted in the envoy container: %v", f, err)
			}
		}
		a := auth.Auth.TLS
		checkHandshake(t, local(duet, a.CertFile), local(duet, a.KeyFile), local(duet, a.ClientCAFile), a.ClientNames,
			local(envoy, e.CertFile), local(envoy, e.KeyFile), local(envoy, e.CAFile), e.ServerName)
	}
	// Envoy loads the files it names: validate the bootstrap with Envoy's
	// paths made local.
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	writeFile(t, path, []byte(local(envoy, bootstrap)))
	args[i+1] = path
	if out, err := command(tk.envoy, append([]string{"--mode", "validate"}, args...)...); err != nil {
		t.Fatalf("envoy rejects the bootstrap: %v", err)
	} else if !strings.Contains(out, "OK") {
		t.Fatalf("envoy --mode validate:\n%s", out)
	}
}

// writeSecret fills dir with what the Secret volume v holds in a pod: the
// rendered Secret's data or, for a Secret the chart does not render, the
// file of made (`duet certs` output) that the volume's role calls for.
func writeSecret(t *testing.T, v volume, objs map[string]object, made, dir string) {
	t.Helper()
	name := v.Secret.SecretName
	rendered := objs["Secret/duet-system/"+name].Kind != ""
	// The `duet certs` file for each key, by the chart's volume names.
	files := map[string]map[string]string{
		"duet-tls":    {"tls.crt": "duet.crt", "tls.key": "duet.key", "ca.crt": "ca.crt"},
		"envoy-tls":   {"tls.crt": "envoy.crt", "tls.key": "envoy.key", "ca.crt": "ca.crt"},
		"token":       {"token": "token"},
		"admin-token": {"token": "admin-token"},
		"nats-token":  {"token": "token"},
	}[v.Name]
	if len(v.Secret.Items) == 0 {
		t.Errorf("volume %s mounts every key of Secret %s: list the keys (items), so that a missing one stops the pod", v.Name, name)
	}
	for _, it := range v.Secret.Items {
		var data []byte
		if rendered {
			data = secretData(t, objs, name, it.Key)
		} else if f, ok := files[it.Key]; ok {
			var err error
			if data, err = os.ReadFile(filepath.Join(made, f)); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Fatalf("volume %s: no stand-in for key %s of the user's Secret %s", v.Name, it.Key, name)
		}
		writeFile(t, filepath.Join(dir, it.Path), data)
	}
}

// secretData returns the decoded value of key in the rendered Secret name.
func secretData(t *testing.T, objs map[string]object, name, key string) []byte {
	t.Helper()
	var sec struct{ Data map[string]string }
	objs["Secret/duet-system/"+name].into(t, &sec)
	data, err := base64.StdEncoding.DecodeString(sec.Data[key])
	if err != nil || len(data) == 0 {
		t.Fatalf("Secret %s, key %s: %q (%v)", name, key, sec.Data[key], err)
	}
	return data
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkHandshake runs a mutual TLS handshake over loopback between duet's
// side (its certificate, the CA it requires of clients, the client names it
// admits) and Envoy's (its client certificate, the CA it trusts, the name
// it verifies), as duet's configuration and the bootstrap set them up.
func checkHandshake(t *testing.T, cert, key, clientCA string, clientNames []string, clientCert, clientKey, ca, serverName string) {
	t.Helper()
	pair := func(cert, key string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatalf("%s, %s: %v", cert, key, err)
		}
		return c
	}
	pool := func(path string) *x509.CertPool {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(data) {
			t.Fatalf("%s holds no certificate", path)
		}
		return p
	}
	server := &tls.Config{Certificates: []tls.Certificate{pair(cert, key)}, ClientCAs: pool(clientCA), ClientAuth: tls.RequireAndVerifyClientCert}
	client := &tls.Config{Certificates: []tls.Certificate{pair(clientCert, clientKey)}, RootCAs: pool(ca), ServerName: serverName}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		peer *x509.Certificate
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer conn.Close()
		s := tls.Server(conn, server)
		if err := s.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		done <- result{peer: s.ConnectionState().PeerCertificates[0]}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err != nil {
		t.Fatalf("Envoy's side of the handshake (server name %s): %v", serverName, err)
	}
	defer conn.Close()
	r := <-done
	if r.err != nil {
		t.Fatalf("duet's side of the handshake: %v", r.err)
	}
	if len(clientNames) > 0 && !slices.Contains(clientNames, r.peer.Subject.CommonName) &&
		!slices.ContainsFunc(r.peer.DNSNames, func(n string) bool { return slices.Contains(clientNames, n) }) {
		t.Errorf("Envoy's certificate (%s, %v) has none of the names duet admits (%v)", r.peer.Subject.CommonName, r.peer.DNSNames, clientNames)
	}
}

// testEngineExample: examples/engines.yaml, the engine side of the default
// values, is valid and has what the chart's default values name: headless
// Services in their namespace with the http (and, for prefill, bootstrap)
// ports, selecting the engines' pods.
func testEngineExample(t *testing.T, tk tools, schemas string) {
	data, err := os.ReadFile(filepath.Join("examples", "engines.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kubeconform(t, tk, schemas, string(data)); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(out, "Valid: 4,") {
		t.Fatalf("kubeconform summary:\n%s", out)
	}
	var values struct {
		Engines struct {
			Kubernetes struct {
				Namespace       string
				Prefill, Decode struct{ Service, Port string }
			}
		}
	}
	raw, err := os.ReadFile(filepath.Join("examples", "pd-discovery.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	k := values.Engines.Kubernetes
	objs := parseObjects(t, string(data))
	for _, pool := range []struct {
		service, port string
		ports         []string
	}{
		{k.Prefill.Service, k.Prefill.Port, []string{k.Prefill.Port, "bootstrap"}},
		{k.Decode.Service, k.Decode.Port, []string{k.Decode.Port}},
	} {
		var svc struct {
			Spec struct {
				ClusterIP string
				Selector  map[string]string
				Ports     []struct{ Name string }
			}
		}
		o, ok := objs["Service/"+k.Namespace+"/"+pool.service]
		if !ok {
			t.Fatalf("no Service %s/%s", k.Namespace, pool.service)
		}
		o.into(t, &svc)
		var names []string
		for _, p := range svc.Spec.Ports {
			names = append(names, p.Name)
		}
		if svc.Spec.ClusterIP != "None" || !slices.Equal(names, pool.ports) {
			t.Errorf("Service %s: clusterIP %q, ports %v; want a headless Service with ports %v", pool.service, svc.Spec.ClusterIP, names, pool.ports)
		}
		var sts struct {
			Spec struct {
				Template struct {
					Metadata struct{ Labels map[string]string }
				}
			}
		}
		objs["StatefulSet/"+k.Namespace+"/"+pool.service].into(t, &sts)
		if len(svc.Spec.Selector) == 0 || !subset(svc.Spec.Selector, sts.Spec.Template.Metadata.Labels) {
			t.Errorf("Service %s selects %v, not its engines' pods", pool.service, svc.Spec.Selector)
		}
	}
}

// testBrokenTemplates breaks a copy of the chart in ways helm itself
// accepts, and checks that kubeconform rejects each.
func testBrokenTemplates(t *testing.T, tk tools, schemas string) {
	tests := []struct {
		name, file, old, new, want string
	}{
		{"unknown field", "deployment.yaml", "      terminationGracePeriodSeconds:", "      terminationGracePeriod: 1\n      terminationGracePeriodSeconds:", "terminationGracePeriod"},
		{"wrong type", "service.yaml", "      protocol: TCP\n      appProtocol: http", "      protocol: TCP\n      appProtocol: [http]", "appProtocol"},
		{"missing required field", "deployment.yaml", "  selector:\n    matchLabels:", "  selectorr:\n    matchLabels:", "selector"},
		{"misplaced field", "rbac.yaml", "rules:\n", "verbs: [get]\nrules:\n", "verbs"},
		{"servicemonitor field", "servicemonitor.yaml", "      path: /metrics", "      metricsPath: /metrics", "metricsPath"},
		{"certificate field", "certificate.yaml", "  usages: [digital signature, server auth]", "  usage: [digital signature, server auth]", "usage"},
		{"certificate enum", "certificate.yaml", "  usages: [digital signature, client auth]", "  usages: [digital signature, client-auth]", "/spec/usages/1"},
		{"networkpolicy field", "networkpolicy.yaml", "  policyTypes: [Ingress]", "  policyType: [Ingress]", "policyType"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chart := copyChart(t)
			path := filepath.Join(chart, "templates", tt.file)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(data, []byte(tt.old)) {
				t.Fatalf("%s lacks %q: update this test", tt.file, tt.old)
			}
			if err := os.WriteFile(path, bytes.Replace(data, []byte(tt.old), []byte(tt.new), 1), 0o644); err != nil {
				t.Fatal(err)
			}
			manifest, err := render(tk, chart, []string{"pd-discovery.yaml"}, nil)
			if err != nil {
				t.Fatalf("helm rejected the break itself (this test wants one only the schemas catch): %v", err)
			}
			out, err := kubeconform(t, tk, schemas, manifest)
			if err == nil {
				t.Fatalf("kubeconform accepts the broken chart:\n%s", out)
			}
			if !strings.Contains(out, tt.want) {
				t.Errorf("kubeconform's complaint does not name %q:\n%s", tt.want, out)
			}
		})
	}
}

func copyChart(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), chartDir)
	if err := os.CopyFS(dst, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	return dst
}

// testInvalidValues: values the chart must refuse, each with a message
// naming what to change.
func testInvalidValues(t *testing.T, tk tools) {
	tests := []struct {
		name  string
		files []string
		set   []string
		want  string
	}{
		{"chart-owned config key", nil, []string{"config.listen.grpc=:1"}, "config.listen: the chart sets it"},
		{"chart-owned envoy address", nil, []string{"config.envoy.duet=x:1"}, "config.envoy.duet: the chart sets it"},
		{"unknown engine source", nil, []string{"engines.source=dns"}, "at '/engines/source': value must be one of 'kubernetes', 'static'"},
		{"static lists with discovery", nil, []string{"engines.decode[0].url=http://a:1"}, "engines.prefill and engines.decode are for source: static"},
		{"static without decode", nil, []string{"engines.source=static"}, "engines.decode must list at least one engine"},
		{"discovery without decode service", nil, []string{"engines.kubernetes.decode.service="}, "engines.kubernetes.decode.service is required"},
		{"both budgets", nil, []string{"podDisruptionBudget.minAvailable=1"}, "set minAvailable or maxUnavailable, not both"},
		{"typo in values", nil, []string{"replicas=2"}, "additional properties 'replicas' not allowed"},
		{"wrong value type", nil, []string{"envoy.enabled=yes"}, "at '/envoy/enabled': got string, want boolean"},
		{"misplaced kubernetes key", nil, []string{"engines.kubernetes.decode.targetPort=1"}, "additional properties 'targetPort' not allowed"},
		{"chart-owned auth", nil, []string{"config.auth.unauthenticated=true"}, "config.auth: the chart sets it"},
		{"chart-owned envoy TLS", nil, []string{"config.envoy.duet_tls.ca_file=/ca.crt"}, "config.envoy.duet_tls: the chart sets it"},
		{"unknown auth mode", nil, []string{"auth.mode=off"}, "at '/auth/mode': value must be one of"},
		{"unknown TLS source", nil, []string{"auth.tls.source=vault"}, "at '/auth/tls/source': value must be one of"},
		{"typo in auth", nil, []string{"auth.token.secretName=x"}, "additional properties 'secretName' not allowed"},
		{"TLS secret unnamed", nil, []string{"auth.tls.source=secret"}, "auth.tls.secretName: name the Secret"},
		{"client TLS secret unnamed", nil, []string{"auth.tls.source=secret", "auth.tls.secretName=mine"}, "auth.tls.clientSecretName: name the Secret"},
		{"cert-manager without issuer", nil, []string{"auth.tls.source=certManager"}, "auth.tls.certManager.issuerRef.name: name the Issuer"},
		{"gateway unnamed", nil, []string{"envoy.enabled=false", "replicaCount=1"}, "networkPolicy.gateway: with envoy.enabled false, list the gateway pods"},
		{"replicas behind a gateway sharing nothing", []string{"aggregated-static.yaml"}, []string{"sync.nats.url=", "sync.nats.tokenSecret="},
			"replicaCount: 2 duets behind a gateway must share their state: set sync.nats.url"},
		{"NATS without a word on auth", nil, []string{"sync.nats.url=nats://nats:4222"}, "sync.nats.tokenSecret: name the Secret"},
		{"NATS token and unauthenticated", nil, []string{"sync.nats.url=nats://nats:4222", "sync.nats.tokenSecret=t", "sync.nats.unauthenticated=true"},
			"sync.nats: set tokenSecret or unauthenticated, not both"},
		{"NATS token without NATS", nil, []string{"sync.nats.tokenSecret=t"}, "need sync.nats.url"},
		{"NATS URL not NATS", nil, []string{"sync.nats.url=http://nats:4222", "sync.nats.unauthenticated=true"}, "at '/sync/nats/url'"},
		{"wildcard subject", nil, []string{"sync.nats.url=nats://nats:4222", "sync.nats.unauthenticated=true", "sync.subject=duet.>"}, "at '/sync/subject'"},
		{"chart-owned sync", nil, []string{"config.sync.nats.url=nats://nats:4222"}, "config.sync: the chart sets it"},
		{"chart-owned otlp", nil, []string{"config.otlp.endpoint=collector:4317"}, "config.otlp: the chart sets it; use engines (prefill, decode, kubernetes), ports (listen), auth (auth), sync (sync) or otlp (otlp)"},
		{"tracing without a collector", nil, []string{"otlp.enabled=true"}, "otlp.endpoint: name the OTLP/gRPC collector"},
		{"collector without a port", nil, []string{"otlp.enabled=true", "otlp.endpoint=collector"}, "at '/otlp/endpoint'"},
		{"collector as a URL", nil, []string{"otlp.enabled=true", "otlp.endpoint=http://collector:4317"}, "at '/otlp/endpoint'"},
		{"sampling above 100", []string{"tracing.yaml"}, []string{"otlp.samplingPercent=101"}, "at '/otlp/samplingPercent'"},
		{"typo in otlp", nil, []string{"otlp.sampling=1"}, "additional properties 'sampling' not allowed"},
		{"service name with a space", []string{"tracing.yaml"}, []string{"otlp.serviceName=my duet"}, "at '/otlp/serviceName'"},
		// What an unquoted `mode: on` in a values file becomes.
		{"kv_events mode a boolean", nil, []string{"config.kv_events.mode=true"}, "config.kv_events.mode: true is a boolean; quote the mode"},
		{"admission engine_priority a boolean", nil, []string{"config.admission.engine_priority=false"},
			"config.admission.engine_priority: false is a boolean; quote the mode"},
		{"headless beside envoy", nil, []string{"service.headless=true"}, "service.headless: only with envoy.enabled false"},
		{"chart-owned pools", nil, []string{"config.pools[0].name=a"}, "config.pools: the chart sets it; use pools"},
		{"pools with engine lists", []string{"two-pools.yaml"}, []string{"engines.decode[0].url=http://a:1"},
			"engines.prefill and engines.decode must be empty with pools"},
		{"pool without models", nil, []string{"pools[0].name=a", "pools[0].decode[0].url=http://a:1"}, "missing property 'models'"},
		{"pool name not a label", nil, []string{"pools[0].name=Big_Model", "pools[0].models={m}", "pools[0].decode[0].url=http://a:1"},
			"at '/pools/0/name'"},
		{"typo in a pool", nil, []string{"pools[0].name=a", "pools[0].models={m}", "pools[0].decodes[0].url=http://a:1"},
			"additional properties 'decodes' not allowed"},
		{"pool without engines", nil, []string{"pools[0].name=a", "pools[0].models={m}"}, "pools[0].decode must list at least one engine"},
		{"pool with services and lists", nil, []string{"pools[0].name=a", "pools[0].models={m}", "pools[0].decode[0].url=http://a:1",
			"pools[0].kubernetes.decode.service=a"}, "pools[0] (a): prefill and decode list engines by URL"},
		{"pool without its decode service", nil, []string{"pools[0].name=a", "pools[0].models={m}", "pools[0].kubernetes.decode.port=http"},
			"pools[0].kubernetes.decode.service is required"},
		{"negative dp_size of a pool's Service", nil, []string{"pools[0].name=a", "pools[0].models={m}", "pools[0].kubernetes.decode.service=a",
			"pools[0].kubernetes.decode.dp_size=-1"}, "at '/pools/0/kubernetes/decode/dp_size'"},
		{"typo in a pool's Service", nil, []string{"pools[0].name=a", "pools[0].models={m}", "pools[0].kubernetes.decode.service=a",
			"pools[0].kubernetes.decode.dpsize=2"}, "additional properties 'dpsize' not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := render(tk, chartDir, tt.files, tt.set)
			if err == nil {
				t.Fatalf("helm template accepts %v", tt.set)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("helm template's error does not say %q:\n%v", tt.want, err)
			}
		})
	}
}

// testChecksum: a changed configuration changes the pod template (so the
// pods roll); anything else leaves the checksum alone.
func testChecksum(t *testing.T, tk tools) {
	checksum := func(set ...string) string {
		t.Helper()
		manifest, err := render(tk, chartDir, nil, set)
		if err != nil {
			t.Fatal(err)
		}
		var dep deployment
		parseObjects(t, manifest)["Deployment/duet-system/duet"].into(t, &dep)
		return dep.Spec.Template.Metadata.Annotations["checksum/config"]
	}
	base := checksum()
	if again := checksum(); again != base {
		t.Errorf("two renderings differ: %s, %s", base, again)
	}
	if other := checksum("config.log_level=debug"); other == base {
		t.Error("a changed configuration keeps the checksum: the pods would not roll")
	}
	if other := checksum("replicaCount=3"); other != base {
		t.Error("a replica count changes the configuration's checksum")
	}
}

// checkTokenizer checks the tokenizer volume: mounted read-only into duet
// (and nothing else) at the mount path, from the claim, only when asked.
func checkTokenizer(t *testing.T, vs valueSet, manifest string, objs map[string]object) {
	var dep deployment
	objs["Deployment/duet-system/duet"].into(t, &dep)
	pod := dep.Spec.Template.Spec
	var mounted []string
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		for _, m := range c.VolumeMounts {
			if m.Name == "tokenizer" {
				mounted = append(mounted, fmt.Sprintf("%s:%s:%v", c.Name, m.MountPath, m.ReadOnly))
			}
		}
	}
	hasVolume := slices.ContainsFunc(pod.Volumes, func(v volume) bool { return v.Name == "tokenizer" })
	if vs.tokenizerClaim == "" {
		if len(mounted) > 0 || hasVolume {
			t.Errorf("no tokenizer asked for, but mounts %v, volume %v", mounted, hasVolume)
		}
		return
	}
	if !slices.Equal(mounted, []string{"duet:/models/tokenizer:true"}) || !hasVolume ||
		!strings.Contains(manifest, "claimName: "+vs.tokenizerClaim) {
		t.Errorf("tokenizer mounts %v, volume %v: want duet's read-only mount of claim %s", mounted, hasVolume, vs.tokenizerClaim)
	}
}
