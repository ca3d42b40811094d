package envoygateway

import (
	"path"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/duet-router/duet/e2e/harness"
)

// TestManifestKubernetesObjects checks what egctl does not: the core
// Kubernetes objects of deploy/envoy-gateway decode strictly (no unknown or
// mistyped field) and fit together. The Deployment's pods carry the labels
// the Service selects, the ports the Service targets, the ConfigMap and the
// ServiceAccount that the RoleBinding binds; the Role grants exactly what
// duet's discovery needs (get, list, watch on EndpointSlices).
func TestManifestKubernetesObjects(t *testing.T) {
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Yaml: true, Strict: true})
	var (
		deploys   []*appsv1.Deployment
		services  []*corev1.Service
		configs   []*corev1.ConfigMap
		accounts  []*corev1.ServiceAccount
		roles     []*rbacv1.Role
		bindings  []*rbacv1.RoleBinding
		unchecked int
	)
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
		switch o := obj.(type) {
		case *appsv1.Deployment:
			deploys = append(deploys, o)
		case *corev1.Service:
			services = append(services, o)
		case *corev1.ConfigMap:
			configs = append(configs, o)
		case *corev1.ServiceAccount:
			accounts = append(accounts, o)
		case *rbacv1.Role:
			roles = append(roles, o)
		case *rbacv1.RoleBinding:
			bindings = append(bindings, o)
		default:
			t.Errorf("unexpected %s", kind)
		}
	}
	if len(deploys) != 1 || len(services) != 1 || len(configs) != 1 || len(accounts) != 1 || len(roles) != 1 || len(bindings) != 1 || unchecked == 0 {
		t.Fatalf("want one Deployment, Service, ConfigMap, ServiceAccount, Role and RoleBinding besides the gateway's resources; got %d %d %d %d %d %d and %d others",
			len(deploys), len(services), len(configs), len(accounts), len(roles), len(bindings), unchecked)
	}
	d, svc, cm, sa, role, rb := deploys[0], services[0], configs[0], accounts[0], roles[0], bindings[0]
	for _, o := range []interface{ GetNamespace() string }{d, svc, cm, sa, role, rb} {
		if o.GetNamespace() != namespace {
			t.Errorf("%T in namespace %q, want %s", o, o.GetNamespace(), namespace)
		}
	}
	pod := d.Spec.Template
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1 (docs/deploy/envoy-gateway.md, One duet replica)", d.Spec.Replicas)
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("the Deployment selects %s=%s, its pods do not carry it", k, v)
		}
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
