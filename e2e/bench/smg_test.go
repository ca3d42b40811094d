package bench

import (
	"slices"
	"strings"
	"testing"

	"github.com/duet-router/duet/e2e/harness"
)

// SMG's command line names every prefill with its bootstrap port and
// every decode, the policies of both roles, and --dp-aware only when asked.
func TestSMGLaunchArgv(t *testing.T) {
	l := SMGLaunch{Bin: "/v/bin/smg", Host: "127.0.0.1", Port: 30000, PrometheusPort: 30001,
		Prefill:       []SMGPrefill{{URL: "http://127.0.0.1:1", BootstrapPort: 11}, {URL: "http://127.0.0.1:2", BootstrapPort: 12}},
		Decode:        []string{"http://127.0.0.1:3", "http://127.0.0.1:4"},
		PrefillPolicy: "cache_aware", DecodePolicy: "cache_aware", DPAware: true}
	want := "/v/bin/smg launch --host 127.0.0.1 --port 30000 --log-level warn --prometheus-host 127.0.0.1 --prometheus-port 30001 " +
		"--pd-disaggregation --prefill http://127.0.0.1:1 11 --prefill http://127.0.0.1:2 12 " +
		"--decode http://127.0.0.1:3 --decode http://127.0.0.1:4 --prefill-policy cache_aware --decode-policy cache_aware --dp-aware"
	if got := strings.Join(l.Argv(), " "); got != want {
		t.Errorf("argv\n%s\nwant\n%s", got, want)
	}
	l.DPAware = false
	if slices.Contains(l.Argv(), "--dp-aware") {
		t.Error("--dp-aware without DPAware")
	}
}

// The smg routings launch from the stack's engines: DP-aware unless the
// policy leaves ranks to the engines, and SMG then registers one worker
// per (engine, rank).
func TestSMGLaunchFromStack(t *testing.T) {
	s := &harness.Stack{
		Prefill: []*harness.Sim{{URL: "http://p0", BootstrapPort: 7000, DPSize: 4}, {URL: "http://p1", BootstrapPort: 7001, DPSize: 4}},
		Decode:  []*harness.Sim{{URL: "http://d0", DPSize: 4}, {URL: "http://d1", DPSize: 4}},
	}
	ps, err := SelectRoutings([]string{PolicySMG, PolicySMGEngineRanks})
	if err != nil {
		t.Fatal(err)
	}
	aware, plain := smgLaunch("smg", s, ps[0], 1, 2), smgLaunch("smg", s, ps[1], 1, 2)
	if !aware.DPAware || plain.DPAware {
		t.Errorf("DPAware %v and %v, want true for %s and false for %s", aware.DPAware, plain.DPAware, PolicySMG, PolicySMGEngineRanks)
	}
	if len(aware.Prefill) != 2 || aware.Prefill[1] != (SMGPrefill{URL: "http://p1", BootstrapPort: 7001}) ||
		!slices.Equal(aware.Decode, []string{"http://d0", "http://d1"}) || aware.PrefillPolicy != "cache_aware" || aware.DecodePolicy != "cache_aware" {
		t.Errorf("launch %+v", aware)
	}
	if got := smgWorkers(s, true); got != 16 {
		t.Errorf("%d DP-aware workers, want 16", got)
	}
	if got := smgWorkers(s, false); got != 4 {
		t.Errorf("%d workers, want 4", got)
	}
}

// The extra policies run only when named; SMG's only through
// SelectRoutings, so that a benchmark that cannot run SMG (the cluster
// simulator) refuses them instead of running duet under SMG's name.
func TestSelectRoutings(t *testing.T) {
	byLoad, err := SelectPolicies([]string{PolicyDecodeByLoad, "least_cost"})
	if err != nil || byLoad[0].Prefill != "least_cost" || byLoad[0].Decode != "{name: least_cost, ignore_decode_cache: true}" || byLoad[0].Router != "" {
		t.Fatalf("%s = %+v, %v", PolicyDecodeByLoad, byLoad, err)
	}
	if all, _ := SelectRoutings(nil); len(all) != len(Policies()) {
		t.Errorf("the default set has %d policies, want Policies()'s %d", len(all), len(Policies()))
	}
	if _, err := SelectPolicies([]string{PolicySMG}); err == nil {
		t.Errorf("SelectPolicies accepted %s", PolicySMG)
	}
	got, err := SelectRoutings([]string{PolicyDecodeByLoad, "least_cost", PolicySMG, PolicyEngineDefault})
	if err != nil || len(got) != 4 || got[2].Router != RouterSMG || got[2].EngineRanks || got[3].Router != "" {
		t.Fatalf("got %+v, %v", got, err)
	}
	if l := PolicyLabel(PolicySMG); !strings.Contains(l, "real binary") || !strings.Contains(l, "cache_aware/cache_aware") {
		t.Errorf("label %q", l)
	}
	if l := PolicyLabel("least_cost"); l != "least_cost" {
		t.Errorf("label of least_cost %q", l)
	}
}

// Role flags go to their role's engines only, after the common flags;
// another router's policy starts the engines alone.
func TestStackOptionsRoles(t *testing.T) {
	cfg := Config{SimArgs: []string{"--seed", "1"}, PrefillSimArgs: []string{"--kv-transfer-gbps", "4"},
		DecodeSimArgs: []string{"--disaggregation-decode-enable-radix-cache"}}.withDefaults()
	opts := cfg.stackOptions(Policy{Name: "least_cost", Prefill: "least_cost", Decode: "least_cost"}, t.TempDir())
	if len(opts.Prefill) != 2 || len(opts.Decode) != 2 || opts.EnginesOnly {
		t.Fatalf("options %+v", opts)
	}
	if got := strings.Join(opts.Prefill[1].Args, " "); got != "--seed 1 --kv-transfer-gbps 4" {
		t.Errorf("prefill args %q", got)
	}
	if got := strings.Join(opts.Decode[0].Args, " "); got != "--seed 1 --disaggregation-decode-enable-radix-cache" {
		t.Errorf("decode args %q", got)
	}
	if !slices.Equal(cfg.SimArgs, []string{"--seed", "1"}) {
		t.Errorf("SimArgs changed to %v", cfg.SimArgs)
	}
	smg, _ := SelectRoutings([]string{PolicySMG})
	if !cfg.stackOptions(smg[0], t.TempDir()).EnginesOnly {
		t.Error("the smg routing starts duet and Envoy")
	}
}

// The report labels SMG's routing, shows the agentic headline and the
// decode radix cache table.
func TestReportAgentic(t *testing.T) {
	sum := func(p string, ttft float64) Summary {
		s := Summary{Workload: WorkloadAgentic, Policy: p, Rate: 0.2, RequestRate: 2.5, Requests: 100, HitRate: 0.9, HitSource: "prefill counters"}
		s.TTFTms.Mean, s.TTFTms.P99, s.TTFTms.N = ttft, 2*ttft, 90
		return s
	}
	r := Report{
		Summaries: []Summary{sum(PolicyEngineDefault, 1000), sum("least_cost", 500), sum(PolicySMG, 800)},
		DecodeCaches: []DecodeCache{{Workload: WorkloadAgentic, Rate: 0.2, Policy: "least_cost", GaugeHitRate: 0.85, ReportedHitRate: 0.9},
			{Workload: WorkloadAgentic, Rate: 0.2, Policy: PolicySMG, GaugeHitRate: 0.4, ReportedHitRate: 0.88}},
	}
	var b strings.Builder
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"**Agentic workload at 0.20 sessions/s.**",
		"| least_cost | 500 | 0.50× | 1000 | 0.50× | 90 |",
		"| " + PolicyLabel(PolicySMG) + " | 800 | 0.80× |",
		"| 0.20 | least_cost | 85.0% | 90.0% | 90.0% |",
		workloadTitles[WorkloadAgentic],
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
