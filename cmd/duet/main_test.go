package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "duet.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRunCommands(t *testing.T) {
	cfg := writeConfig(t, "prefill: [{url: \"http://10.0.0.1:30000\"}]\ndecode: [{url: \"http://10.0.0.2:30000\"}]\n")
	tests := []struct {
		name    string
		args    []string
		wantOut []string
		wantErr string
	}{
		{"version", []string{"version"}, []string{"duet dev commit "}, ""},
		{"envoy-config", []string{"envoy-config", "-config", cfg}, []string{"duet_prefill", "socket_address: {address: \"10.0.0.2\", port_value: 30000}"}, ""},
		{"unknown command", []string{"launch"}, nil, `unknown command "launch"`},
		{"missing config", []string{"envoy-config", "-config", "/nonexistent.yaml"}, nil, "read config"},
		{"bad config", []string{"envoy-config", "-config", writeConfig(t, "decode: []\n")}, nil, "decode: at least one endpoint"},
		{"stray args", []string{"serve", "-config", cfg, "extra"}, nil, "unexpected arguments"},
		{"out is envoy-config only", []string{"serve", "-config", cfg, "-out", "x.yaml"}, nil, "flag provided but not defined: -out"},
		{"out in a missing directory", []string{"envoy-config", "-config", cfg, "-out", "/nonexistent/envoy.yaml"}, nil, "envoy-config:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, &out, &errOut)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q", w)
				}
			}
		})
	}
}

// envoy-config -out writes the same bootstrap as stdout, into the file alone.
func TestEnvoyConfigOut(t *testing.T) {
	cfg := writeConfig(t, "prefill: [{url: \"http://10.0.0.1:30000\"}]\ndecode: [{url: \"http://10.0.0.2:30000\"}]\n")
	var want bytes.Buffer
	if err := run(context.Background(), []string{"envoy-config", "-config", cfg}, &want, io.Discard); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(path, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"envoy-config", "-config", cfg, "-out", path}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Errorf("stdout got %d bytes, want none", out.Len())
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("file differs from stdout: %d bytes vs %d", len(got), want.Len())
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode = %v, want 0644", fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want the bootstrap alone", len(entries))
	}
}

// runDuet runs duet (the serve command) with the configuration file at
// path until the returned stop is called. stop ends it as SIGTERM would and
// returns serve's error, or an error when serve did not return in 15 s;
// later calls return the same.
func runDuet(path string) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-config", path}, io.Discard, io.Discard) }()
	return sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			return errors.New("serve did not stop")
		}
	})
}

// adminGet fetches path from the admin address admin: the status code and
// the body, or 0 and the error.
func adminGet(admin, path string) (int, string) {
	resp, err := http.Get("http://" + admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// serve answers the admin endpoints, becomes ready once an engine is
// discovered, and returns cleanly when its context ends (SIGTERM).
func TestServeLifecycle(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/server_info" {
			fmt.Fprint(w, `{"dp_size":2,"disaggregation_mode":"null"}`)
			return
		}
		http.NotFound(w, r)
	}))
	defer engine.Close()
	admin := freeAddr(t)
	cfg := writeConfig(t, fmt.Sprintf("listen: {grpc: %q, admin: %q, pprof: true}\ndiscovery: {interval: 100ms}\ndecode: [{url: %q}]\n",
		freeAddr(t), admin, engine.URL))

	stop := runDuet(cfg)
	get := func(path string) (int, string) { return adminGet(admin, path) }
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := get("/readyz"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("duet never became ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics = %d", code)
	}
	if code, body := get("/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "goroutine profile") {
		t.Errorf("/debug/pprof/goroutine with listen.pprof = %d", code)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve returned %v after shutdown", err)
	}
}

// Without listen.pprof the admin port serves no profiles.
func TestAdminMuxHasNoPprofByDefault(t *testing.T) {
	var stopping atomic.Bool
	srv := httptest.NewServer(adminMux(prometheus.NewRegistry(), readyAlways{}, &stopping))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/ = %d, want 404", resp.StatusCode)
	}
}

// readyAlways is a scheduler that is always ready.
type readyAlways struct{}

func (readyAlways) Ready() bool { return true }

func (readyAlways) Why() (string, []string) { return "", nil }

// `duet certs` writes the credentials, prints a configuration section that
// names them, and refuses to overwrite them without -force.
func TestCertsCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"certs", "-out", dir, "-hosts", "duet.inference.svc,10.0.0.5"}, &out, &errOut); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	printed := out.String()
	for _, want := range []string{"client_ca_file: " + filepath.Join(dir, "ca.crt"), "token_file: " + filepath.Join(dir, "token"),
		"server_name: duet.inference.svc", "client_names: [envoy]"} {
		if !strings.Contains(printed, want) {
			t.Errorf("output lacks %q:\n%s", want, printed)
		}
	}
	// The printed section is a configuration duet loads, and Envoy's side of
	// it renders.
	cfgPath := filepath.Join(t.TempDir(), "duet.yaml")
	yaml := "listen: {grpc: \"0.0.0.0:9002\"}\ndecode: [{url: \"http://10.0.0.1:30000\"}]\n" + printed
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	var bootstrap bytes.Buffer
	if err := run(context.Background(), []string{"envoy-config", "-config", cfgPath}, &bootstrap, &errOut); err != nil {
		t.Fatalf("envoy-config on the printed section: %v", err)
	}
	if !strings.Contains(bootstrap.String(), "envoy.transport_sockets.tls") || !strings.Contains(bootstrap.String(), "Bearer ") {
		t.Error("the bootstrap lacks mutual TLS or the token")
	}
	if err := run(context.Background(), []string{"certs", "-out", dir}, &out, &errOut); err == nil {
		t.Error("certs overwrote existing files without -force")
	}
}
