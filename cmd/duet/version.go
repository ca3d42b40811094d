package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version and commit describe the build. `make build` sets version with
// -ldflags "-X main.version=$(git describe --tags --always --dirty)"; an
// image build without a git tree also sets commit ("-X main.commit=...").
// When commit is empty it is read from the VCS stamp that `go build`
// records in the binary.
var (
	version = "dev"
	commit  = ""
)

// versionLine is what `duet version` prints: the version, the commit (with
// "modified" when the tree had uncommitted changes) and the Go toolchain.
func versionLine(version, commit string, info *debug.BuildInfo) string {
	modified := false
	goVersion := runtime.Version()
	if info != nil {
		goVersion = info.GoVersion
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if commit == "" {
					commit = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "duet %s commit %s", version, commit)
	if modified {
		b.WriteString(" (modified)")
	}
	fmt.Fprintf(&b, " %s", goVersion)
	return b.String()
}

// buildVersionLine is versionLine for the running binary.
func buildVersionLine() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return versionLine(version, commit, info)
}
