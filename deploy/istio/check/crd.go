package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"istio.io/istio/pkg/config/crd"
	"sigs.k8s.io/yaml"
)

// validateCRDs checks every networking.istio.io (and other Istio group)
// object in files against the CRDs in crdFile. Objects of other groups
// (Kubernetes core objects in test fixtures) are skipped; a file with no
// Istio object at all is an error, so a wrong path cannot pass silently.
func validateCRDs(crdFile string, files []string, out io.Writer) error {
	v, err := crd.NewValidatorFromFiles(crdFile)
	if err != nil {
		return fmt.Errorf("load CRDs %s: %w", crdFile, err)
	}
	var failed []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		docs, err := istioDocuments(string(data))
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if len(docs) == 0 {
			return fmt.Errorf("%s: no Istio object", f)
		}
		for _, d := range docs {
			if err := v.ValidateCustomResourceYAML(d.text, nil); err != nil {
				failed = append(failed, fmt.Sprintf("%s: %s %s: %v", f, d.kind, d.name, err))
				continue
			}
			fmt.Fprintf(out, "%s: %s %s: valid\n", f, d.kind, d.name)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("schema violations:\n%s", strings.Join(failed, "\n"))
	}
	return nil
}

// document is one YAML document of a manifest file.
type document struct {
	apiVersion, kind, name string
	text                   string
}

// isIstio reports whether the document is an Istio custom resource.
func (d document) isIstio() bool {
	group, _, _ := strings.Cut(d.apiVersion, "/")
	return strings.HasSuffix(group, ".istio.io")
}

// splitDocuments splits a multi-document YAML file, skipping empty documents.
func splitDocuments(data string) ([]document, error) {
	var docs []document
	for _, text := range strings.Split("\n"+data, "\n---") {
		if strings.TrimSpace(stripComments(text)) == "" {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(text), &head); err != nil {
			return nil, fmt.Errorf("parse YAML document: %w", err)
		}
		if head.APIVersion == "" || head.Kind == "" {
			return nil, fmt.Errorf("a YAML document has no apiVersion or kind")
		}
		docs = append(docs, document{apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name, text: text})
	}
	return docs, nil
}

// istioDocuments returns the Istio documents of a file.
func istioDocuments(data string) ([]document, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, err
	}
	var out []document
	for _, d := range docs {
		if d.isIstio() {
			out = append(out, d)
		}
	}
	return out, nil
}

// stripComments drops whole-line YAML comments.
func stripComments(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
