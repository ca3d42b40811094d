package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A tiny plan runs end to end on the real stack (Envoy + duet + duet-sim):
// every request completes, the engine default and a duet policy are both
// measured, and the report and plots are written. It needs the tools `make
// test` installs, like the other end-to-end tests.
func TestRunPlanEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end; skipped with -short")
	}
	out := t.TempDir()
	plan := Plan{
		Config: Config{
			PrefillEngines: 1, DecodeEngines: 1, DPSize: 2,
			LoadInterval: 200 * time.Millisecond, SampleInterval: 50 * time.Millisecond,
			Dir: t.TempDir(),
		},
		Params:    QuickParams(),
		Workloads: []string{WorkloadVariable, WorkloadMultiTurn},
		Rates:     map[string][]float64{WorkloadVariable: {8}, WorkloadMultiTurn: {3}},
		Window:    2 * time.Second,
		Seed:      3,
		OutDir:    out,
		Setup:     []string{"simulator: simple model (test)"},
	}
	var err error
	if plan.Policies, err = SelectPolicies([]string{PolicyEngineDefault, "least_tokens"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	rep, err := RunPlan(ctx, plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Summaries) != 4 {
		t.Fatalf("%d summaries, want 4", len(rep.Summaries))
	}
	for _, s := range rep.Summaries {
		if s.Failed != "" || s.Errors > 0 || s.Requests == 0 || s.Completed != s.Requests {
			t.Errorf("%s/%s: %+v", s.Workload, s.Policy, s)
		}
		if s.TTFTms.N == 0 || s.TTFTms.Mean <= 0 || s.TPOTms.Mean <= 0 || s.Throughput <= 0 {
			t.Errorf("%s/%s: no latency or throughput: %+v", s.Workload, s.Policy, s)
		}
		if s.ImbalanceDecode < 1 {
			t.Errorf("%s/%s: decode imbalance %g", s.Workload, s.Policy, s.ImbalanceDecode)
		}
	}
	for _, f := range []string{ReportFile, DataFile, TTFTPlotFile(WorkloadVariable), TTFTPlotFile(WorkloadMultiTurn),
		RankLoadPlotFile(PolicyEngineDefault), RankLoadPlotFile("least_tokens")} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing output: %v", err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(out, ReportFile))
	if !strings.Contains(string(md), "## Headline") || !strings.Contains(string(md), "| least_tokens |") {
		t.Errorf("report:\n%s", md)
	}
}
