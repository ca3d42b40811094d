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
			run := interrupt(t, cmd, func(dir string) error {
				if _, err := os.Stat(filepath.Join(dir, "admin-token")); err != nil {
					t.Fatal(err)
				}
				return cmd.Process.Signal(sig)
			})
			if run.err != nil {
				t.Fatalf("the demo exited with %v after %v, want status 0; stderr: %s", run.err, sig, run.stderr)
			}
			if run.before != "dir "+run.dir+"\n" {
				t.Fatalf("the child printed %q first, want its directory", run.before)
			}
			stderr, rest, dir := run.stderr, run.after, run.dir
			if stderr != "" {
				t.Errorf("stderr = %q, want nothing", stderr)
			}
			if !strings.Contains(rest, "Interrupted") {
				t.Errorf("stdout after the signal = %q, want it to say it was interrupted", rest)
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

// interrupted is what a demo interrupted by interrupt printed and how it
// ended.
type interrupted struct {
	// dir is the demo's temporary directory, from its first line.
	dir string
	// before and after are its stdout up to that line and after it.
	before, after string
	stderr        string
	// err is cmd.Wait's.
	err error
}

// interrupt starts cmd, a demo (or make running one), reads its stdout up
// to the demo's "dir <path>" line, then calls signal with the path, and
// waits for cmd to end, for 10 s at most.
func interrupt(t *testing.T, cmd *exec.Cmd, signal func(dir string) error) interrupted {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var run interrupted
	var before strings.Builder
	for run.dir == "" {
		if !sc.Scan() {
			t.Fatalf("the demo never printed its directory; stdout %q, stderr %q", before.String(), stderr.String())
		}
		before.WriteString(sc.Text() + "\n")
		if dir, ok := strings.CutPrefix(sc.Text(), "dir "); ok {
			run.dir = dir
		}
	}
	if err := signal(run.dir); err != nil {
		t.Fatal(err)
	}
	var after strings.Builder
	done := make(chan error, 1)
	go func() {
		for sc.Scan() {
			after.WriteString(sc.Text() + "\n")
		}
		done <- cmd.Wait()
	}()
	select {
	case run.err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the demo did not exit within 10s of the signal")
	}
	run.before, run.after, run.stderr = before.String(), after.String(), stderr.String()
	return run
}
