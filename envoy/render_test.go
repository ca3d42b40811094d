package envoy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

func params() Params {
	return Params{
		Listen: Address{"127.0.0.1", 8080}, Admin: Address{"127.0.0.1", 9901}, Duet: Address{"127.0.0.1", 9002},
		MaxBodyBytes: 32 << 20, MessageTimeout: 2 * time.Second, StreamIdleTimeout: 15 * time.Minute,
		Prefill: []Address{{"10.0.0.1", 30000}}, Decode: []Address{{"10.0.0.2", 30000}, {"10.0.0.3", 30000}},
	}
}

// Every variant of the bootstrap must load in the real Envoy.
func TestRenderValidatesInEnvoy(t *testing.T) {
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*Params)
		want   []string
		absent []string
	}{
		{"pd", func(*Params) {},
			[]string{"cluster_header: x-duet-mirror", "name: duet_prefill", "header: x-duet-prefill-endpoint",
				"header: x-duet-decode-endpoint", "type: STATIC", "per_connection_buffer_limit_bytes: 33554432",
				"request_body_mode: BUFFERED", "failure_mode_allow: false", `prefix: "x-duet-"`},
			nil},
		{"aggregated", func(p *Params) { p.Prefill = nil }, []string{"name: duet_decode"},
			[]string{"request_mirror_policies", "duet_prefill"}},
		{"dns names", func(p *Params) { p.Decode = []Address{{"localhost", 30000}} }, []string{"type: STRICT_DNS"}, nil},
		{"sub-second timeout", func(p *Params) { p.MessageTimeout = 500 * time.Millisecond }, []string{"message_timeout: 0.5s"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := params()
			tt.mutate(&p)
			var buf bytes.Buffer
			if err := Render(&buf, p); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("bootstrap lacks %q", w)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(out, a) {
					t.Errorf("bootstrap has %q", a)
				}
			}
			path := filepath.Join(t.TempDir(), "envoy.yaml")
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(tools.Envoy, "--mode", "validate", "-c", path, "--disable-hot-restart")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("envoy rejects the bootstrap: %v\n%s", err, out)
			}
		})
	}
}

func TestRenderRejectsBadParams(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Params)
	}{
		{"no decode", func(p *Params) { p.Decode = nil }},
		{"no body limit", func(p *Params) { p.MaxBodyBytes = 0 }},
		{"no timeout", func(p *Params) { p.MessageTimeout = 0 }},
		{"yaml injection", func(p *Params) { p.Decode = []Address{{"a\"}\n- x", 1}} }},
		{"empty host", func(p *Params) { p.Duet = Address{"", 1} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := params()
			tt.mutate(&p)
			if err := Render(&bytes.Buffer{}, p); err == nil {
				t.Fatal("Render accepted bad params")
			}
		})
	}
}

func TestParseAddress(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Address
		ok   bool
	}{
		{"127.0.0.1:80", Address{"127.0.0.1", 80}, true},
		{":9002", Address{"0.0.0.0", 9002}, true},
		{"[::1]:9002", Address{"::1", 9002}, true},
		{"host:70000", Address{}, false},
		{"nohost", Address{}, false},
	} {
		got, err := ParseAddress(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("ParseAddress(%q) = %v, %v", tt.in, got, err)
		}
	}
}
