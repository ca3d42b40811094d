package compose

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats.go"

	"github.com/duet-router/duet/e2e/harness"
)

// TestNATSImageVersion checks that the compose stack runs the nats-server
// release the replica tests run (make nats-server).
func TestNATSImageVersion(t *testing.T) {
	bin, err := harness.FindNATSServer()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("nats-server --version: %v: %s", err, out)
	}
	version, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "nats-server: v")
	if !ok {
		t.Fatalf("nats-server --version: %q", out)
	}
	if got, want := service(t, loadProject(t), natsService).Image, "nats:"+version+"-alpine"; got != want {
		t.Errorf("nats image %q, want %q (the nats-server the tests run; alpine for the health check's wget)", got, want)
	}
}

// TestNATS runs the nats service's configuration on a real nats-server (the
// release of its image): nats.conf, and its directory of the credentials
// volume as the certs command fills it, placed where the container mounts
// them. The server listens where the compose file and duet.yaml expect it
// (its ports are moved to free ones here), answers the health check's
// /healthz, and admits a client with the token the duets read, and no
// other.
func TestNATS(t *testing.T) {
	p := loadProject(t)
	svc := service(t, p, natsService)
	conf, err := os.ReadFile("nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		want int
	}{{"port", natsClientPort}, {"http_port", natsMonitorPort}} {
		m := regexp.MustCompile(`(?m)^` + c.key + `:\s*(\d+)\s*$`).FindSubmatch(conf)
		if m == nil || string(m[1]) != strconv.Itoa(c.want) {
			t.Errorf("nats.conf: %s is not %d", c.key, c.want)
		}
	}

	// The container's file system: nats.conf and the volume's subpath at
	// their mount targets under root.
	certsDir, run := certsCommand(t, service(t, p, certsService))
	run()
	root := t.TempDir()
	for _, v := range svc.Volumes {
		dst := filepath.Join(root, v.Target)
		switch {
		case v.Type == types.VolumeTypeBind:
			data, err := os.ReadFile(v.Source)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, dst, data)
		case v.Type == types.VolumeTypeVolume && v.Source == certsVolume && v.Volume != nil:
			if err := os.CopyFS(dst, os.DirFS(filepath.Join(certsDir, v.Volume.Subpath))); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("nats mounts %+v, which this test cannot place", v)
		}
	}
	bin, err := harness.FindNATSServer()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := harness.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{}
	for _, a := range svc.Command {
		if strings.HasPrefix(a, "/") {
			a = filepath.Join(root, a)
		}
		args = append(args, a)
	}
	// Command-line ports take precedence over nats.conf's.
	args = append(args, "-a", "127.0.0.1", "-p", strconv.Itoa(ports[0]), "-m", strconv.Itoa(ports[1]))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
	})

	// The health check's path, on the monitoring port.
	check := strings.Join(svc.HealthCheck.Test, " ")
	path := regexp.MustCompile(`http://127\.0\.0\.1:` + strconv.Itoa(natsMonitorPort) + `(/\S*)`).FindStringSubmatch(check)
	if path == nil {
		t.Fatalf("nats health check %q: want an HTTP GET on 127.0.0.1:%d", check, natsMonitorPort)
	}
	if err := waitHealthy(ctx, fmt.Sprintf("http://127.0.0.1:%d%s", ports[1], path[1]), exited); err != nil {
		<-exited
		t.Fatalf("nats-server -c nats.conf: %v (%v)\n%s", err, waitErr, log.String())
	}

	token, err := os.ReadFile(filepath.Join(certsDir, "nats-token"))
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", ports[0])
	for _, c := range []struct {
		name  string
		token string
		ok    bool
	}{
		{"the duets' token", strings.TrimSpace(string(token)), true},
		{"another token", "not-" + strings.TrimSpace(string(token)), false},
		{"no token", "", false},
	} {
		var opts []nats.Option
		if c.token != "" {
			opts = append(opts, nats.Token(c.token))
		}
		nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second))...)
		if nc != nil {
			nc.Close()
		}
		if (err == nil) != c.ok {
			t.Errorf("%s: connect error %v, want admitted %v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(err.Error(), "Authorization Violation") {
			t.Errorf("%s: %v, want an authorization violation", c.name, err)
		}
	}
}

// waitHealthy polls url until it answers 200, the process ends (exited is
// closed), or ctx expires.
func waitHealthy(ctx context.Context, url string, exited <-chan struct{}) error {
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("the server exited")
		case <-ctx.Done():
			return fmt.Errorf("%s never answered 200: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeFile writes data at path, making its directory.
func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
