package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseDefaults(t *testing.T) {
	cfg, err := Parse([]byte(`
prefill:
  - url: http://10.0.0.1:30000
    bootstrap_port: 9000
decode:
  - url: http://10.0.0.2:30000
listen:
  grpc: 0.0.0.0:9102
auth:
  token_file: /run/duet/token
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Envoy.Duet != "127.0.0.1:9102" {
		t.Errorf("envoy.duet = %q, want 127.0.0.1:9102", cfg.Envoy.Duet)
	}
	if cfg.Policy.Prefill.Name != DefaultPrefillPolicy || cfg.Policy.Decode.Name != DefaultDecodePolicy {
		t.Errorf("policies = %+v", cfg.Policy)
	}
	if cfg.Request.MaxBodyBytes != DefaultMaxBodyBytes || cfg.Envoy.MessageTimeout != 2*time.Second {
		t.Errorf("defaults not applied: %+v %+v", cfg.Request, cfg.Envoy)
	}
	if cfg.Prefill[0].BootstrapPort != 9000 {
		t.Errorf("bootstrap port = %d", cfg.Prefill[0].BootstrapPort)
	}
}

// parseErrorCase is a configuration that must not load, and the texts its
// error must contain (the field's name first).
type parseErrorCase struct {
	name string
	yaml string
	want []string
}

// checkParseErrors runs Parse on each case and checks its error: it
// contains every wanted part and names no Go type.
func checkParseErrors(t *testing.T, tests []parseErrorCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "config.") || strings.Contains(err.Error(), "time.Duration") {
				t.Errorf("error %q names Go types", err)
			}
		})
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	checkParseErrors(t, []parseErrorCase{
		{"no decode", `prefill: [{url: "http://a:1"}]`, []string{"decode: at least one endpoint"}},
		{"bad url scheme", `decode: [{url: "https://a:1"}]`, []string{"decode[0].url", "scheme must be http"}},
		{"url with path", `decode: [{url: "http://a:1/v1"}]`, []string{"decode[0].url", "must not have a path"}},
		{"missing url", `decode: [{dp_size: 2}]`, []string{"decode[0].url: is required"}},
		{"duplicate", `{prefill: [{url: "http://a:1"}], decode: [{url: "http://a:1"}]}`, []string{"decode[0].url", "already listed as prefill[0]"}},
		{"decode bootstrap", `decode: [{url: "http://a:1", bootstrap_port: 8998}]`, []string{"decode[0].bootstrap_port"}},
		{"negative dp", `decode: [{url: "http://a:1", dp_size: -1}]`, []string{"decode[0].dp_size"}},
		{"bad listen", `{decode: [{url: "http://a:1"}], listen: {grpc: "nope"}}`, []string{"listen.grpc"}},
		{"unknown field", `{decode: [{url: "http://a:1"}], bogus: 1}`, []string{"line 1: bogus: unknown key; the top level takes admission, auth,"}},
		{"bad level", `{decode: [{url: "http://a:1"}], log_level: loud}`, []string{"log_level"}},
		{"tiny body", `{decode: [{url: "http://a:1"}], request: {max_body_bytes: 10}}`, []string{"request.max_body_bytes"}},
		{"bad duration", `{decode: [{url: "http://a:1"}], discovery: {interval: soon}}`, []string{`line 1: discovery.interval: "soon" is not a duration`}},
		{"policy unknown key", `{decode: [{url: "http://a:1"}], policy: {decode: {name: weighted, wieghts: {}}}}`, []string{`line 1: policy.decode.wieghts: unknown key: did you mean "weights"?`}},
		{"policy list", `{decode: [{url: "http://a:1"}], policy: {decode: [a]}}`, []string{"line 1: policy.decode: a policy name or a mapping (name and parameters) goes here, not a list"}},
		{"negative load", `{decode: [{url: "http://a:1"}], load: {stale_after: -1s, concurrency: -2}}`, []string{"load.stale_after", "load.concurrency"}},
		{"health unknown key", `{decode: [{url: "http://a:1"}], health: {intervall: 1s}}`, []string{`line 1: health.intervall: unknown key: did you mean "interval"?`}},
		{"health negative durations", `{decode: [{url: "http://a:1"}], health: {timeout: -1s, base_ejection: -2s}}`, []string{"health.timeout", "health.base_ejection"}},
		{"health max below base", `{decode: [{url: "http://a:1"}], health: {base_ejection: 10s, max_ejection: 5s}}`, []string{"health.max_ejection", "below health.base_ejection"}},
		{"health timeout above interval", `{decode: [{url: "http://a:1"}], health: {interval: 1s, timeout: 2s}}`, []string{"health.timeout", "longer than health.interval"}},
		{"health path", `{decode: [{url: "http://a:1"}], health: {path: "health?x=1"}}`, []string{"health.path"}},
		{"health thresholds", `{decode: [{url: "http://a:1"}], health: {unreachable_to_eject: -2, failures_to_eject: -5, probe_failures: -3}}`,
			[]string{"health.unreachable_to_eject", "health.failures_to_eject", "health.probe_failures"}},
	})
}

func TestParsePolicies(t *testing.T) {
	cfg, err := Parse([]byte(`
decode: [{url: "http://a:1"}]
load: {interval: 250ms, stale_after: 2s}
policy:
  prefill: prefix_hash
  decode:
    name: weighted
    weights: {tokens: 2, prefix: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Policy.Prefill.Name != "prefix_hash" || cfg.Policy.Decode.Name != "weighted" || cfg.Policy.Decode.Weights["tokens"] != 2 {
		t.Errorf("policies = %+v", cfg.Policy)
	}
	if cfg.Load.Interval != 250*time.Millisecond || cfg.Load.StaleAfter != 2*time.Second {
		t.Errorf("load = %+v", cfg.Load)
	}
}

func TestParseHealth(t *testing.T) {
	cfg, err := Parse([]byte(`decode: [{url: "http://a:1"}]`))
	if err != nil {
		t.Fatal(err)
	}
	want := HealthOptions{
		Interval: 5 * time.Second, Timeout: time.Second, Path: "/health",
		UnreachableToEject: 1, FailuresToEject: 5, ProbeFailures: 2,
		BaseEjection: 5 * time.Second, MaxEjection: 2 * time.Minute,
	}
	if cfg.Health != want {
		t.Errorf("health defaults = %+v, want %+v", cfg.Health, want)
	}
	cfg, err = Parse([]byte(`
decode: [{url: "http://a:1"}]
health:
  interval: -1s
  timeout: 300ms
  path: /healthz
  unreachable_to_eject: 2
  failures_to_eject: -1
  probe_failures: 3
  base_ejection: 1s
  max_ejection: 30s
`))
	if err != nil {
		t.Fatal(err)
	}
	want = HealthOptions{
		Interval: -time.Second, Timeout: 300 * time.Millisecond, Path: "/healthz",
		UnreachableToEject: 2, FailuresToEject: -1, ProbeFailures: 3,
		BaseEjection: time.Second, MaxEjection: 30 * time.Second,
	}
	if cfg.Health != want {
		t.Errorf("health = %+v, want %+v", cfg.Health, want)
	}
}

func TestParseAuth(t *testing.T) {
	const pool = `decode: [{url: "http://a:1"}], `
	checkParseErrors(t, []parseErrorCase{
		{"open port without auth", `{` + pool + `listen: {grpc: "0.0.0.0:9002"}}`, []string{"auth: listen.grpc 0.0.0.0:9002 is reachable beyond loopback"}},
		{"pod IP without auth", `{` + pool + `listen: {grpc: "10.1.2.3:9002"}}`, []string{"auth: listen.grpc"}},
		{"empty host without auth", `{` + pool + `listen: {grpc: ":9002"}}`, []string{"auth: listen.grpc"}},
		{"tls without files", `{` + pool + `auth: {tls: {cert_file: c}}}`, []string{"auth.tls.key_file: is required", "auth.tls.client_ca_file: is required"}},
		{"duet_tls without auth.tls", `{` + pool + `envoy: {duet_tls: {cert_file: c, key_file: k, ca_file: ca}}}`, []string{"envoy.duet_tls: set without auth.tls"}},
		{"duet_tls without files", `{` + pool + `auth: {tls: {cert_file: c, key_file: k, client_ca_file: ca}}, envoy: {duet_tls: {cert_file: c}}}`,
			[]string{"envoy.duet_tls.key_file", "envoy.duet_tls.ca_file"}},
		{"unauthenticated and a token", `{` + pool + `auth: {unauthenticated: true, token_file: t}}`, []string{"auth.unauthenticated: set together"}},
	})
	for _, ok := range []string{
		`{` + pool + `listen: {grpc: "127.0.0.1:9002"}}`,
		`{` + pool + `listen: {grpc: "[::1]:9002"}}`,
		`{` + pool + `listen: {grpc: "localhost:9002"}}`,
		`{` + pool + `listen: {grpc: "0.0.0.0:9002"}, auth: {token_file: /t}}`,
		`{` + pool + `listen: {grpc: "0.0.0.0:9002"}, auth: {tls: {cert_file: c, key_file: k, client_ca_file: ca}}}`,
		`{` + pool + `listen: {grpc: "0.0.0.0:9002"}, auth: {unauthenticated: true}}`,
	} {
		if _, err := Parse([]byte(ok)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// envoy.duet_replicas replaces envoy.duet: listed replicas leave envoy.duet
// unset, and each address must be one Envoy can dial.
func TestParseDuetReplicas(t *testing.T) {
	const pool = `decode: [{url: "http://a:1"}], `
	cfg, err := Parse([]byte(`{` + pool + `envoy: {duet_replicas: ["10.0.0.5:9002", "duet-1.duet.svc:9002", "[fd00::7]:9002"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Envoy.Duet != "" || len(cfg.Envoy.DuetReplicas) != 3 {
		t.Errorf("envoy.duet = %q, envoy.duet_replicas = %q: want no envoy.duet and three replicas", cfg.Envoy.Duet, cfg.Envoy.DuetReplicas)
	}
	checkParseErrors(t, []parseErrorCase{
		{"with envoy.duet", `{` + pool + `envoy: {duet: "10.0.0.5:9002", duet_replicas: ["10.0.0.6:9002"]}}`,
			[]string{"envoy.duet_replicas: set together with envoy.duet"}},
		{"not host:port", `{` + pool + `envoy: {duet_replicas: ["10.0.0.5"]}}`, []string{"envoy.duet_replicas[0]", "not host:port"}},
		{"bad port", `{` + pool + `envoy: {duet_replicas: ["10.0.0.5:9002", "10.0.0.6:99999"]}}`, []string{"envoy.duet_replicas[1]", "no valid port"}},
		{"port 0", `{` + pool + `envoy: {duet_replicas: ["10.0.0.5:0"]}}`, []string{"envoy.duet_replicas[0]", "port 0"}},
		{"no host", `{` + pool + `envoy: {duet_replicas: [":9002"]}}`, []string{"envoy.duet_replicas[0]", "names no host"}},
		{"unspecified host", `{` + pool + `envoy: {duet_replicas: ["0.0.0.0:9002"]}}`, []string{"envoy.duet_replicas[0]", "names no host"}},
		{"duplicate", `{` + pool + `envoy: {duet_replicas: ["10.0.0.5:9002", "10.0.0.5:9002"]}}`,
			[]string{"envoy.duet_replicas[1]", "already listed as envoy.duet_replicas[0]"}},
	})
}
