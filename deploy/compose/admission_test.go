package compose

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// uncommentAdmission returns config with its commented admission example
// ("# admission:" and the "#   " lines under it) made live, or fails.
func uncommentAdmission(t *testing.T, config string) string {
	t.Helper()
	lines := strings.Split(config, "\n")
	start := slices.Index(lines, "# admission:")
	if start < 0 {
		t.Fatal("no commented admission example (\"# admission:\")")
	}
	for i := start; i < len(lines); i++ {
		if i > start && !strings.HasPrefix(lines[i], "#   ") {
			break
		}
		lines[i] = strings.TrimPrefix(lines[i], "# ")
	}
	return strings.Join(lines, "\n")
}

// exampleHeaders are the headers the example's comment has clients send
// (curl -H 'name: value').
var exampleHeaders = regexp.MustCompile(`-H '([a-z-]+): ([^']+)'`)

// strippedBy returns the header removals of an Envoy bootstrap's early
// header mutations: the exact names, and the prefixes removed on match.
func strippedBy(t *testing.T, bootstrap []byte) (names, prefixes []string) {
	t.Helper()
	var doc any
	if err := yaml.Unmarshal(bootstrap, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if m, ok := v["mutations"].([]any); ok {
				for _, mu := range m {
					mu, _ := mu.(map[string]any)
					if name, ok := mu["remove"].(string); ok {
						names = append(names, name)
					}
					if r, ok := mu["remove_on_match"].(map[string]any); ok {
						if p, ok := r["key_matcher"].(map[string]any)["prefix"].(string); ok {
							prefixes = append(prefixes, p)
						}
					}
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	return names, prefixes
}

// TestAdmissionExample: the admission example that duet.yaml and
// duet.pools.yaml carry commented out loads in duet when uncommented
// (`duet envoy-config` loads and validates it as serve does); the headers
// its comment has clients send name the example's class and tenant
// headers and one of its classes; and the Envoy duet renders for it lets
// those headers through (duet's Envoy strips every x-duet-* header
// clients send, so a header clients set must be another).
func TestAdmissionExample(t *testing.T) {
	for _, file := range []string{"duet.yaml", poolsDuetYAML} {
		t.Run(file, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			live := uncommentAdmission(t, string(data))
			path := filepath.Join(t.TempDir(), file)
			if err := os.WriteFile(path, []byte(live), 0o644); err != nil {
				t.Fatal(err)
			}
			bootstrap := renderEnvoy(t, path)

			var cfg struct {
				Admission struct {
					Classes []struct {
						Name string `yaml:"name"`
					} `yaml:"classes"`
					ClassHeader        string `yaml:"class_header"`
					TenantHeader       string `yaml:"tenant_header"`
					TrustClientHeaders bool   `yaml:"trust_client_headers"`
				} `yaml:"admission"`
			}
			if err := yaml.Unmarshal([]byte(live), &cfg); err != nil {
				t.Fatal(err)
			}
			a := cfg.Admission
			if len(a.Classes) < 2 || a.TenantHeader == "" {
				t.Fatalf("the example has classes %v and tenant header %q: want two classes and a tenant header", a.Classes, a.TenantHeader)
			}
			sent := map[string]string{}
			for _, m := range exampleHeaders.FindAllStringSubmatch(string(data), -1) {
				sent[m[1]] = m[2]
			}
			var classes []string
			for _, c := range a.Classes {
				classes = append(classes, c.Name)
			}
			if !slices.Contains(classes, sent[a.ClassHeader]) {
				t.Errorf("the comment sends %v: want %s naming one of the classes %v", sent, a.ClassHeader, classes)
			}
			if _, ok := sent[a.TenantHeader]; !ok {
				t.Errorf("the comment sends %v: want the tenant header %s", sent, a.TenantHeader)
			}
			names, prefixes := strippedBy(t, bootstrap)
			if len(prefixes) == 0 {
				t.Fatal("the rendered Envoy strips no header prefix: is this duet's bootstrap?")
			}
			for _, h := range []string{a.ClassHeader, a.TenantHeader} {
				stripped := slices.Contains(names, h) || slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(h, p) })
				if stripped {
					t.Errorf("header %s: duet's Envoy strips it from clients (removes %v, prefixes %v)", h, names, prefixes)
				}
			}
			if !a.TrustClientHeaders {
				t.Errorf("headers %s and %s come from clients: the example must say trust_client_headers", a.ClassHeader, a.TenantHeader)
			}
		})
	}
}
