package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/clustersim"
)

// TestReportIsByteIdentical runs a small matrix twice with the same flags and demands identical
// reports and data, byte for byte.
func TestReportIsByteIdentical(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator for about 20 seconds of CPU")
	}
	dir := runTwiceIdentical(t, []string{"-seeds", "2", "-window", "60s", "-warmup", "10s", "-resamples", "200", "-rate", "3",
		"-routings", "engine_default,duet_default,oracle_load", "-scenarios", "multiturn,preloaded"}, reportFile, dataFile)
	md, _ := os.ReadFile(filepath.Join(dir, reportFile))
	for _, want := range []string{"## Headline", "oracle_load", "of bound", "engine_default", "[", "Rank 0 preloaded"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestHighestMeeting checks the goodput search on grids where the answer
// is known, and that it asks about few rates.
func TestHighestMeeting(t *testing.T) {
	grid := grid{lo: 1, hi: 16, step: 1}.points()
	for _, tt := range []struct {
		name      string
		threshold float64 // rates up to it meet
		want      float64
	}{
		{"none meets", 0, 0},
		{"only the lowest", 1, 1},
		{"middle", 7, 7},
		{"all", 100, 16},
	} {
		t.Run(tt.name, func(t *testing.T) {
			asked := 0
			got, err := highestMeeting(grid, func(rate float64) (bool, error) {
				asked++
				return rate <= tt.threshold, nil
			})
			if err != nil || got != tt.want {
				t.Fatalf("highestMeeting = %v, %v; want %v", got, err, tt.want)
			}
			if asked > 5 {
				t.Errorf("asked about %d of %d rates; bisection needs at most 5", asked, len(grid))
			}
		})
	}
	if _, err := highestMeeting(grid, func(float64) (bool, error) { return false, errors.New("boom") }); err == nil {
		t.Error("an error from a run was lost")
	}
}

// TestRoutingCacheSuffixes: a routing name's cache suffix sets what the
// scheduler knows of the caches and the events' delay, beside the
// replica suffix.
func TestRoutingCacheSuffixes(t *testing.T) {
	tests := []struct {
		name     string
		cache    clustersim.CacheMode
		delay    time.Duration
		replicas int
	}{
		{"duet_default", clustersim.CacheEstimate, 0, 0},
		{"duet_default+tokens", clustersim.CacheTokens, 0, 0},
		{"duet_default+events", clustersim.CacheEvents, 0, 0},
		{"duet_default+events200", clustersim.CacheEvents, 200 * time.Millisecond, 0},
		{"duet_default+oracleview+r4", clustersim.CacheOracle, 0, 4},
		{"duet_default+events50+r4", clustersim.CacheEvents, 50 * time.Millisecond, 4},
	}
	for _, tc := range tests {
		rts, err := routings([]string{tc.name})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		rt := rts[0]
		if rt.name != tc.name || rt.cache != tc.cache || rt.eventDelay != tc.delay || rt.replicas != tc.replicas || rt.policy.Prefill != "least_cost" {
			t.Errorf("%s: %+v", tc.name, rt)
		}
	}
}

// TestKVEventsReport runs one KV events scenario briefly: its report
// compares every cache mode to the estimate.
func TestKVEventsReport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	dir := t.TempDir()
	args := []string{"-kv-events", "-seeds", "2", "-window", "40s", "-warmup", "10s", "-resamples", "200", "-scenarios", "multiturn", "-out", dir}
	if err := run(context.Background(), args); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, reportFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range kvEventsRoutings {
		if !strings.Contains(string(md), "| "+want+" |") {
			t.Errorf("report lacks a row for %s", want)
		}
	}
	if !strings.Contains(string(md), "# KV events") {
		t.Error("report lacks its title")
	}
}

// runTwiceIdentical runs simquality with args twice, each with its own -out
// directory, demands that files are byte-identical in both, and returns
// the first directory.
func runTwiceIdentical(t *testing.T, args []string, files ...string) string {
	t.Helper()
	dirs := []string{t.TempDir(), t.TempDir()}
	for _, dir := range dirs {
		if err := run(context.Background(), append(slices.Clone(args), "-out", dir)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range files {
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
	return dirs[0]
}
