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

// The priority mix runs end to end on the real stack: its requests reach
// duet with their class (by API key) and tenant (by the trusted header),
// as duet's admission counters show, and are summarized by class; with
// the queue off duet counts nothing. Nothing saturates at this load, so
// every request is served.
func TestRunPlanPriorityMixEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end; skipped with -short")
	}
	keys := "  classes:\n  - {name: interactive, priority: 10}\n  - {name: batch}\n  default_class: batch\n" +
		// printf %s sk-interactive | sha256sum
		"  api_keys: {7645b28b5463faac017baeb9c4aac66f80fda3eca4247f3f7838053082d5f6df: interactive}\n" +
		"  tenant_header: " + TenantHeader + "\n  trust_client_headers: true\n"
	plan := Plan{
		Config:    tinyStack(t),
		Params:    QuickParams(),
		Workloads: []string{WorkloadPriorityMix},
		Rates:     map[string][]float64{WorkloadPriorityMix: {10}},
		Admission: map[string]string{WorkloadPriorityMix: keys},
		Window:    3 * time.Second,
		Seed:      2,
	}
	policies, err := SelectPolicies([]string{"least_cost", "least_cost"})
	if err != nil {
		t.Fatal(err)
	}
	policies[1].Name, policies[1].AdmissionOff = "least_cost+noqueue", true
	plan.Policies = policies
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	rep, err := RunPlan(ctx, plan)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Summaries {
		if s.Failed != "" || s.Errors > 0 || s.Refused > 0 || s.Completed != s.Requests || len(s.Classes) != 2 || s.Duet == nil {
			t.Fatalf("%s: %+v", s.Policy, s)
		}
		in, batch := s.Classes[0], s.Classes[1]
		if in.Class != ClassInteractive || batch.Class != ClassBatch || in.Requests+batch.Requests != s.Requests || in.TTFTms.N != in.Requests {
			t.Errorf("%s: classes %+v", s.Policy, s.Classes)
		}
		if s.Policy == "least_cost+noqueue" {
			if len(s.Duet.Admission) > 0 {
				t.Errorf("queue off, counters %v", s.Duet.Admission)
			}
			continue
		}
		// duet counted every interactive request of the window (and before
		// it) as interactive, under the tenants the client sent.
		counted := 0.0
		for k, v := range s.Duet.AdmissionTenants {
			class, tenant, _ := strings.Cut(k, "/")
			if class == ClassInteractive {
				counted += v
				if !strings.HasPrefix(tenant, "tenant-") {
					t.Errorf("interactive request of tenant %q", tenant)
				}
			}
		}
		if counted < float64(in.Requests) || s.Duet.Admission["interactive/admitted"] != counted {
			t.Errorf("duet counted %v interactive (%v), the client sent %d in the window", counted, s.Duet.Admission, in.Requests)
		}
	}
}

// On the engine model the engines' per-stage histograms reach the summary
// and the report: every stage a prefill and a decode go through, with
// observations in the window.
func TestRunPlanStagesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end; skipped with -short")
	}
	cfg := tinyStack(t)
	cfg.Scale, cfg.SimArgs = 5, []string{"--profile", "dense-8b-h100", "--time-scale", "5"}
	out := t.TempDir()
	plan := Plan{
		Config:    cfg,
		Params:    QuickParams(),
		Workloads: []string{WorkloadMultiTurn},
		Rates:     map[string][]float64{WorkloadMultiTurn: {2}},
		Window:    4 * time.Second,
		Seed:      5,
		OutDir:    out,
	}
	rep := runTinyPlan(t, plan, "least_cost")
	if len(rep.Summaries) != 1 {
		t.Fatalf("%d summaries, want 1", len(rep.Summaries))
	}
	s := rep.Summaries[0]
	if s.Failed != "" || s.Errors > 0 || s.Requests == 0 {
		t.Fatalf("case: %+v", s)
	}
	want := []StageKey{{RolePrefill, "prefill_bootstrap"}, {RolePrefill, "prefill_waiting"}, {RolePrefill, "prefill_forward"}, {RolePrefill, "prefill_transfer_kv_cache"},
		{RoleDecode, "decode_bootstrap"}, {RoleDecode, "decode_transferred"}, {RoleDecode, "decode_waiting"}}
	if len(s.Stages) != len(want) {
		t.Fatalf("stages %+v, want %v", s.Stages, want)
	}
	decode := 0.0
	for i, l := range s.Stages {
		if l.key() != want[i] || l.Count < 1 || l.MeanMs < 0 {
			t.Fatalf("stage %d: %+v, want %v observed", i, l, want[i])
		}
		if l.Role == RoleDecode {
			decode += l.MeanMs
		}
	}
	if fwd := s.Stages[2].MeanMs; fwd <= 0 {
		t.Errorf("prefill_forward mean %v ms, want > 0", fwd)
	}
	t.Logf("stages %+v; decode Σ %.1f ms, TTFT mean %.1f ms (n %d)", s.Stages, decode, s.TTFTms.Mean, s.TTFTms.N)
	md, _ := os.ReadFile(filepath.Join(out, ReportFile))
	if !strings.Contains(string(md), "**TTFT by stage**") || !strings.Contains(string(md), "| prefill_waiting | prefill_forward |") {
		t.Errorf("report has no stage table:\n%s", md)
	}
}
