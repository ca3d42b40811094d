package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportIsByteIdentical runs a small matrix twice with the same flags and demands identical
// reports and data, byte for byte.
func TestReportIsByteIdentical(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator for about 20 seconds of CPU")
	}
	dirs := []string{t.TempDir(), t.TempDir()}
	for _, dir := range dirs {
		args := []string{"-seeds", "2", "-window", "60s", "-warmup", "10s", "-resamples", "200", "-rate", "3",
			"-routings", "engine_default,duet_default,oracle_load", "-scenarios", "multiturn,preloaded", "-out", dir}
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
