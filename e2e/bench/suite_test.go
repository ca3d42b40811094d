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
		Config:    tinyStack(t),
		Params:    QuickParams(),
		Workloads: []string{WorkloadVariable, WorkloadMultiTurn},
		Rates:     map[string][]float64{WorkloadVariable: {8}, WorkloadMultiTurn: {3}},
		Window:    2 * time.Second,
		Seed:      3,
		OutDir:    out,
		Setup:     []string{"simulator: simple model (test)"},
	}
	rep := runTinyPlan(t, plan, PolicyEngineDefault, "least_tokens")
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

// A replayed trace runs end to end through Plan.Build on the real stack:
// the requests that share hash ids share prompt prefixes for duet and the
// engines, every request completes, and the report has the trace's table.
func TestRunPlanTraceEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end; skipped with -short")
	}
	// Twelve requests over 1.2 s: three prefixes of one or two 512-token
	// blocks, each reused.
	var recs []TraceRecord
	for i := range 12 {
		ids := []int64{int64(100 + i%3)}
		if i%2 == 1 {
			ids = append(ids, int64(200+i%3))
		}
		recs = append(recs, TraceRecord{Timestamp: int64(100 * i), InputLength: 512*len(ids) + 40, OutputLength: 8, HashIDs: ids})
	}
	plan := Plan{
		Config:    tinyStack(t),
		Params:    QuickParams(),
		Workloads: []string{"trace"},
		Rates:     map[string][]float64{"trace": {1}},
		Window:    2 * time.Second,
		Seed:      1,
		OutDir:    t.TempDir(),
		Build: func(name string, rate float64, window time.Duration, _ uint64, _ Params) (Workload, error) {
			return TraceWorkload(name, recs, TraceOptions{Speedup: rate, Window: window})
		},
	}
	rep := runTinyPlan(t, plan, PolicyEngineDefault, "least_cost")
	if len(rep.Summaries) != 2 {
		t.Fatalf("%d summaries, want 2", len(rep.Summaries))
	}
	for _, s := range rep.Summaries {
		// The first 10 % of the window (two requests) is not measured.
		if s.Workload != "trace" || s.Failed != "" || s.Errors > 0 || s.Requests != len(recs)-2 || s.Completed != s.Requests {
			t.Errorf("%s/%s: %+v", s.Workload, s.Policy, s)
		}
	}
	md, _ := os.ReadFile(filepath.Join(plan.OutDir, ReportFile))
	if !strings.Contains(string(md), "## trace") || !strings.Contains(string(md), "| least_cost |") {
		t.Errorf("report has no trace table:\n%s", md)
	}
}

// tinyStack is the smallest real stack: one prefill and one decode engine
// at dp 2, with fast load scrapes and samples.
func tinyStack(t *testing.T) Config {
	return Config{
		PrefillEngines: 1, DecodeEngines: 1, DPSize: 2,
		LoadInterval: 200 * time.Millisecond, SampleInterval: 50 * time.Millisecond,
		Dir: t.TempDir(),
	}
}

// runTinyPlan runs plan under the named policies, within 50 s, and fails
// the test if the run fails.
func runTinyPlan(t *testing.T, plan Plan, policies ...string) Report {
	t.Helper()
	var err error
	if plan.Policies, err = SelectPolicies(policies); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	rep, err := RunPlan(ctx, plan)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
