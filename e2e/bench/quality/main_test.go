package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/bench"
)

// TestAddTrace checks that -trace replaces the default workloads with the
// trace (or joins an explicit -workloads), at each speedup, and that the
// plan builds the trace's requests with the cap applied.
func TestAddTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	lines := `{"timestamp": 0, "input_length": 2000, "output_length": 10, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 500, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 5]}
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		wants []string
	}{
		{"alone by default", []string{"-trace", path, "-trace-speedups", "1,2", "-trace-max-prompt", "1024"}, []string{"trace"}},
		{"with explicit workloads", []string{"-trace", path, "-workloads", "variable", "-trace-max-prompt", "1024"}, []string{"variable", "trace"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			plan := bench.Plan{Workloads: splitList(o.workloads), Rates: map[string][]float64{}}
			if err := addTrace(&plan, o); err != nil {
				t.Fatal(err)
			}
			if len(plan.Workloads) != len(tt.wants) || plan.Workloads[len(plan.Workloads)-1] != "trace" || plan.Workloads[0] != tt.wants[0] {
				t.Fatalf("workloads %v, want %v", plan.Workloads, tt.wants)
			}
			w, err := plan.Build("trace", plan.Rates["trace"][0], time.Minute, 1, bench.Params{})
			if err != nil {
				t.Fatal(err)
			}
			// The trace spans 0.5 s: a minute's window replays it again and
			// again.
			if w.Name != "trace" || w.Requests() < 100 {
				t.Fatalf("workload %q with %d requests, want trace, wrapped to 100 or more", w.Name, w.Requests())
			}
			for _, s := range w.Sessions {
				if got := s.Turns[0].PromptTokens; got > 1024 {
					t.Errorf("prompt of %d tokens beyond the 1024 cap", got)
				}
			}
		})
	}
	if o, _ := parseFlags([]string{"-trace", filepath.Join(t.TempDir(), "missing.jsonl")}); addTrace(&bench.Plan{Rates: map[string][]float64{}}, o) == nil {
		t.Error("a missing trace file was accepted")
	}
}

// The agentic workload has default rates, and the role flags reach the
// plan's configuration.
func TestAgenticFlags(t *testing.T) {
	for name, rates := range map[string]map[string]string{"profile": profileRates, "simple": simpleRates} {
		if got, err := parseRates(rates[bench.WorkloadAgentic]); err != nil || len(got) == 0 {
			t.Errorf("%s rates of %s: %v, %v", name, bench.WorkloadAgentic, got, err)
		}
	}
	o, err := parseFlags([]string{"-workloads", "agentic", "-prefill-sim-args", "--kv-transfer-gbps 4",
		"-decode-sim-args", "--disaggregation-decode-enable-radix-cache --enable-hierarchical-cache"})
	if err != nil {
		t.Fatal(err)
	}
	if o.prefillSimArgs != "--kv-transfer-gbps 4" || o.decodeSimArgs != "--disaggregation-decode-enable-radix-cache --enable-hierarchical-cache" {
		t.Errorf("role flags %q and %q", o.prefillSimArgs, o.decodeSimArgs)
	}
	ps, err := bench.SelectRoutings([]string{bench.PolicyDecodeByLoad, "least_cost", bench.PolicySMGCacheAware, bench.PolicyEngineDefault})
	if err != nil {
		t.Fatal(err)
	}
	if got := smgPolicies(ps); len(got) != 1 || got[0] != bench.PolicySMGCacheAware {
		t.Errorf("smg policies %v", got)
	}
}
