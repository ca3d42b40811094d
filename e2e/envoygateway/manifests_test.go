package envoygateway

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
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
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == cm.Name
	}) {
		t.Errorf("duet's pods do not mount ConfigMap %s", cm.Name)
	}
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
