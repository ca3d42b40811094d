package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each configuration error names its key path and line and says what to
// write instead.
func TestErrorsNameKeyLineAndFix(t *testing.T) {
	const engine = "decode:\n  - url: http://10.0.0.1:30000\n"
	// want: the key path with its line, then the suggestion.
	checkParseErrors(t, []parseErrorCase{
		{"unknown key in a pool", `pools:
  - name: a
    models: [m]
    decode: [{url: "http://10.0.0.1:30000"}]
    polcy: {decode: least_tokens}
`, []string{`line 5: pools[0].polcy: unknown key`, `did you mean "policy"?`}},
		{"unknown top-level key", engine + "lod: {interval: 1s}\n", []string{`line 3: lod: unknown key`, `did you mean "load"?`}},
		{"unknown key, nothing near", engine + "listen: {grpc: 127.0.0.1:1, metrics: x}\n", []string{`line 3: listen.metrics: unknown key`, `listen takes admin, grpc, pprof`}},
		{"duration without a unit", engine + "load:\n  interval: 5\n", []string{`line 4: load.interval: 5 is not a duration`, `write "5s"`}},
		{"duration in words", engine + "health:\n  timeout: 5 seconds\n", []string{`line 4: health.timeout: "5 seconds" is not a duration`, `such as 500ms, 5s`}},
		{"word for a number", engine + "request: {max_body_bytes: lots}\n", []string{`line 3: request.max_body_bytes: "lots" is not a whole number`}},
		{"url without a scheme", "decode:\n  - url: 10.0.0.5:30000\n", []string{`line 2: decode[0].url: "10.0.0.5:30000" has no scheme`, `write http://host:port (here "http://10.0.0.5:30000")`}},
		{"url without a scheme in a pool", `pools:
  - name: a
    models: [m]
    decode:
      - url: "http://10.0.0.1:30000"
      - url: engine-1:30000
`, []string{`line 6: pools[0].decode[1].url: "engine-1:30000" has no scheme`, `(here "http://engine-1:30000")`}},
		{"bad policy name", engine + "policy:\n  prefill: least_cost\n  decode: least_token\n", []string{`line 5: policy.decode: "least_token" is not a policy`,
			`did you mean "least_tokens"?`, "valid: cache_aware, least_cost, least_tokens, power_of_two, prefix_hash, random, round_robin, weighted"}},
		{"bad policy name as a mapping", engine + "policy:\n  decode:\n    name: cache_awar\n", []string{`line 4: policy.decode: "cache_awar" is not a policy`, `did you mean "cache_aware"?`}},
		{"bad policy name in a pool", `pools:
  - name: a
    models: [m]
    decode: [{url: "http://10.0.0.1:30000"}]
    policy:
      prefill: fastest
`, []string{`line 6: pools[0].policy.prefill: "fastest" is not a policy (valid: cache_aware,`}},
		{"a mapping for a list", "decode: {url: http://10.0.0.1:30000}\n", []string{`line 1: decode: a list goes here, not a mapping`}},
		{"a list for a mapping", engine + "listen: [127.0.0.1:9002]\n", []string{`line 3: listen: a mapping of keys to values goes here, not a list`}},
		{"a value for a mapping", engine + "health: 5s\n", []string{`line 3: health: a mapping of keys to values goes here, not "5s"`}},
		{"a list for a value", engine + "log_level: [info]\n", []string{`line 3: log_level: a single value goes here, not a list`}},
		{"validation error", engine + "log_level: loud\n", []string{`line 3: log_level: "loud" is not one of debug, info, warn, error`}},
	})
}

// A file duet reads is named by its key and line when missing, with how to
// make it; relative paths are relative to the configuration file.
func TestLoadServingMissingFiles(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"admin token", "decode: [{url: \"http://10.0.0.1:30000\"}]\nauth:\n  admin_token_file: creds/admin-tokn\n", []string{
			"line 3: auth.admin_token_file: open " + filepath.Join(dir, "creds/admin-tokn") + ": no such file or directory",
			`: make it with "duet certs -out DIR", which writes it with duet's other credentials (docs/security.md), or fix the path ` +
				"(a relative one is relative to the configuration file's directory, " + dir + ")"}},
		{"tls key", "decode: [{url: \"http://10.0.0.1:30000\"}]\nauth:\n  tls:\n    cert_file: creds/duet.crt\n    key_file: /nonexistent/duet.key\n    client_ca_file: creds/ca.crt\n", []string{
			"line 5: auth.tls.key_file: open /nonexistent/duet.key: no such file or directory", `"duet certs -out DIR"`}},
		{"nats token", "decode: [{url: \"http://10.0.0.1:30000\"}]\nsync:\n  nats: {url: \"nats://127.0.0.1:4222\", token_file: nats-token}\n", []string{
			"line 3: sync.nats.token_file: open " + filepath.Join(dir, "nats-token") + ": no such file or directory"}},
	}
	if err := os.MkdirAll(filepath.Join(dir, "creds"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"creds/duet.crt", "creds/ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "duet.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := Load(path); err != nil {
				t.Fatalf("Load checks no files, yet: %v", err)
			}
			_, err := LoadServing(path)
			if err == nil {
				t.Fatal("LoadServing succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "duet.crt") || strings.Contains(err.Error(), "ca.crt") {
				t.Errorf("error %q names a file that exists", err)
			}
		})
	}
}

// Relative paths of the files duet reads are relative to the configuration
// file's directory, whatever the working directory; Envoy's (envoy.duet_tls)
// stay as written.
func TestLoadResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(t.TempDir())
	path := filepath.Join(dir, "duet.yaml")
	yaml := `decode: [{url: "http://10.0.0.1:30000"}]
auth:
  tls: {cert_file: creds/duet.crt, key_file: /abs/duet.key, client_ca_file: ../ca.crt}
  admin_token_file: creds/admin-token
envoy:
  duet_tls: {cert_file: creds/envoy.crt, key_file: creds/envoy.key, ca_file: creds/ca.crt}
sync:
  nats: {url: "nats://127.0.0.1:4222", creds_file: nats.creds}
tokenizer: {file: tok/tokenizer.json, config: tok/tokenizer_config.json}
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ field, got, want string }{
		{"auth.tls.cert_file", cfg.Auth.TLS.CertFile, filepath.Join(dir, "creds/duet.crt")},
		{"auth.tls.key_file", cfg.Auth.TLS.KeyFile, "/abs/duet.key"},
		{"auth.tls.client_ca_file", cfg.Auth.TLS.ClientCAFile, filepath.Join(filepath.Dir(dir), "ca.crt")},
		{"auth.admin_token_file", cfg.Auth.AdminTokenFile, filepath.Join(dir, "creds/admin-token")},
		{"auth.token_file", cfg.Auth.TokenFile, ""},
		{"sync.nats.creds_file", cfg.Sync.NATS.CredsFile, filepath.Join(dir, "nats.creds")},
		{"tokenizer.file", cfg.Tokenizer.File, filepath.Join(dir, "tok/tokenizer.json")},
		{"envoy.duet_tls.cert_file", cfg.Envoy.DuetTLS.CertFile, "creds/envoy.crt"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.field, c.got, c.want)
		}
	}
}

// The nearest key is found by edit distance, or as a prefix.
func TestNearest(t *testing.T) {
	names := []string{"policy", "pools", "prefill", "prefix", "wait_limit", "weights"}
	for _, tt := range []struct{ in, want string }{
		{"polcy", "policy"}, {"pool", "pools"}, {"prefil", "prefill"}, {"perfix", "prefix"},
		{"wait", "wait_limit"}, {"wieghts", "weights"}, {"zzz", ""}, {"x", ""},
	} {
		if got := nearest(tt.in, names); got != tt.want {
			t.Errorf("nearest(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
