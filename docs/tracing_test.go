package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestTracingRunsTheBuiltJaeger checks tracing.md's "A Jaeger on one
// machine": it names the binary `make jaeger` builds (the Makefile's
// .tools/jaeger-VERSION/jaeger, for the version e2e/jaeger/go.mod pins),
// and its configuration with a UI is YAML whose OTLP receiver is the
// otlp.endpoint the section gives duet.
func TestTracingRunsTheBuiltJaeger(t *testing.T) {
	mod, err := os.ReadFile("../e2e/jaeger/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\tgithub\.com/jaegertracing/jaeger (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("e2e/jaeger/go.mod requires no github.com/jaegertracing/jaeger")
	}
	bin := ".tools/jaeger-" + string(m[1]) + "/jaeger"
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "JAEGER_BIN     := $(TOOLS)/jaeger-$(JAEGER_VERSION)/jaeger") {
		t.Fatal("the Makefile's JAEGER_BIN is no longer .tools/jaeger-$(JAEGER_VERSION)/jaeger: update this test and tracing.md")
	}
	data, err := os.ReadFile("tracing.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	_, section, ok := strings.Cut(page, "\n### A Jaeger on one machine\n")
	if !ok {
		t.Fatal(`tracing.md has no section "A Jaeger on one machine"`)
	}
	section, _, _ = strings.Cut(section, "\n### ")
	if !strings.Contains(section, "\n"+bin+" > jaeger.log") || !strings.Contains(section, bin+" --config jaeger.yaml") {
		t.Errorf("the section does not run %s, the binary make jaeger builds", bin)
	}
	for _, named := range regexp.MustCompile(`\.tools/jaeger-[^/]+/jaeger`).FindAllString(page, -1) {
		if named != bin {
			t.Errorf("tracing.md names %s; make jaeger builds %s", named, bin)
		}
	}

	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) != 2 {
		t.Fatalf("%d YAML blocks in the section, want duet's otlp section and Jaeger's configuration", len(blocks))
	}
	var duet struct {
		OTLP struct {
			Endpoint string `yaml:"endpoint"`
		} `yaml:"otlp"`
	}
	if err := yaml.Unmarshal([]byte(blocks[0][1]), &duet); err != nil {
		t.Fatalf("duet's block: %v", err)
	}
	var jaeger struct {
		Receivers struct {
			OTLP struct {
				Protocols struct {
					GRPC struct {
						Endpoint string `yaml:"endpoint"`
					} `yaml:"grpc"`
				} `yaml:"protocols"`
			} `yaml:"otlp"`
		} `yaml:"receivers"`
		Extensions struct {
			Query struct {
				UI struct {
					AssetsPath string `yaml:"assets_path"`
				} `yaml:"ui"`
			} `yaml:"jaeger_query"`
		} `yaml:"extensions"`
	}
	if err := yaml.Unmarshal([]byte(blocks[1][1]), &jaeger); err != nil {
		t.Fatalf("Jaeger's block: %v", err)
	}
	if got := jaeger.Receivers.OTLP.Protocols.GRPC.Endpoint; got == "" || got != duet.OTLP.Endpoint {
		t.Errorf("Jaeger's OTLP/gRPC receiver %q, duet's otlp.endpoint %q: want the same", got, duet.OTLP.Endpoint)
	}
	if jaeger.Extensions.Query.UI.AssetsPath == "" {
		t.Error("Jaeger's configuration names no UI assets (jaeger_query.ui.assets_path)")
	}
}
