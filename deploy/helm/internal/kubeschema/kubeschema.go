// Package kubeschema turns Kubernetes API schemas into the standalone, strict
// JSON Schema files that kubeconform validates manifests against: one file
// per kind and version, named as kubeconform's
// "{{ .ResourceKind }}{{ .KindSuffix }}.json" schema location expects
// (deployment-apps-v1.json, service-v1.json, servicemonitor-monitoring-v1.json).
//
// Two sources are read: the OpenAPI v3 documents that Kubernetes publishes
// (api/openapi-spec/v3 in the k8s.io/kubernetes module) and the
// openAPIV3Schema of CustomResourceDefinitions. Every object schema that
// lists its properties and neither allows other ones nor preserves unknown
// fields gets additionalProperties: false, so a misspelt or misplaced field
// fails validation instead of being dropped by the API server.
package kubeschema

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// draft is the JSON Schema dialect of the files written.
const draft = "https://json-schema.org/draft/2020-12/schema"

const (
	openAPIRef = "#/components/schemas/"
	defsRef    = "#/$defs/"
)

// Set maps a schema file name to its JSON Schema.
type Set map[string]json.RawMessage

// GVK is a group, version and kind; the core group is "".
type GVK struct {
	Group   string `json:"group"`
	Version string `json:"version"`
	Kind    string `json:"kind"`
}

// FileName is the file kubeconform looks up for g: the lower-cased kind,
// then the first label of the group (none for the core group), then the
// version.
func (g GVK) FileName() string {
	suffix := "-" + strings.ToLower(g.Version)
	if g.Group != "" {
		suffix = "-" + strings.ToLower(strings.Split(g.Group, ".")[0]) + suffix
	}
	return strings.ToLower(g.Kind) + suffix + ".json"
}

// add records schema under g's file name; two different kinds that map to
// the same name are an error.
func (s Set) add(g GVK, schema any) error {
	data, err := json.Marshal(schema)
	if err != nil {
		return fmt.Errorf("encode %s: %w", g.FileName(), err)
	}
	name := g.FileName()
	if prev, ok := s[name]; ok && string(prev) != string(data) {
		return fmt.Errorf("%s: two different schemas for one file (groups %q collide?)", name, g.Group)
	}
	s[name] = data
	return nil
}

// FromOpenAPI builds a schema file for every kind that the OpenAPI v3
// documents define (schemas carrying x-kubernetes-group-version-kind). The
// documents' components are merged, so a kind may refer to a schema defined
// in another document.
func FromOpenAPI(docs ...[]byte) (Set, error) {
	all := map[string]any{}
	for i, data := range docs {
		var doc struct {
			Components struct {
				Schemas map[string]any `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			return nil, fmt.Errorf("openapi document %d: %w", i, err)
		}
		for name, schema := range doc.Components.Schemas {
			all[name] = schema
		}
	}
	if len(all) == 0 {
		return nil, errors.New("openapi: no component schemas")
	}
	strict := make(map[string]any, len(all))
	for name, schema := range all {
		strict[name] = tighten(schema)
	}
	set := Set{}
	names := make([]string, 0, len(all))
	for name := range all {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		gvks, err := groupVersionKinds(all[name])
		if err != nil {
			return nil, fmt.Errorf("openapi schema %s: %w", name, err)
		}
		if len(gvks) == 0 {
			continue
		}
		defs, err := closure(strict, name)
		if err != nil {
			return nil, err
		}
		file := map[string]any{"$schema": draft, "$ref": defsRef + name, "$defs": defs}
		for _, g := range gvks {
			if err := set.add(g, file); err != nil {
				return nil, err
			}
		}
	}
	return set, nil
}

// groupVersionKinds reads the x-kubernetes-group-version-kind of a schema.
func groupVersionKinds(schema any) ([]GVK, error) {
	m, _ := schema.(map[string]any)
	raw, ok := m["x-kubernetes-group-version-kind"]
	if !ok {
		return nil, nil
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	var gvks []GVK
	if err := json.Unmarshal(data, &gvks); err != nil {
		return nil, fmt.Errorf("x-kubernetes-group-version-kind: %w", err)
	}
	return gvks, nil
}

// closure returns the schemas that root refers to, directly or not,
// root included.
func closure(schemas map[string]any, root string) (map[string]any, error) {
	out := map[string]any{}
	todo := []string{root}
	for len(todo) > 0 {
		name := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if _, done := out[name]; done {
			continue
		}
		schema, ok := schemas[name]
		if !ok {
			return nil, fmt.Errorf("openapi: %s refers to the undefined schema %s", root, name)
		}
		out[name] = schema
		refs(schema, func(ref string) { todo = append(todo, strings.TrimPrefix(ref, defsRef)) })
	}
	return out, nil
}

// refs calls fn with every $ref in node.
func refs(node any, fn func(string)) {
	switch n := node.(type) {
	case map[string]any:
		for k, v := range n {
			if s, ok := v.(string); ok && k == "$ref" {
				fn(s)
				continue
			}
			refs(v, fn)
		}
	case []any:
		for _, v := range n {
			refs(v, fn)
		}
	}
}

// tighten returns a copy of the schema node with OpenAPI references
// rewritten to $defs and closed objects: an object schema listing its
// properties gets additionalProperties: false unless it says otherwise or
// preserves unknown fields.
func tighten(node any) any {
	schema, ok := node.(map[string]any)
	if !ok {
		return node
	}
	out := make(map[string]any, len(schema)+1)
	for k, v := range schema {
		switch k {
		case "$ref":
			if s, ok := v.(string); ok {
				v = defsRef + strings.TrimPrefix(s, openAPIRef)
			}
		case "properties", "patternProperties", "$defs", "definitions":
			if props, ok := v.(map[string]any); ok {
				tight := make(map[string]any, len(props))
				for name, sub := range props {
					tight[name] = tighten(sub)
				}
				v = tight
			}
		case "items", "additionalProperties", "not", "additionalItems":
			v = tighten(v)
		case "allOf", "anyOf", "oneOf", "prefixItems":
			if list, ok := v.([]any); ok {
				tight := make([]any, len(list))
				for i, sub := range list {
					tight[i] = tighten(sub)
				}
				v = tight
			}
		}
		out[k] = v
	}
	_, listsProperties := schema["properties"]
	_, open := schema["additionalProperties"]
	preserve, _ := schema["x-kubernetes-preserve-unknown-fields"].(bool)
	if listsProperties && !open && !preserve {
		out["additionalProperties"] = false
	}
	return out
}

// FromCRD builds a schema file for every served version of a
// CustomResourceDefinition (YAML or JSON) that has an openAPIV3Schema.
func FromCRD(data []byte) (Set, error) {
	var crd struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Group string `yaml:"group"`
			Names struct {
				Kind string `yaml:"kind"`
			} `yaml:"names"`
			Versions []struct {
				Name   string `yaml:"name"`
				Served bool   `yaml:"served"`
				Schema struct {
					OpenAPIV3Schema map[string]any `yaml:"openAPIV3Schema"`
				} `yaml:"schema"`
			} `yaml:"versions"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		return nil, fmt.Errorf("crd: %w", err)
	}
	if crd.Kind != "CustomResourceDefinition" {
		return nil, fmt.Errorf("crd: kind is %q, not CustomResourceDefinition", crd.Kind)
	}
	set := Set{}
	for _, v := range crd.Spec.Versions {
		if !v.Served || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		schema, ok := tighten(v.Schema.OpenAPIV3Schema).(map[string]any)
		if !ok {
			return nil, fmt.Errorf("crd %s %s: openAPIV3Schema is not an object", crd.Spec.Names.Kind, v.Name)
		}
		schema["$schema"] = draft
		g := GVK{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}
		if err := set.add(g, schema); err != nil {
			return nil, err
		}
	}
	if len(set) == 0 {
		return nil, fmt.Errorf("crd %s: no served version has a schema", crd.Spec.Names.Kind)
	}
	return set, nil
}

// Merge adds every schema of other to s; a file name both define
// differently is an error.
func (s Set) Merge(other Set) error {
	for name, data := range other {
		if prev, ok := s[name]; ok && string(prev) != string(data) {
			return fmt.Errorf("%s: defined twice, differently", name)
		}
		s[name] = data
	}
	return nil
}

// Write writes every schema file into dir, creating it.
func (s Set) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("schemas: %w", err)
	}
	for name, data := range s {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("schemas: %w", err)
		}
	}
	return nil
}
