package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sampleSummaries are two loads of two workloads under two policies.
func sampleSummaries() []Summary {
	var out []Summary
	for _, rate := range []float64{2, 4} {
		out = append(out,
			Summary{Workload: WorkloadVariable, Policy: PolicyEngineDefault, Rate: rate, RequestRate: rate, Requests: 10, Completed: 10,
				TTFTms: Dist{Mean: 1000 * rate, P50: 900, P99: 4000 * rate}, ImbalancePrefill: 1.8, ImbalanceDecode: 1.5, HitRate: -1},
			Summary{Workload: WorkloadVariable, Policy: "least_tokens", Rate: rate, RequestRate: rate, Requests: 10, Completed: 9, Errors: 1,
				FirstError: "status 503: no | engine", TTFTms: Dist{Mean: 500 * rate, P50: 450, P99: 1000 * rate}, ImbalancePrefill: 1.1, ImbalanceDecode: 1.05,
				ShareImbalancePrefill: 1.04, ShareImbalanceDecode: 1.02, HitRate: -1},
			Summary{Workload: WorkloadMultiTurn, Policy: PolicyEngineDefault, Rate: rate / 2, RequestRate: rate * 2, Requests: 10,
				TTFTms: Dist{Mean: 300}, HitRate: 0.2, HitSource: "usage"},
			Summary{Workload: WorkloadMultiTurn, Policy: "least_tokens", Rate: rate / 2, RequestRate: rate * 2, Requests: 10,
				TTFTms: Dist{Mean: 200}, HitRate: 0.5, HitSource: "prefill gauge"},
		)
	}
	return out
}

func TestWriteMarkdown(t *testing.T) {
	rep := Report{Setup: []string{"simulator: test"}, Summaries: sampleSummaries(),
		Plots: []Plot{{Caption: "TTFT", File: "ttft-vs-load-variable.png"}}}
	rep.Summaries = append(rep.Summaries, Summary{Workload: WorkloadBursty, Policy: "least_tokens", Rate: 1, Failed: "start stack: boom\nlogs"})
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, rep); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"- simulator: test",
		"the highest load (overload) (4 req/s)",
		// least_tokens at 4/s: mean 2000 vs 4000, p99 4000 vs 16000.
		"| least_tokens | 2000 | 0.50× | 4000 | 0.25× | 0 | 0 | n/a | 1.10 | 1.05 | 1.04 | 1.02 | 0 | 1 |",
		"| engine_default | 4000 | 1.00× | 16000 | 1.00× |",
		"| policy | 1 conv/s | 2 conv/s |",
		"| engine_default | 20.0% | 20.0% |",
		"| least_tokens | 50.0%† | 50.0%† |",
		"failed: start stack: boom |",
		"`status 503: no / engine`",
		"![TTFT](ttft-vs-load-variable.png)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(md, "boom\nlogs") {
		t.Error("multi-line failure not shortened")
	}
	if t.Failed() {
		t.Log(md)
	}
}

func TestFormatting(t *testing.T) {
	tests := []struct{ got, want string }{
		{num(4), "4"}, {num(0.25), "0.25"}, {num(12.34), "12.3"}, {num(1234.5), "1234"},
		{ratio(1, 2), "0.50×"}, {ratio(1, 0), "n/a"},
		{imb(0), "n/a"}, {imb(1.234), "1.23"},
		{hit(Summary{HitRate: -1, Requests: 1}), "n/a"}, {hit(Summary{HitRate: 0.5, HitSource: "usage", Requests: 1}), "50.0%"},
		{oneLine("a|b\nc"), "a/b"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestSelectPolicies(t *testing.T) {
	all, err := SelectPolicies(nil)
	if err != nil || len(all) != 6 || all[0].Name != PolicyEngineDefault || !all[0].EngineRanks {
		t.Fatalf("all = %+v, %v", all, err)
	}
	got, err := SelectPolicies([]string{"cache_aware", PolicyEngineDefault})
	if err != nil || len(got) != 2 || got[0].Prefill != "cache_aware" || got[0].Decode != "cache_aware" || got[0].EngineRanks {
		t.Fatalf("got = %+v, %v", got, err)
	}
	if _, err := SelectPolicies([]string{"fastest"}); err == nil || !strings.Contains(err.Error(), "unknown policy") {
		t.Fatalf("err = %v", err)
	}
	mixed, err := SelectPolicies([]string{"round_robin/least_tokens"})
	if err != nil || len(mixed) != 1 || mixed[0].Prefill != "round_robin" || mixed[0].Decode != "least_tokens" || mixed[0].Name != "round_robin/least_tokens" {
		t.Fatalf("mixed = %+v, %v", mixed, err)
	}
}

// The plots are written as PNG files.
func TestPlots(t *testing.T) {
	dir := t.TempDir()
	ttft := filepath.Join(dir, TTFTPlotFile(WorkloadVariable))
	if err := PlotTTFTvsLoad(ttft, WorkloadVariable, sampleSummaries(), []string{PolicyEngineDefault, "least_tokens"}); err != nil {
		t.Fatal(err)
	}
	var polls []Poll
	for i := range 20 {
		polls = append(polls, Poll{At: time.Duration(i) * time.Second, Tokens: map[string][]float64{
			RolePrefill: {float64(i), float64(20 - i)}, RoleDecode: {5, float64(i)},
		}})
	}
	labels := map[string][]string{RolePrefill: {"p/dp0", "p/dp1"}, RoleDecode: {"d/dp0", "d/dp1"}}
	rank := filepath.Join(dir, RankLoadPlotFile("least_tokens"))
	if err := PlotRankLoad(rank, "variable @ 4/s, least_tokens", polls, labels, Window{To: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ttft, rank} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(data, []byte("\x89PNG")) || len(data) < 5000 {
			t.Fatalf("%s: %d bytes, not a PNG plot", f, len(data))
		}
	}
}

// With three or more loads the headline shows the level below the highest
// as "high load" and the highest as overload.
func TestHeadlineLevels(t *testing.T) {
	var sums []Summary
	for _, rate := range []float64{2, 3, 4} {
		sums = append(sums, Summary{Workload: WorkloadVariable, Policy: PolicyEngineDefault, Rate: rate, RequestRate: rate,
			TTFTms: Dist{Mean: 1000 * rate, P99: 2000 * rate}, HitRate: -1})
	}
	var b strings.Builder
	Report{Summaries: sums}.writeHeadline(&b)
	for _, want := range []string{"at high load (3 req/s)", "at the highest load (overload) (4 req/s)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("headline lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "(2 req/s)") {
		t.Error("the light load is in the headline")
	}
}

// TestPlotFileNames checks that policy names with a role split or a YAML
// mapping make plain file names.
func TestPlotFileNames(t *testing.T) {
	for in, want := range map[string]string{
		"least_tokens":             "rank-load-least_tokens.png",
		"cache_aware/least_tokens": "rank-load-cache_aware_least_tokens.png",
		"cache_aware{balance_abs_tokens: 1e9}/least_tokens": "rank-load-cache_aware_balance_abs_tokens__1e9__least_tokens.png",
	} {
		if got := RankLoadPlotFile(in); got != want {
			t.Errorf("RankLoadPlotFile(%q) = %q, want %q", in, got, want)
		}
	}
}
