package envoygateway

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/duet-router/duet/e2e/harness"
)

// TestManifestKubernetesObjects checks what egctl does not: the core
// Kubernetes objects of deploy/envoy-gateway decode strictly (no unknown or
// mistyped field) and fit together. duet's Deployment runs at least two
// replicas, each named by its pod (POD_NAME), whose pods carry the labels
// the Service and the PodDisruptionBudget select, the ports the Service
// targets, the ConfigMap and the ServiceAccount that the RoleBinding binds;
// the Role grants exactly what duet's discovery needs (get, list, watch on
// EndpointSlices). The NATS server fits duet's sync section (checkNATS).
func TestManifestKubernetesObjects(t *testing.T) {
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Yaml: true, Strict: true})
	core := map[string]runtime.Object{} // "<Kind>/<name>"
	unchecked := 0
	for _, o := range objs {
		kind := str(o, "kind")
		if !scheme.Scheme.Recognizes(schema.FromAPIVersionAndKind(str(o, "apiVersion"), kind)) {
			unchecked++ // Gateway API and Envoy Gateway kinds: egctl validates them
			continue
		}
		doc, err := marshalYAML(o)
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := strict.Decode(doc, nil, nil)
		if err != nil {
			t.Errorf("%s %s: %v", kind, str(o, "metadata", "name"), err)
			continue
		}
		if ns := str(o, "metadata", "namespace"); ns != namespace {
			t.Errorf("%s %s in namespace %q, want %s", kind, str(o, "metadata", "name"), ns, namespace)
		}
		core[kind+"/"+str(o, "metadata", "name")] = obj
	}
	wantObjs := []string{"ConfigMap/duet", "ConfigMap/nats", "Deployment/duet", "Deployment/nats", "PodDisruptionBudget/duet",
		"Role/duet", "RoleBinding/duet", "Service/duet", "Service/nats", "ServiceAccount/duet"}
	if got := slices.Sorted(maps.Keys(core)); !slices.Equal(got, wantObjs) || unchecked == 0 {
		t.Fatalf("Kubernetes objects %v, want %v besides the gateway's resources (%d)", got, wantObjs, unchecked)
	}
	d, svc, cm := core["Deployment/duet"].(*appsv1.Deployment), core["Service/duet"].(*corev1.Service), core["ConfigMap/duet"].(*corev1.ConfigMap)
	sa, role, rb := core["ServiceAccount/duet"].(*corev1.ServiceAccount), core["Role/duet"].(*rbacv1.Role), core["RoleBinding/duet"].(*rbacv1.RoleBinding)
	pdb := core["PodDisruptionBudget/duet"].(*policyv1.PodDisruptionBudget)
	pod := d.Spec.Template
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want at least 2 (docs/deploy/envoy-gateway.md, Replicas)", d.Spec.Replicas)
	}
	for what, sel := range map[string]map[string]string{"the Deployment": d.Spec.Selector.MatchLabels, "the PodDisruptionBudget": pdb.Spec.Selector.MatchLabels} {
		for k, v := range sel {
			if pod.Labels[k] != v {
				t.Errorf("%s selects %s=%s, duet's pods do not carry it", what, k, v)
			}
		}
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
	}
	for k, v := range svc.Spec.Selector {
		if pod.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, duet's pods do not carry it", k, v)
		}
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want duet alone", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	for _, p := range svc.Spec.Ports {
		if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
			return (p.TargetPort.Type == intstr.String && cp.Name == p.TargetPort.StrVal) || cp.ContainerPort == p.TargetPort.IntVal
		}) {
			t.Errorf("Service port %s targets %s, which duet's container does not expose", p.Name, p.TargetPort.String())
		}
		if p.Name == "grpc" && p.Port != duetGRPCPort {
			t.Errorf("Service port grpc is %d, the policies dial %d", p.Port, duetGRPCPort)
		}
	}
	files := mountedFiles(c, pod.Spec.Volumes, cm)
	if i := slices.Index(c.Args, "-config"); i < 0 || i+1 >= len(c.Args) || files[c.Args[i+1]] != "ConfigMap "+cm.Name+" duet.yaml" {
		t.Errorf("duet runs with %v, which does not name the duet.yaml of ConfigMap %s as mounted (%v)", c.Args, cm.Name, files)
	}
	checkAuthFiles(t, cm, files)
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}) {
		t.Error("duet's container has no POD_NAME from metadata.name: its replicas would go by host name and process id")
	}
	checkNATS(t, cm, files, core["Deployment/nats"].(*appsv1.Deployment), core["Service/nats"].(*corev1.Service), core["ConfigMap/nats"].(*corev1.ConfigMap))
	if pod.Spec.ServiceAccountName != sa.Name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != sa.Name || rb.RoleRef.Name != role.Name {
		t.Errorf("pods run as %q; the RoleBinding binds %+v to %s; want ServiceAccount %s bound to Role %s",
			pod.Spec.ServiceAccountName, rb.Subjects, rb.RoleRef.Name, sa.Name, role.Name)
	}
	want := rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, want.APIGroups) ||
		!slices.Equal(role.Rules[0].Resources, want.Resources) || !slices.Equal(role.Rules[0].Verbs, want.Verbs) {
		t.Errorf("Role rules %+v, want exactly %+v", role.Rules, want)
	}
}

// mountedFiles maps each file that c sees from a ConfigMap or Secret volume
// to its source, "ConfigMap <name> <key>" or "Secret <name> <key>". A
// ConfigMap source without items shows every key of cm (the only ConfigMap
// whose keys the manifests hold); a Secret source must list its items.
func mountedFiles(c corev1.Container, volumes []corev1.Volume, cm *corev1.ConfigMap) map[string]string {
	files := map[string]string{}
	add := func(dir, kind, name string, items []corev1.KeyToPath) {
		if len(items) == 0 && kind == "ConfigMap" && name == cm.Name {
			for k := range cm.Data {
				items = append(items, corev1.KeyToPath{Key: k, Path: k})
			}
		}
		for _, it := range items {
			files[path.Join(dir, it.Path)] = kind + " " + name + " " + it.Key
		}
	}
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			continue
		}
		v := volumes[i].VolumeSource
		switch {
		case v.ConfigMap != nil:
			add(m.MountPath, "ConfigMap", v.ConfigMap.Name, v.ConfigMap.Items)
		case v.Secret != nil:
			add(m.MountPath, "Secret", v.Secret.SecretName, v.Secret.Items)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.ConfigMap != nil {
					add(m.MountPath, "ConfigMap", src.ConfigMap.Name, src.ConfigMap.Items)
				}
				if src.Secret != nil {
					add(m.MountPath, "Secret", src.Secret.Name, src.Secret.Items)
				}
			}
		}
	}
	return files
}

// checkAuthFiles: the ConfigMap's duet.yaml requires mutual TLS on the gRPC
// port, from the client certificate `duet certs` makes for Envoy (the one
// docs/deploy/envoy-gateway.md puts in the gateway's Secret), and an admin
// token; every file its auth section names is mounted from the Secret key
// that the guide's `kubectl create secret` commands fill (one Secret for
// duet's certificate, key and CA, one for the admin token), and the
// BackendTLSPolicy checks the name `duet certs` gives duet's certificate.
func checkAuthFiles(t *testing.T, cm *corev1.ConfigMap, files map[string]string) {
	t.Helper()
	var cfg struct {
		Auth struct {
			TLS *struct {
				CertFile     string   `yaml:"cert_file"`
				KeyFile      string   `yaml:"key_file"`
				ClientCAFile string   `yaml:"client_ca_file"`
				ClientNames  []string `yaml:"client_names"`
			} `yaml:"tls"`
			TokenFile      string `yaml:"token_file"`
			AdminTokenFile string `yaml:"admin_token_file"`
		} `yaml:"auth"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["duet.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	tls := cfg.Auth.TLS
	if tls == nil {
		t.Fatal("duet.yaml sets no auth.tls")
	}
	made := harness.CredentialsIn("")
	if !slices.Equal(tls.ClientNames, []string{made.ClientName}) {
		t.Errorf("auth.tls.client_names %v, want [%s] (Envoy's certificate from `duet certs`)", tls.ClientNames, made.ClientName)
	}
	secretOf := func(source string) string { // "Secret <name> <key>": name
		if f := strings.Fields(source); len(f) == 3 && f[0] == "Secret" {
			return f[1]
		}
		return ""
	}
	for _, f := range []struct{ field, file, key string }{
		{"auth.tls.cert_file", tls.CertFile, "tls.crt"},
		{"auth.tls.key_file", tls.KeyFile, "tls.key"},
		{"auth.tls.client_ca_file", tls.ClientCAFile, "ca.crt"},
		{"auth.admin_token_file", cfg.Auth.AdminTokenFile, "token"},
	} {
		source := files[f.file]
		if secretOf(source) == "" || !strings.HasSuffix(source, " "+f.key) {
			t.Errorf("%s %q is %q, want a Secret's key %s mounted there", f.field, f.file, source, f.key)
		}
	}
	if a, b, c := secretOf(files[tls.CertFile]), secretOf(files[tls.KeyFile]), secretOf(files[tls.ClientCAFile]); a != b || a != c {
		t.Errorf("duet's certificate, key and CA come from Secrets %s, %s, %s, want one", a, b, c)
	}
	if cfg.Auth.TokenFile != "" {
		t.Errorf("auth.token_file %q: the recipe is mutual TLS alone (the e2e test runs no token)", cfg.Auth.TokenFile)
	}
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	g, err := readGatewayTLS(objs)
	if err != nil {
		t.Fatal(err)
	}
	if g.hostname != made.ServerName {
		t.Errorf("BackendTLSPolicy %s checks hostname %q, want %q (duet's certificate from `duet certs`)", g.policy, g.hostname, made.ServerName)
	}
}

// checkNATS: duet's sync section (in cm, with the files duet's container
// sees) and the NATS server fit together. sync.nats.url names the NATS
// Service (its DNS name in this namespace) and port; the Service selects
// the server's pods and targets its client port; the server runs the
// nats.conf of ConfigMap nats, which listens on that port and takes the
// token from an environment variable that the Deployment fills from the
// very Secret key mounted at duet's sync.nats.token_file.
func checkNATS(t *testing.T, cm *corev1.ConfigMap, files map[string]string, d *appsv1.Deployment, svc *corev1.Service, conf *corev1.ConfigMap) {
	t.Helper()
	var cfg struct {
		Sync struct {
			NATS struct {
				URL       string `yaml:"url"`
				TokenFile string `yaml:"token_file"`
			} `yaml:"nats"`
		} `yaml:"sync"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["duet.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cfg.Sync.NATS.URL)
	if err != nil || u.Scheme != "nats" {
		t.Fatalf("sync.nats.url %q: want nats://<NATS Service>:<port>", cfg.Sync.NATS.URL)
	}
	host, port, _ := net.SplitHostPort(u.Host)
	if !slices.Contains([]string{svc.Name + "." + namespace + ".svc", svc.Name + "." + namespace + ".svc.cluster.local"}, host) {
		t.Errorf("sync.nats.url names host %s, not Service %s/%s", host, namespace, svc.Name)
	}
	var client *corev1.ServicePort
	for i, p := range svc.Spec.Ports {
		if strconv.Itoa(int(p.Port)) == port {
			client = &svc.Spec.Ports[i]
		}
	}
	if client == nil {
		t.Fatalf("Service %s has no port %s (sync.nats.url)", svc.Name, port)
	}
	pod := d.Spec.Template
	for k, v := range svc.Spec.Selector {
		if pod.Labels[k] != v {
			t.Errorf("Service %s selects %s=%s, the NATS pods do not carry it", svc.Name, k, v)
		}
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers in the NATS pod, want nats-server alone", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	var target *corev1.ContainerPort
	for i, cp := range c.Ports {
		if cp.Name == client.TargetPort.StrVal || cp.ContainerPort == client.TargetPort.IntVal {
			target = &c.Ports[i]
		}
	}
	if target == nil {
		t.Fatalf("Service %s port %d targets %s, which the NATS container does not expose", svc.Name, client.Port, client.TargetPort.String())
	}
	text := conf.Data["nats.conf"]
	if m := regexp.MustCompile(`(?m)^port: (\d+)$`).FindStringSubmatch(text); m == nil || m[1] != strconv.Itoa(int(target.ContainerPort)) {
		t.Errorf("nats.conf listens on %v, the Service targets %d", m, target.ContainerPort)
	}
	confFiles := mountedFiles(c, pod.Spec.Volumes, conf)
	if i := slices.Index(c.Command, "--config"); i < 0 || i+1 >= len(c.Command) || confFiles[c.Command[i+1]] != "ConfigMap "+conf.Name+" nats.conf" {
		t.Errorf("nats-server runs %v, which does not name the nats.conf of ConfigMap %s as mounted (%v)", c.Command, conf.Name, confFiles)
	}
	m := regexp.MustCompile(`token: \$([A-Z_]+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("nats.conf requires no token from the environment:\n%s", text)
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == m[1] })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.SecretKeyRef == nil {
		t.Fatalf("the NATS container does not set %s from a Secret", m[1])
	}
	ref := c.Env[i].ValueFrom.SecretKeyRef
	if got, want := files[cfg.Sync.NATS.TokenFile], fmt.Sprintf("Secret %s %s", ref.Name, ref.Key); got != want {
		t.Errorf("sync.nats.token_file %q is %q, want the server's token, %s", cfg.Sync.NATS.TokenFile, got, want)
	}
}
