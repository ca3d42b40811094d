package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// childEnv makes the test binary run demo with a body that writes a
// secret into its directory, prints the directory and waits for a signal:
// a stand-in for the stack, for TestDemoInterrupted.
const childEnv = "DUET_DEMO_TEST_CHILD"

// statusEnv names a file where the child writes its exit status, for
// TestMakeDemoInterrupted (make does not report a status 0).
const statusEnv = "DUET_DEMO_TEST_STATUS"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		code := demo(os.Stdout, os.Stderr, false, func(ctx context.Context, dir string) error {
			if err := os.WriteFile(filepath.Join(dir, "admin-token"), []byte("secret"), 0o600); err != nil {
				return err
			}
			fmt.Println("dir", dir)
			<-ctx.Done()
			// What the stack's calls return once interrupted.
			return fmt.Errorf("chat: %w", ctx.Err())
		})
		if path := os.Getenv(statusEnv); path != "" {
			if err := os.WriteFile(path, []byte(strconv.Itoa(code)), 0o644); err != nil {
				fmt.Fprintln(os.Stderr, err)
				code = 1
			}
		}
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestDemoInterrupted runs demo in a child process, interrupts it as
// Ctrl-C does (SIGINT) or as a service manager does (SIGTERM), and checks
// that it exits with status 0, prints no error and removes its temporary
// directory.
func TestDemoInterrupted(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			sc := bufio.NewScanner(out)
			if !sc.Scan() {
				t.Fatalf("the child printed nothing; stderr: %s", stderr.String())
			}
			dir, ok := strings.CutPrefix(sc.Text(), "dir ")
			if !ok {
				t.Fatalf("the child printed %q, want its directory", sc.Text())
			}
			if _, err := os.Stat(filepath.Join(dir, "admin-token")); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			var rest strings.Builder
			done := make(chan error, 1)
			go func() {
				for sc.Scan() {
					rest.WriteString(sc.Text() + "\n")
				}
				done <- cmd.Wait()
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the demo exited with %v after %v, want status 0; stderr: %s", err, sig, stderr.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the demo did not exit within 10s of %v", sig)
			}
			if stderr.Len() > 0 {
				t.Errorf("stderr = %q, want nothing", stderr.String())
			}
			if !strings.Contains(rest.String(), "Interrupted") {
				t.Errorf("stdout after the signal = %q, want it to say it was interrupted", rest.String())
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the temporary directory %s is still there (%v)", dir, err)
			}
		})
	}
}

// TestDemoExit checks demo's exit status and what becomes of its
// directory when its body returns by itself.
func TestDemoExit(t *testing.T) {
	tests := []struct {
		name     string
		bodyErr  error
		keep     bool
		wantCode int
		wantDir  bool   // the directory is there afterwards
		wantErr  string // in stderr
	}{
		{"success", nil, false, 0, false, ""},
		{"failure", errors.New("boom"), false, 1, false, "demo: boom"},
		{"kept", nil, true, 0, true, ""},
		{"failure kept", errors.New("boom"), true, 1, true, "demo: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			var dir string
			code := demo(&stdout, &stderr, tt.keep, func(_ context.Context, d string) error {
				dir = d
				if err := os.WriteFile(filepath.Join(d, "token"), []byte("secret"), 0o600); err != nil {
					t.Fatal(err)
				}
				return tt.bodyErr
			})
			if code != tt.wantCode {
				t.Errorf("exit status %d, want %d", code, tt.wantCode)
			}
			_, err := os.Stat(dir)
			if there := err == nil; there != tt.wantDir {
				t.Errorf("directory there afterwards: %v, want %v", there, tt.wantDir)
			}
			if tt.wantDir {
				os.RemoveAll(dir)
				if !strings.Contains(stdout.String(), dir) {
					t.Errorf("stdout = %q, want it to name the kept directory", stdout.String())
				}
			}
			if tt.wantErr == "" && stderr.Len() > 0 || !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("stderr = %q, want %q", stderr.String(), tt.wantErr)
			}
		})
	}
}

// TestStatusPage checks what the banner says opens the status page.
func TestStatusPage(t *testing.T) {
	c := harness.Credentials{AdminTokenFile: "/tmp/d/credentials/admin-token", AdminToken: "tok123"}
	tests := []struct {
		name           string
		beyondLoopback bool
		want, notWant  []string
	}{
		{"loopback", false, []string{"http://127.0.0.1:9003/status ", "no token needed"}, []string{"tok123"}},
		{"beyond loopback", true, []string{"http://127.0.0.1:9003/status ", "tok123", c.AdminTokenFile}, []string{"no token needed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := statusPage("http://127.0.0.1:9003", tt.beyondLoopback, c)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(got, w) {
					t.Errorf("%q has %q", got, w)
				}
			}
		})
	}
}

// TestBodyLimit checks how the banner reads the body limit from Envoy's
// bootstrap.
func TestBodyLimit(t *testing.T) {
	tests := []struct {
		name, bootstrap, want string
	}{
		{"MiB", "listeners:\n  - per_connection_buffer_limit_bytes: 33554432\n", "32 MiB"},
		{"bytes", "per_connection_buffer_limit_bytes: 5000\n", "5000 bytes"},
		{"none", "listeners: []\n", "unknown: the bootstrap sets no per_connection_buffer_limit_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "envoy.yaml")
			if err := os.WriteFile(path, []byte(tt.bootstrap), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := bodyLimit(path); got != tt.want {
				t.Errorf("bodyLimit = %q, want %q", got, tt.want)
			}
		})
	}
}
