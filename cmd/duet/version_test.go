package main

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestVersionLine(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.8", Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "79b2fc2e"},
		{Key: "vcs.modified", Value: "false"},
	}}
	dirty := &debug.BuildInfo{GoVersion: "go1.26.8", Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "79b2fc2e"},
		{Key: "vcs.modified", Value: "true"},
	}}
	tests := []struct {
		name, version, commit string
		info                  *debug.BuildInfo
		want                  string
	}{
		{"vcs stamp", "v0.2.0", "", stamped, "duet v0.2.0 commit 79b2fc2e go1.26.8"},
		{"modified tree", "v0.2.0-dirty", "", dirty, "duet v0.2.0-dirty commit 79b2fc2e (modified) go1.26.8"},
		{"ldflags commit wins", "v0.2.0", "abc123", stamped, "duet v0.2.0 commit abc123 go1.26.8"},
		{"image build without vcs", "v0.2.0", "abc123", &debug.BuildInfo{GoVersion: "go1.26.8"}, "duet v0.2.0 commit abc123 go1.26.8"},
		{"nothing known", "dev", "", nil, "duet dev commit unknown " + runtime.Version()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionLine(tt.version, tt.commit, tt.info); got != tt.want {
				t.Errorf("versionLine() = %q, want %q", got, tt.want)
			}
		})
	}
}
