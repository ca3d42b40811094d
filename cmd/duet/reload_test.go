package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/scheduler"
)

// baseConfig is the running configuration of the reload tests.
const baseConfig = `
listen: {grpc: "127.0.0.1:9002", admin: "127.0.0.1:9003"}
log_level: info
prefill: [{url: "http://10.0.0.1:30000"}]
decode: [{url: "http://10.0.0.2:30000"}, {url: "http://10.0.0.3:30000", dp_size: 2}]
policy: {prefill: cache_aware, decode: least_tokens}
health: {interval: 5s}
envoy: {listen: "127.0.0.1:8080"}
`

// Only the endpoint lists apply live; every other field that differs is
// named for a restart, by its YAML path.
func TestRestartFields(t *testing.T) {
	tests := []struct {
		name    string
		replace [][2]string // edits of baseConfig
		append  string      // YAML appended to baseConfig
		want    []string
	}{
		{name: "same file"},
		{name: "endpoints only", replace: [][2]string{
			{`decode: [{url: "http://10.0.0.2:30000"}, {url: "http://10.0.0.3:30000", dp_size: 2}]`, `decode: [{url: "http://10.0.0.4:30000", dp_size: 4}]`},
			{`prefill: [{url: "http://10.0.0.1:30000"}]`, `prefill: [{url: "http://10.0.0.1:30000", bootstrap_port: 9000}, {url: "http://10.0.0.5:30000"}]`},
		}},
		{name: "listen", replace: [][2]string{{`grpc: "127.0.0.1:9002"`, `grpc: "127.0.0.1:9102"`}, {`admin: "127.0.0.1:9003"`, `admin: "127.0.0.1:9103"`}},
			want: []string{"listen.grpc", "listen.admin", "envoy.duet"}}, // envoy.duet defaults to listen.grpc
		{name: "log level", replace: [][2]string{{"log_level: info", "log_level: debug"}}, want: []string{"log_level"}},
		{name: "policy", replace: [][2]string{{"decode: least_tokens}", "decode: {name: weighted, weights: {tokens: 2}}}"}},
			want: []string{"policy.decode.name", "policy.decode.weights"}},
		{name: "envoy", replace: [][2]string{{`envoy: {listen: "127.0.0.1:8080"}`, `envoy: {listen: "127.0.0.1:8081", message_timeout: 3s}`}},
			want: []string{"envoy.listen", "envoy.message_timeout"}},
		{name: "sections added", append: "engine_ranks: true\nload: {interval: 2s}\nrequest: {max_body_bytes: 2048}\ndiscovery: {timeout: 1s}\n",
			want: []string{"engine_ranks", "discovery.timeout", "load.interval", "request.max_body_bytes"}},
		{name: "health and endpoints", replace: [][2]string{{"health: {interval: 5s}", "health: {interval: 1s}"}, {`{url: "http://10.0.0.2:30000"}, `, ""}},
			want: []string{"health.interval"}},
	}
	running := mustParse(t, baseConfig)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := baseConfig
			for _, r := range tt.replace {
				if !strings.Contains(text, r[0]) {
					t.Fatalf("baseConfig lacks %q", r[0])
				}
				text = strings.Replace(text, r[0], r[1], 1)
			}
			got := restartFields(running, mustParse(t, text+tt.append))
			if !slices.Equal(got, tt.want) {
				t.Errorf("restartFields = %q, want %q", got, tt.want)
			}
		})
	}
}

func mustParse(t *testing.T, text string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(text))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return cfg
}

// fakeSetter records SetEndpoints calls and returns err.
type fakeSetter struct {
	calls           int
	prefill, decode []scheduler.EndpointSpec
	err             error
	pd              bool // what PD reports
}

func (f *fakeSetter) PD() bool { return f.pd }

func (f *fakeSetter) SetEndpoints(_ context.Context, prefill, decode []scheduler.EndpointSpec) error {
	f.calls++
	if f.err == nil {
		f.prefill, f.decode = prefill, decode
	}
	return f.err
}

// A reload applies the file's endpoint lists and warns about the rest; a
// file that does not load, or lists the scheduler rejects, change nothing.
// Each outcome is counted.
func TestReload(t *testing.T) {
	tests := []struct {
		name        string
		file        string // "" leaves no file
		setErr      error
		want        string
		wantDecode  []string // URLs applied; nil: SetEndpoints must not succeed
		wantWarning []string // fields named for a restart
		wantError   string   // in the error log
	}{
		{
			name: "endpoints", want: reloadOK,
			file:       strings.Replace(baseConfig, `{url: "http://10.0.0.2:30000"}, `, "", 1),
			wantDecode: []string{"http://10.0.0.3:30000"},
		},
		{
			name: "endpoints and a restart field", want: reloadOK,
			file:        strings.Replace(strings.Replace(baseConfig, "log_level: info", "log_level: warn", 1), `decode: [`, `decode: [{url: "http://10.0.0.9:30000"}, `, 1),
			wantDecode:  []string{"http://10.0.0.9:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"},
			wantWarning: []string{"log_level"},
		},
		{name: "bad yaml", file: "decode: [", want: reloadInvalid, wantError: "parse yaml"},
		{name: "invalid field", file: strings.Replace(baseConfig, "dp_size: 2", "dp_size: -2", 1), want: reloadInvalid, wantError: "dp_size"},
		{name: "unknown field", file: baseConfig + "colour: blue\n", want: reloadInvalid, wantError: "colour"},
		{name: "missing file", want: reloadInvalid, wantError: "read config"},
		{
			name: "lists the scheduler refuses", want: reloadInvalid, wantError: "two URLs name one engine",
			file:   strings.Replace(baseConfig, `decode: [`, `decode: [{url: "http://10.0.0.9:30000"}, `, 1),
			setErr: errors.New("scheduler: two URLs name one engine"),
		},
		{
			name: "mode change", want: reloadInvalid, wantError: "mode",
			file:   strings.Replace(baseConfig, `prefill: [{url: "http://10.0.0.1:30000"}]`, "", 1),
			setErr: fmt.Errorf("scheduler: %w", scheduler.ErrModeChange),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, baseConfig)
			if tt.file == "" {
				os.Remove(path)
			} else if err := os.WriteFile(path, []byte(tt.file), 0o644); err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zapcore.InfoLevel)
			running := mustParse(t, baseConfig)
			set := &fakeSetter{err: tt.setErr, pd: running.PoolList()[0].PD()}
			reg := prometheus.NewRegistry()
			r := newReloader(path, running, map[string]endpointSetter{"default": set}, zap.New(core), reg)

			if got := r.reload(context.Background()); got != tt.want {
				t.Errorf("reload = %q, want %q", got, tt.want)
			}
			if n := testutil.ToFloat64(r.reloads.WithLabelValues(tt.want)); n != 1 {
				t.Errorf("duet_config_reloads_total{outcome=%q} = %v, want 1", tt.want, n)
			}
			var applied []string
			for _, ep := range set.decode {
				applied = append(applied, ep.URL)
			}
			if !slices.Equal(applied, tt.wantDecode) {
				t.Errorf("applied decode %q, want %q", applied, tt.wantDecode)
			}
			if tt.want == reloadOK && len(r.running.Decode) != len(tt.wantDecode) {
				t.Errorf("running config has %d decode endpoints, want %d", len(r.running.Decode), len(tt.wantDecode))
			}
			if tt.want == reloadInvalid && !slices.Equal(r.running.Decode, running.Decode) {
				t.Error("a rejected reload changed the running endpoints")
			}
			warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
			switch {
			case tt.wantWarning == nil && len(warns) > 0:
				t.Errorf("unexpected warning %q", warns[0].Message)
			case tt.wantWarning != nil:
				if len(warns) != 1 || !slices.Equal(warns[0].ContextMap()["fields"].([]any), toAny(tt.wantWarning)) {
					t.Errorf("warnings %v, want one naming %q", warns, tt.wantWarning)
				}
			}
			errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
			switch {
			case tt.wantError == "" && len(errs) > 0:
				t.Errorf("unexpected error log %v", errs[0].ContextMap())
			case tt.wantError != "":
				if len(errs) != 1 || !strings.Contains(fmt.Sprint(errs[0].ContextMap()["error"]), tt.wantError) {
					t.Errorf("error logs %v, want one containing %q", errs, tt.wantError)
				}
			}
		})
	}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// A running duet reloads its endpoint lists on SIGHUP, counts the reload,
// rejects a broken file, and keeps serving.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	engine := func() *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/server_info" {
				fmt.Fprint(w, `{"dp_size":2,"disaggregation_mode":"null"}`)
				return
			}
			http.NotFound(w, r)
		}))
		t.Cleanup(s.Close)
		return s
	}
	a, b := engine(), engine()
	admin := freeAddr(t)
	head := fmt.Sprintf("listen: {grpc: %q, admin: %q}\ndiscovery: {interval: 1m}\n", freeAddr(t), admin)
	path := writeConfig(t, head+fmt.Sprintf("decode: [{url: %q}]\n", a.URL))

	stop := runDuet(path)
	defer stop()

	metrics := func() string {
		if code, body := adminGet(admin, "/metrics"); code != 0 {
			return body
		}
		return ""
	}
	waitFor := func(what string, cond func(string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond(metrics()) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s:\n%s", what, metrics())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The endpoint health gauge lists every configured endpoint.
	listed := func(s *httptest.Server) string {
		return fmt.Sprintf(`duet_endpoint_ejected{endpoint=%q,pool="default",role="decode"}`, s.URL)
	}
	waitFor("startup", func(m string) bool { return strings.Contains(m, listed(a)) })

	if err := os.WriteFile(path, []byte(head+fmt.Sprintf("decode: [{url: %q}, {url: %q}]\n", a.URL, b.URL)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor("the reload", func(m string) bool {
		return strings.Contains(m, `duet_config_reloads_total{outcome="ok"} 1`) && strings.Contains(m, listed(b))
	})

	if err := os.WriteFile(path, []byte("decode: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor("the rejected reload", func(m string) bool {
		return strings.Contains(m, `duet_config_reloads_total{outcome="invalid"} 1`)
	})
	if m := metrics(); !strings.Contains(m, listed(a)) || !strings.Contains(m, listed(b)) {
		t.Errorf("a rejected reload changed the endpoints:\n%s", m)
	}

	if err := stop(); err != nil {
		t.Fatalf("serve returned %v", err)
	}
}

// A rejected reload is an operational event: duet's logger writes it as
// one error line with the reason and no Go stack trace (issue 37).
func TestRejectedReloadLogsNoStack(t *testing.T) {
	var buf bytes.Buffer
	toBuf := zap.WrapCore(func(zapcore.Core) zapcore.Core {
		return zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&buf), zapcore.InfoLevel)
	})
	log, err := newLogger("info", toBuf)
	if err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, baseConfig)
	running := mustParse(t, baseConfig)
	set := &fakeSetter{pd: running.PoolList()[0].PD()}
	r := newReloader(path, running, map[string]endpointSetter{"default": set}, log, nil)
	if err := os.WriteFile(path, []byte(strings.Replace(baseConfig, "dp_size: 2", "dp_size: -2", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := r.reload(context.Background()); got != reloadInvalid {
		t.Fatalf("reload = %q, want %q", got, reloadInvalid)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d log lines, want 1:\n%s", len(lines), buf.String())
	}
	var entry map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &entry); err != nil {
		t.Fatalf("log line %q: %v", lines[0], err)
	}
	if entry["level"] != "error" || !strings.Contains(fmt.Sprint(entry["error"]), "dp_size") {
		t.Errorf("log line %s, want an error naming dp_size", lines[0])
	}
	if st, ok := entry["stacktrace"]; ok {
		t.Errorf("the rejected reload's log line carries a stack trace:\n%v", st)
	}
	t.Logf("%s", lines[0])
}
