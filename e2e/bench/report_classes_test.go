package bench

import (
	"bytes"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// A case's admission section is the workload's keys, after enabled: false
// for a policy that turns the queue off; nothing changes a case that has
// neither, or another router's.
func TestAdmissionYAML(t *testing.T) {
	keys := "  classes:\n  - {name: a}\n  default_class: a\n"
	tests := []struct {
		name   string
		policy Policy
		keys   string
		want   string
	}{
		{"defaults", Policy{Name: "least_cost", DuetYAML: "x: 1\n"}, "", "x: 1\n"},
		{"workload keys", Policy{Name: "least_cost"}, keys, "admission:\n" + keys},
		{"queue off", Policy{Name: "least_cost+noqueue", AdmissionOff: true}, "", "admission:\n  enabled: false\n"},
		{"queue off, workload keys", Policy{Name: "p", AdmissionOff: true, DuetYAML: "x: 1\n"}, strings.TrimSuffix(keys, "\n"),
			"x: 1\nadmission:\n  enabled: false\n" + keys},
		{"another router", Policy{Name: PolicySMGCacheAware, Router: RouterSMG, AdmissionOff: true}, keys, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.policy.forWorkload(tc.keys)
			if got.DuetYAML != tc.want {
				t.Errorf("duet YAML\n%s\nwant\n%s", got.DuetYAML, tc.want)
			}
			if got.Name != tc.policy.Name || got.AdmissionOff != tc.policy.AdmissionOff {
				t.Errorf("policy %+v", got)
			}
		})
	}
}

// RunBase strips the run number of -repeat, and nothing else.
func TestRunBase(t *testing.T) {
	for in, want := range map[string]string{"least_cost": "least_cost", "least_cost#2": "least_cost",
		"least_cost+noqueue#12": "least_cost+noqueue", "a#b": "a#b", "#2": "#2", "x#": "x#"} {
		if got := RunBase(in); got != want {
			t.Errorf("RunBase(%q) = %q, want %q", in, got, want)
		}
	}
}

// classSummary is a case of the priority mix with an interactive and a
// batch class.
func classSummary(policy string, ttftP99 float64, good, refused int) Summary {
	slo := DefaultSLO()
	return Summary{Workload: WorkloadPriorityMix, Policy: policy, Rate: 18, RequestRate: 18, Requests: 100, SLO: &slo,
		Duet: &DuetStats{Admission: map[string]float64{"batch/wait_limit": float64(refused)}},
		Classes: []ClassStats{
			{Class: ClassInteractive, Requests: 20, Completed: 20, Good: good, Goodput: float64(good) / 10,
				TTFTms: Dist{N: 20, P50: 300, P99: ttftP99}, Tenants: []TenantStats{{Tenant: "tenant-1", Requests: 20, Completed: 20, Good: good}}},
			{Class: ClassBatch, Requests: 80, Completed: 80 - refused, Refused: refused, Good: 10, Goodput: 1,
				TTFTms: Dist{N: 80 - refused, P50: 900, P99: 5000}, RefusedMs: Dist{N: refused, P50: 40},
				Tenants: []TenantStats{{Tenant: "tenant-1", Requests: 60, Completed: 60 - refused, Refused: refused}, {Tenant: "tenant-2", Requests: 20, Completed: 20}}},
		}}
}

// The report shows a workload's classes: per class, per tenant, duet's
// counters, and each policy's runs pooled with their spread; a workload
// without classes shows none of it.
func TestReportClasses(t *testing.T) {
	rep := Report{Summaries: []Summary{
		classSummary("least_cost", 1000, 18, 40), classSummary("least_cost+noqueue", 9000, 2, 0),
		classSummary("least_cost#2", 1200, 16, 30), classSummary("least_cost+noqueue#2", 9000, 4, 0),
	}}
	rep.Summaries[1].Duet.Admission = nil
	rep.Summaries = append(rep.Summaries, Summary{Workload: WorkloadVariable, Policy: "least_cost", Rate: 4, HitRate: -1})
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, rep); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"TTFT ≤ 2000 ms and TPOT ≤ 50 ms",
		"| 18 | least_cost | interactive | 20 | 20 | 0 | 0 | 0 | 300 | 1000 | 20 | 1.80 | 90.0% | - |",
		"| 18 | least_cost | batch | 80 | 40 | 40 | 0 | 0 | 900 | 5000 | 40 | 1 | 12.5% | 40 |",
		"| 18 | least_cost | batch | tenant-1 | 60 | 75.0% | 20 | 50.0% | 40 | 0.0% |",
		"| 18 | least_cost | batch | tenant-2 | 20 | 25.0% | 20 | 50.0% | 0 | 0.0% |",
		"| 18 | least_cost | batch/wait_limit=40 | - |",
		"| 18 | least_cost+noqueue | - | - |",
		"| 18 | least_cost | 2 | interactive | 300 [300, 300] | 1100 [1000, 1200] | 1.70 [1.60, 1.80] | 85% [80%, 90%] | 0 [0, 0] |",
		"| 18 | least_cost+noqueue | 2 | batch | 900 [900, 900] | 5000 [5000, 5000] | 1 [1, 1] | 12% [12%, 12%] | 0 [0, 0] |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Count(md, "**Per priority class.**") != 1 {
		t.Errorf("per-class tables %d times:\n%s", strings.Count(md, "**Per priority class.**"), md)
	}
	if t.Failed() {
		t.Log(md)
	}
}

// duet's counters are summed by several labels' values, skipping series
// without them.
func TestSumByLabels(t *testing.T) {
	series := func(v float64, labels ...string) *dto.Metric {
		m := &dto.Metric{Counter: &dto.Counter{Value: proto.Float64(v)}}
		for i := 0; i+1 < len(labels); i += 2 {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(labels[i]), Value: proto.String(labels[i+1])})
		}
		return m
	}
	f := &dto.MetricFamily{Metric: []*dto.Metric{
		series(3, "class", "batch", "tenant", "t1", "outcome", "admitted"),
		series(2, "class", "batch", "tenant", "t2", "outcome", "admitted"),
		series(1, "class", "interactive", "tenant", "t1", "outcome", "wait_limit"),
		series(5, "pool", "p"),
	}}
	got := sumByLabels(f, "class", "outcome")
	if len(got) != 2 || got["batch/admitted"] != 5 || got["interactive/wait_limit"] != 1 {
		t.Errorf("by class and outcome %v", got)
	}
	if got := sumByLabels(f, "class", "tenant"); len(got) != 3 || got["batch/t1"] != 3 {
		t.Errorf("by class and tenant %v", got)
	}
	if sumByLabels(nil, "class") != nil || sumByLabels(f, "nope") != nil {
		t.Error("sums of nothing")
	}
}
