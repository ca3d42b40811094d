package kubeschema

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func TestFileName(t *testing.T) {
	tests := []struct {
		gvk  GVK
		want string
	}{
		{GVK{"", "v1", "Service"}, "service-v1.json"},
		{GVK{"apps", "v1", "Deployment"}, "deployment-apps-v1.json"},
		{GVK{"rbac.authorization.k8s.io", "v1", "RoleBinding"}, "rolebinding-rbac-v1.json"},
		{GVK{"monitoring.coreos.com", "v1", "ServiceMonitor"}, "servicemonitor-monitoring-v1.json"},
		{GVK{"policy", "v1beta1", "PodDisruptionBudget"}, "poddisruptionbudget-policy-v1beta1.json"},
	}
	for _, tt := range tests {
		if got := tt.gvk.FileName(); got != tt.want {
			t.Errorf("%+v: FileName() = %q, want %q", tt.gvk, got, tt.want)
		}
	}
}

func decode(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestTighten(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"closed object",
			`{"type":"object","properties":{"a":{"type":"string"}}}`,
			`{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}`},
		{"map stays open",
			`{"type":"object","additionalProperties":{"type":"string"}}`,
			`{"type":"object","additionalProperties":{"type":"string"}}`},
		{"preserved unknown fields stay open",
			`{"type":"object","x-kubernetes-preserve-unknown-fields":true,"properties":{"a":{}}}`,
			`{"type":"object","x-kubernetes-preserve-unknown-fields":true,"properties":{"a":{}}}`},
		{"object without properties stays open",
			`{"type":"object"}`,
			`{"type":"object"}`},
		{"reference rewritten, nested objects closed",
			`{"properties":{"spec":{"allOf":[{"$ref":"#/components/schemas/x.Spec"}]},"items":{"type":"array","items":{"properties":{"b":{}}}}}}`,
			`{"properties":{"spec":{"allOf":[{"$ref":"#/$defs/x.Spec"}]},"items":{"type":"array","items":{"properties":{"b":{}},"additionalProperties":false}}},"additionalProperties":false}`},
		{"a property named properties is a property",
			`{"properties":{"properties":{"type":"object","additionalProperties":{"type":"object"}}}}`,
			`{"properties":{"properties":{"type":"object","additionalProperties":{"type":"object"}}},"additionalProperties":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := tighten(decode(t, tt.in)), decode(t, tt.want); !reflect.DeepEqual(got, want) {
				g, _ := json.Marshal(got)
				t.Errorf("tighten = %s\nwant      %s", g, tt.want)
			}
		})
	}
}

const coreDoc = `{"components":{"schemas":{
  "meta.ObjectMeta":{"type":"object","properties":{"name":{"type":"string"},"labels":{"type":"object","additionalProperties":{"type":"string"}}}},
  "core.Unused":{"type":"object","properties":{"x":{"type":"string"}}}
}}}`

const appsDoc = `{"components":{"schemas":{
  "apps.Thing":{"type":"object","required":["spec"],
    "properties":{"apiVersion":{"type":"string"},"kind":{"type":"string"},
      "metadata":{"allOf":[{"$ref":"#/components/schemas/meta.ObjectMeta"}]},
      "spec":{"allOf":[{"$ref":"#/components/schemas/apps.ThingSpec"}]}},
    "x-kubernetes-group-version-kind":[{"group":"apps","kind":"Thing","version":"v1"}]},
  "apps.ThingSpec":{"type":"object","properties":{"replicas":{"type":"integer"}}}
}}}`

func TestFromOpenAPI(t *testing.T) {
	set, err := FromOpenAPI([]byte(coreDoc), []byte(appsDoc))
	if err != nil {
		t.Fatal(err)
	}
	if len(set) != 1 {
		t.Fatalf("files = %v, want thing-apps-v1.json alone", keys(set))
	}
	var file struct {
		Schema string                    `json:"$schema"`
		Ref    string                    `json:"$ref"`
		Defs   map[string]map[string]any `json:"$defs"`
	}
	if err := json.Unmarshal(set["thing-apps-v1.json"], &file); err != nil {
		t.Fatal(err)
	}
	if file.Schema != draft || file.Ref != "#/$defs/apps.Thing" {
		t.Errorf("$schema, $ref = %q, %q", file.Schema, file.Ref)
	}
	// Reachable schemas only, across documents; every object closed.
	if got, want := keys(file.Defs), []string{"apps.Thing", "apps.ThingSpec", "meta.ObjectMeta"}; !reflect.DeepEqual(got, want) {
		t.Errorf("$defs = %v, want %v", got, want)
	}
	for name, def := range file.Defs {
		if def["additionalProperties"] != false {
			t.Errorf("%s: additionalProperties = %v, want false", name, def["additionalProperties"])
		}
	}
}

func TestFromOpenAPIErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"dangling reference", `{"components":{"schemas":{"a.K":{"properties":{"s":{"$ref":"#/components/schemas/a.Missing"}},"x-kubernetes-group-version-kind":[{"group":"","kind":"K","version":"v1"}]}}}}`, "undefined schema a.Missing"},
		{"no schemas", `{"openapi":"3.0.0"}`, "no component schemas"},
		{"not json", `{`, "openapi document 0"},
		{"bad group-version-kind", `{"components":{"schemas":{"a.K":{"x-kubernetes-group-version-kind":"K"}}}}`, "x-kubernetes-group-version-kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := FromOpenAPI([]byte(tt.doc)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

const crd = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
spec:
  group: monitoring.example.com
  names: {kind: Monitor}
  versions:
  - name: v1
    served: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              interval: {type: string}
              extra: {type: object, x-kubernetes-preserve-unknown-fields: true}
  - name: v1alpha1
    served: false
    schema:
      openAPIV3Schema: {type: object}
`

func TestFromCRD(t *testing.T) {
	set, err := FromCRD([]byte(crd))
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(set); !reflect.DeepEqual(got, []string{"monitor-monitoring-v1.json"}) {
		t.Fatalf("files = %v, want the served version alone", got)
	}
	want := `{"$schema":"` + draft + `","type":"object","additionalProperties":false,"properties":{"spec":{"type":"object","additionalProperties":false,
	  "properties":{"interval":{"type":"string"},"extra":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}}}`
	if got := decode(t, string(set["monitor-monitoring-v1.json"])); !reflect.DeepEqual(got, decode(t, want)) {
		t.Errorf("schema = %s", set["monitor-monitoring-v1.json"])
	}
}

func TestFromCRDErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"not a crd", "kind: ConfigMap\n", `kind is "ConfigMap"`},
		{"no schema", "kind: CustomResourceDefinition\nspec: {names: {kind: K}, versions: [{name: v1, served: true}]}\n", "no served version has a schema"},
		{"not yaml", "kind: [", "crd:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := FromCRD([]byte(tt.doc)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestMergeAndWrite(t *testing.T) {
	a := Set{"a-v1.json": json.RawMessage(`{"type":"object"}`)}
	if err := a.Merge(Set{"a-v1.json": json.RawMessage(`{"type":"object"}`), "b-v1.json": json.RawMessage(`{}`)}); err != nil {
		t.Fatalf("merging an equal schema: %v", err)
	}
	if err := a.Merge(Set{"a-v1.json": json.RawMessage(`{"type":"string"}`)}); err == nil {
		t.Error("merging a different schema under one name succeeded")
	}
	dir := filepath.Join(t.TempDir(), "schemas")
	if err := a.Write(dir); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "b-v1.json"))
	if err != nil || string(got) != "{}" {
		t.Errorf("b-v1.json = %q, %v", got, err)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
