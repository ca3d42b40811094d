package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseCases(t *testing.T) {
	cases, err := parseCases("1@200, 32/generate@500,256/stream@c20,32/generate/stream@1000")
	if err != nil {
		t.Fatal(err)
	}
	want := []loadCase{
		{bodyBytes: 1 << 10, api: apiChat, rate: 200},
		{bodyBytes: 32 << 10, api: apiGenerate, rate: 500},
		{bodyBytes: 256 << 10, api: apiChat, stream: true, workers: 20},
		{bodyBytes: 32 << 10, api: apiGenerate, stream: true, rate: 1000},
	}
	if !slices.Equal(cases, want) {
		t.Errorf("got %v, want %v", cases, want)
	}
	for _, bad := range []string{"", "1", "x@200", "1@x", "1/foo@200", "1@c", "0@200"} {
		if _, err := parseCases(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := parseCases(defaultCases); err != nil {
		t.Errorf("the default cases: %v", err)
	}
}

func TestParseVariants(t *testing.T) {
	got, err := parseVariants("SMG PD, duet aggregated")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{variantDirect, variantAgg, variantSMGPD}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v (direct first, in the report's order)", got, want)
	}
	if _, err := parseVariants("nginx"); err == nil {
		t.Error("an unknown variant was accepted")
	}
}

func TestEveryVariantIsDescribed(t *testing.T) {
	for _, v := range allVariants() {
		if variantDescriptions[v] == "" {
			t.Errorf("variant %q has no description for the report", v)
		}
	}
}

func TestWithBaseline(t *testing.T) {
	dir := t.TempDir()
	if _, err := withBaseline([]string{variantDirect, variantPD}, dir); err == nil {
		t.Fatal("a baseline directory without duet: no error")
	}
	if err := os.WriteFile(filepath.Join(dir, "duet"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := withBaseline([]string{variantDirect, variantFloor, variantAgg, variantPD, variantSMGPD}, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{variantDirect, variantFloor, variantAgg, variantAgg + baselineSuffix, variantPD, variantPD + baselineSuffix, variantSMGPD}
	if !slices.Equal(got, want) {
		t.Fatalf("withBaseline = %q, want %q", got, want)
	}
	if text := variantsText(got); !strings.Contains(text, "**duet PD @baseline**: duet PD with the -baseline build's duet") {
		t.Errorf("variantsText does not describe the baseline variants: %s", text)
	}
}
