package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportIsByteIdentical runs a small matrix (a goodput headline and a
// fixed-rate scenario) twice with the same flags and demands identical
// reports and data, byte for byte.
func TestReportIsByteIdentical(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator for about 20 seconds of CPU")
	}
	dirs := []string{t.TempDir(), t.TempDir()}
	for _, dir := range dirs {
		args := []string{"-seeds", "2", "-window", "90s", "-warmup", "15s", "-resamples", "200",
			"-scenarios", "multiturn,preloaded", "-out", dir}
		if err := run(context.Background(), args); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{reportFile, dataFile} {
		a, err := os.ReadFile(filepath.Join(dirs[0], name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dirs[1], name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("%s differs between two runs with the same flags", name)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dirs[0], reportFile))
	for _, want := range []string{"## Headline", "goodput", "oracle_prefix", "engine_default", "[", "Rank 0 preloaded"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
