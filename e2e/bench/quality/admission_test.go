package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/bench"
)

// A policy's +noqueue variant runs the same duet policy with the queue
// off, alone or after +tokens/+events; another router has no queue to
// turn off.
func TestNoQueueVariant(t *testing.T) {
	tests := []struct {
		names   []string
		tok     string
		want    []bench.Policy
		wantErr string
	}{
		{names: []string{"least_cost", "least_cost+noqueue"}, want: []bench.Policy{
			{Name: "least_cost", Prefill: "least_cost", Decode: "least_cost"},
			{Name: "least_cost+noqueue", Prefill: "least_cost", Decode: "least_cost", AdmissionOff: true},
		}},
		{names: []string{"cache_aware/least_tokens+noqueue", "engine_default+noqueue"}, want: []bench.Policy{
			{Name: "cache_aware/least_tokens+noqueue", Prefill: "cache_aware", Decode: "least_tokens", AdmissionOff: true},
			{Name: "engine_default+noqueue", EngineRanks: true, Prefill: "round_robin", Decode: "round_robin", AdmissionOff: true},
		}},
		{names: []string{"least_cost+events+noqueue"}, tok: "/tok", want: []bench.Policy{
			{Name: "least_cost+events+noqueue", Prefill: "least_cost", Decode: "least_cost", AdmissionOff: true,
				DuetYAML: tokenizerYAML("/tok", 16, true)},
		}},
		{names: []string{"least_cost+events+noqueue"}, wantErr: "need -tokenizer"},
		{names: []string{bench.PolicySMGCacheAware + "+noqueue"}, wantErr: "admission queue"},
		{names: []string{"+noqueue"}, wantErr: "unknown policy"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			got, err := selectPolicies(tc.names, tc.tok, 16)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("policies\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// admissionSection is the part of duet's configuration the benchmark
// writes.
type admissionSection struct {
	Admission struct {
		Enabled *bool `yaml:"enabled"`
		Classes []struct {
			Name      string        `yaml:"name"`
			Priority  int           `yaml:"priority"`
			WaitLimit time.Duration `yaml:"wait_limit"`
		} `yaml:"classes"`
		DefaultClass       string            `yaml:"default_class"`
		APIKeys            map[string]string `yaml:"api_keys"`
		TenantHeader       string            `yaml:"tenant_header"`
		TrustClientHeaders bool              `yaml:"trust_client_headers"`
	} `yaml:"admission"`
}

// The priority mix's admission section classes sk-interactive's requests
// interactive (by the key's SHA-256, as e2e's admission test configures
// it) and all others batch, trusts the tenant header, and holds the wait
// limits in wall time; with +noqueue the same section turns the queue off.
func TestPriorityMixAdmission(t *testing.T) {
	tests := []struct {
		scale            float64
		off              bool
		interactive, bat time.Duration
	}{
		{1, false, 10 * time.Second, 20 * time.Second},
		{5, false, 2 * time.Second, 4 * time.Second},
		{5, true, 2 * time.Second, 4 * time.Second},
	}
	for _, tc := range tests {
		var cfg admissionSection
		doc := bench.AdmissionYAML(priorityMixAdmission(tc.scale), tc.off)
		if err := yaml.Unmarshal([]byte(doc), &cfg); err != nil {
			t.Fatalf("scale %g: %v\n%s", tc.scale, err, doc)
		}
		a := cfg.Admission
		if (a.Enabled != nil) != tc.off || (tc.off && *a.Enabled) {
			t.Errorf("scale %g, off %v: enabled %v", tc.scale, tc.off, a.Enabled)
		}
		if len(a.Classes) != 2 || a.Classes[0].Name != bench.ClassInteractive || a.Classes[0].Priority != 10 || a.Classes[0].WaitLimit != tc.interactive ||
			a.Classes[1].Name != bench.ClassBatch || a.Classes[1].Priority != 0 || a.Classes[1].WaitLimit != tc.bat {
			t.Errorf("scale %g: classes %+v", tc.scale, a.Classes)
		}
		// printf %s sk-interactive | sha256sum
		const hash = "7645b28b5463faac017baeb9c4aac66f80fda3eca4247f3f7838053082d5f6df"
		if len(a.APIKeys) != 1 || a.APIKeys[hash] != bench.ClassInteractive || a.DefaultClass != bench.ClassBatch ||
			a.TenantHeader != bench.TenantHeader || !a.TrustClientHeaders {
			t.Errorf("scale %g: %+v", tc.scale, a)
		}
	}
}

// A plan of the priority mix gives its cases the admission section and
// the SLO of the flags, says so in its setup, and leaves the other
// workloads at duet's defaults.
func TestBuildPlanPriorityMix(t *testing.T) {
	o, err := parseFlags([]string{"-workloads", "variable," + bench.WorkloadPriorityMix, "-policies", "least_cost,least_cost+noqueue",
		"-repeat", "2", "-slo-ttft", "1500ms"})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := buildPlan(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Admission) != 1 || plan.Admission[bench.WorkloadPriorityMix] != priorityMixAdmission(5) {
		t.Errorf("admission %v", plan.Admission)
	}
	if plan.Config.SLO != (bench.SLO{TTFTms: 1500, TPOTms: 50}) {
		t.Errorf("SLO %+v", plan.Config.SLO)
	}
	if got := plan.Rates[bench.WorkloadPriorityMix]; !slices.Equal(got, []float64{9, 18}) {
		t.Errorf("rates %v", got)
	}
	var off []string
	for _, p := range plan.Policies {
		if p.AdmissionOff {
			off = append(off, p.Name)
		}
	}
	if !slices.Equal(off, []string{"least_cost+noqueue", "least_cost+noqueue#2"}) {
		t.Errorf("queue off in %v", off)
	}
	setup := strings.Join(plan.Setup, "\n")
	for _, want := range []string{"Authorization: Bearer sk-interactive", "wait_limit: 10s", "least_cost+noqueue: the same duet policy",
		"TTFT ≤ 1500 ms and TPOT ≤ 50 ms"} {
		if !strings.Contains(setup, want) {
			t.Errorf("setup lacks %q:\n%s", want, setup)
		}
	}

	o, _ = parseFlags([]string{"-policies", "least_cost"})
	if plan, err = buildPlan(o); err != nil || plan.Admission != nil || strings.Contains(strings.Join(plan.Setup, "\n"), "SLO") {
		t.Errorf("plan without the priority mix: admission %v, %v", plan.Admission, err)
	}
}
