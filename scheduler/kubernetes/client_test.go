package kubernetes

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/duet-router/duet/scheduler/kubernetes/kubetest"
)

// env returns an Env with the given variables and files.
func env(vars, files map[string]string, readErr error) Env {
	return Env{
		Getenv: func(k string) string { return vars[k] },
		ReadFile: func(name string) ([]byte, error) {
			if readErr != nil {
				return nil, readErr
			}
			if data, ok := files[name]; ok {
				return []byte(data), nil
			}
			return os.ReadFile(name) // real files (kubeconfigs in t.TempDir)
		},
	}
}

func TestNamespace(t *testing.T) {
	sa := map[string]string{serviceAccountNamespace: "from-sa\n"}
	tests := []struct {
		name                 string
		configured, fallback string
		env                  Env
		want                 string
		wantErr              string
	}{
		{"configured wins", "inference", "ctx", env(map[string]string{"POD_NAMESPACE": "pod"}, sa, nil), "inference", ""},
		{"POD_NAMESPACE", "", "ctx", env(map[string]string{"POD_NAMESPACE": "pod"}, sa, nil), "pod", ""},
		{"service account file", "", "ctx", env(nil, sa, nil), "from-sa", ""},
		{"kubeconfig context", "", "ctx", env(nil, nil, fs.ErrNotExist), "ctx", ""},
		{"nothing", "", "", env(nil, nil, fs.ErrNotExist), "", "set kubernetes.namespace"},
		{"unreadable file", "", "ctx", env(nil, nil, fs.ErrPermission), "", "read the namespace"},
		{"empty file", "", "", env(nil, map[string]string{serviceAccountNamespace: " \n"}, nil), "", "set kubernetes.namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Namespace(tt.configured, tt.fallback, tt.env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Namespace = %q, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Namespace = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// kubeconfig writes a kubeconfig for server whose context has namespace ns.
func kubeconfig(t *testing.T, server, ns string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config")
	data := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "` + server + `"}
users:
- name: u
  user: {token: "t"}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: "` + ns + `"}
current-context: x
`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestNewClient(t *testing.T) {
	explicit := kubeconfig(t, "https://127.0.0.1:6443", "explicit-ns")
	fromEnv := kubeconfig(t, "https://127.0.0.2:6443", "env-ns")
	tests := []struct {
		name     string
		path     string
		vars     map[string]string
		wantHost string
		wantNS   string
		wantErr  string
	}{
		{"explicit file", explicit, map[string]string{"KUBECONFIG": fromEnv}, "https://127.0.0.1:6443", "explicit-ns", ""},
		{"KUBECONFIG", "", map[string]string{"KUBECONFIG": fromEnv}, "https://127.0.0.2:6443", "env-ns", ""},
		{"KUBECONFIG list", "", map[string]string{"KUBECONFIG": fromEnv + string(os.PathListSeparator) + explicit}, "https://127.0.0.2:6443", "env-ns", ""},
		{"missing file", filepath.Join(t.TempDir(), "none"), nil, "", "", "kubeconfig"},
		// Tests do not run in a pod: no KUBERNETES_SERVICE_HOST.
		{"in cluster", "", nil, "", "", "in-cluster configuration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "in cluster" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
				t.Skip("running in a pod")
			}
			c, err := NewClient(tt.path, env(tt.vars, nil, nil))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewClient: %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Host != tt.wantHost || c.Namespace != tt.wantNS || c.Slices == nil {
				t.Errorf("client host %q namespace %q, want %q %q", c.Host, c.Namespace, tt.wantHost, tt.wantNS)
			}
		})
	}
}

// NewClient's REST client lists and watches slices over HTTP (through a
// kubeconfig) well enough for a Discovery to follow them.
func TestDiscoveryOverHTTP(t *testing.T) {
	for _, watchList := range []bool{true, false} {
		t.Run(fmt.Sprintf("watch-list %v", watchList), func(t *testing.T) { testDiscoveryOverHTTP(t, watchList) })
	}
}

func testDiscoveryOverHTTP(t *testing.T, watchList bool) {
	api := kubetest.Start()
	defer api.Close()
	api.SetWatchList(watchList)
	path, err := api.WriteKubeconfig(t.TempDir(), testNamespace)
	if err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(path, env(nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	ports := []discoveryv1.EndpointPort{port("http", 30000)}
	api.Apply(slice("d-1", "decode", discoveryv1.AddressTypeIPv4, ports, readyAt("10.0.0.1", "a")))
	api.Apply(slice("other", "other", discoveryv1.AddressTypeIPv4, ports, readyAt("10.0.9.1", "o")))
	rec := &recorder{}
	d, err := New(Options{Client: client.Slices, Namespace: client.Namespace, Decode: Pool{Service: "decode"},
		Setter: rec, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { d.Run(ctx) })
	h := &harness{rec: rec}
	h.waitFor(t, lists{decode: specsOf("http://10.0.0.1:30000")})
	api.Apply(slice("d-2", "decode", discoveryv1.AddressTypeIPv4, ports, readyAt("10.0.0.2", "b")))
	h.waitFor(t, lists{decode: specsOf("http://10.0.0.1:30000", "http://10.0.0.2:30000")})
	api.Delete(testNamespace, "d-1")
	h.waitFor(t, lists{decode: specsOf("http://10.0.0.2:30000")})

	// The API server refuses duet (as without RBAC): the failed calls are
	// counted, the lists stay; once it serves again, changes flow again.
	api.Fail(http.StatusForbidden)
	eventually(t, 15*time.Second, func() bool { return testutil.ToFloat64(d.metrics.watchErrors) > 0 },
		func() string { return "no watch error counted while the API server refused" })
	if last, _ := rec.last(); len(last.decode) != 1 {
		t.Errorf("lists while the API server refused: %v", last)
	}
	api.Fail(0)
	api.Apply(slice("d-3", "decode", discoveryv1.AddressTypeIPv4, ports, readyAt("10.0.0.3", "c")))
	h.waitFor(t, lists{decode: specsOf("http://10.0.0.2:30000", "http://10.0.0.3:30000")})

	// The API server stops while the informer watches and reconnects.
	closed := make(chan struct{})
	go func() { api.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("kubetest's Close hangs while a client watches")
	}
}
