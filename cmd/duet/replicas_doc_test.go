package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/duet-router/duet/cmd/duet/internal/config"
)

// replicasDoc is the page whose two-replica example TestReplicasDocExample
// proves.
const replicasDoc = "../../docs/replicas.md"

// docExample returns the fenced block after the "<!-- example: NAME -->"
// marker of doc.
func docExample(t *testing.T, doc, name string) string {
	t.Helper()
	re := regexp.MustCompile("(?s)<!-- example: " + regexp.QuoteMeta(name) + " -->\n```[a-z]*\n(.*?)```")
	m := re.FindStringSubmatch(doc)
	if m == nil {
		t.Fatalf("%s has no block after <!-- example: %s -->", replicasDoc, name)
	}
	return m[1]
}

// TestReplicasDocExample loads docs/replicas.md's two-replica duet.yaml with
// the credentials its steps make, as `duet serve` would (files included),
// renders its Envoy bootstrap, and checks that the page's excerpt of the
// bootstrap is in it and that both clusters that reach duet list both
// replicas.
func TestReplicasDocExample(t *testing.T) {
	data, err := os.ReadFile(replicasDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	dir := t.TempDir()
	path := filepath.Join(dir, "duet.yaml")
	if err := os.WriteFile(path, []byte(docExample(t, doc, "replicas duet.yaml")), 0o644); err != nil {
		t.Fatal(err)
	}
	// Step 1: the credentials, and a token for NATS.
	ctx := context.Background()
	if err := run(ctx, []string{"certs", "-out", filepath.Join(dir, "creds")}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "creds", "nats-token"), []byte("c2VjcmV0LXRva2VuLWZvci1uYXRzLXNlcnZlci0xMjM0NTY3OA==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadServing(path)
	if err != nil {
		t.Fatalf("the example does not load: %v", err)
	}
	if cfg.Sync == nil || cfg.Sync.NATS.URL == "" {
		t.Fatalf("the example has no sync.nats section")
	}
	if len(cfg.Envoy.DuetReplicas) != 2 {
		t.Fatalf("envoy.duet_replicas = %v, want two replicas", cfg.Envoy.DuetReplicas)
	}

	// Step 4: the bootstrap.
	var out bytes.Buffer
	if err := run(ctx, []string{"envoy-config", "-config", path}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	bootstrap := out.String()
	for _, line := range strings.Split(docExample(t, doc, "replicas envoy.yaml"), "\n") {
		if line = strings.TrimSpace(line); line == "" || line == "..." || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.Contains(bootstrap, line) {
			t.Errorf("the page's bootstrap excerpt has %q, which `duet envoy-config` does not write", line)
		}
	}
	for _, replica := range []string{`{address: "10.0.0.5", port_value: 9002}`, `{address: "10.0.0.6", port_value: 9002}`} {
		if n := strings.Count(bootstrap, replica); n != 2 {
			t.Errorf("the bootstrap lists %s %d times, want twice (duet_extproc and duet_feedback)", replica, n)
		}
	}
}
