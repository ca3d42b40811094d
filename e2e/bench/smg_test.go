package bench

import (
	"slices"
	"strings"
	"testing"

	"github.com/duet-router/duet/e2e/harness"
)

// SMG's command line names every prefill with its bootstrap port and
// every decode, the policies of both roles, --dp-aware only when asked and
// --dp-minimum-tokens-scheduler only when asked.
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
	l.DPMinTokens = true
	if got := l.Argv(); got[len(got)-1] != "--dp-minimum-tokens-scheduler" {
		t.Errorf("DPMinTokens: argv ends %q", got[len(got)-1])
	}
}

// Every smg routing launches SMG with exactly the flags its label names,
// in front of the stack's engines, and runs the prefill engines with
// SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 exactly when SMG
// pins their ranks (--dp-aware); duet's policies never set it.
func TestSMGRoutings(t *testing.T) {
	s := &harness.Stack{
		Prefill: []*harness.Sim{{URL: "http://p0", BootstrapPort: 7000, DPSize: 2}, {URL: "http://p1", BootstrapPort: 7001, DPSize: 2}},
		Decode:  []*harness.Sim{{URL: "http://d0", DPSize: 2}, {URL: "http://d1", DPSize: 2}},
	}
	const engines = "--pd-disaggregation --prefill http://p0 7000 --prefill http://p1 7001 --decode http://d0 --decode http://d1 "
	force := []string{"SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1"}
	tests := []struct {
		name      string
		wantFlags string // after the engines
		wantEnv   []string
	}{
		{PolicySMGCacheAware, "--prefill-policy cache_aware --decode-policy cache_aware --dp-aware", force},
		{PolicySMG, "--prefill-policy cache_aware --decode-policy cache_aware --dp-aware", force},
		{PolicySMGCacheAwareDPMin, "--prefill-policy cache_aware --decode-policy cache_aware --dp-aware --dp-minimum-tokens-scheduler", force},
		{PolicySMGLeastLoadDPMin, "--prefill-policy least_load --decode-policy least_load --dp-aware --dp-minimum-tokens-scheduler", force},
		{PolicySMGEngineRanks, "--prefill-policy cache_aware --decode-policy cache_aware", nil},
		{"least_cost", "", nil},
		{PolicyEngineDefault, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ps, err := SelectRoutings([]string{tc.name})
			if err != nil || len(ps) != 1 {
				t.Fatalf("SelectRoutings(%s) = %+v, %v", tc.name, ps, err)
			}
			p := ps[0]
			opts := Config{PrefillEngines: 2, DecodeEngines: 3}.withDefaults().stackOptions(p, t.TempDir())
			for i, spec := range opts.Prefill {
				if !slices.Equal(spec.Env, tc.wantEnv) {
					t.Errorf("prefill %d env %q, want %q", i, spec.Env, tc.wantEnv)
				}
			}
			for i, spec := range opts.Decode {
				if len(spec.Env) > 0 {
					t.Errorf("decode %d env %q, want none", i, spec.Env)
				}
			}
			if tc.wantFlags == "" {
				if p.Router != "" || opts.EnginesOnly {
					t.Errorf("%s routes by %q", tc.name, p.Router)
				}
				return
			}
			if p.Router != RouterSMG || !opts.EnginesOnly {
				t.Fatalf("%s: router %q, engines only %v", tc.name, p.Router, opts.EnginesOnly)
			}
			argv := strings.Join(smgLaunch("smg", s, p, 1, 2).Argv(), " ")
			want := "smg launch --host 127.0.0.1 --port 1 --log-level warn --prometheus-host 127.0.0.1 --prometheus-port 2 " + engines + tc.wantFlags
			if argv != want {
				t.Errorf("argv\n%s\nwant\n%s", argv, want)
			}
			label := PolicyLabel(tc.name)
			if !strings.Contains(label, strings.TrimPrefix(want, "smg launch --host 127.0.0.1 --port 1 --log-level warn --prometheus-host 127.0.0.1 --prometheus-port 2 "+engines)) ||
				!strings.Contains(label, SMGVersion) || strings.Contains(label, "FORCE_QUERY") != (tc.wantEnv != nil) {
				t.Errorf("label %q does not say what was launched (%s)", label, tc.wantFlags)
			}
		})
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
	ps, err := SelectRoutings([]string{PolicySMGCacheAware, PolicySMGEngineRanks})
	if err != nil {
		t.Fatal(err)
	}
	aware, plain := smgLaunch("smg", s, ps[0], 1, 2), smgLaunch("smg", s, ps[1], 1, 2)
	if !aware.DPAware || plain.DPAware {
		t.Errorf("DPAware %v and %v, want true for %s and false for %s", aware.DPAware, plain.DPAware, PolicySMGCacheAware, PolicySMGEngineRanks)
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
	for _, n := range []string{PolicySMG, PolicySMGCacheAware, PolicySMGCacheAwareDPMin, PolicySMGLeastLoadDPMin} {
		if _, err := SelectPolicies([]string{n}); err == nil || slices.Contains(wantedNames(err), PolicySMG) {
			t.Errorf("SelectPolicies(%s): %v", n, err)
		}
	}
	got, err := SelectRoutings([]string{PolicyDecodeByLoad, "least_cost", PolicySMG, PolicyEngineDefault})
	if err != nil || len(got) != 4 || got[2].Router != RouterSMG || got[2].EngineRanks || got[3].Router != "" {
		t.Fatalf("got %+v, %v", got, err)
	}
	// The former name runs, and reports, as the policy it now is.
	if got[2].Name != PolicySMGCacheAware || PolicyLabel(PolicySMG) != PolicyLabel(PolicySMGCacheAware) {
		t.Errorf("%s ran as %q, labelled %q", PolicySMG, got[2].Name, PolicyLabel(PolicySMG))
	}
	if _, err := SelectRoutings([]string{"smg_nope"}); err == nil || !slices.Contains(wantedNames(err), PolicySMG) {
		t.Errorf("unknown policy: %v (want the alias listed)", err)
	}
	if l := PolicyLabel("least_cost"); l != "least_cost" {
		t.Errorf("label of least_cost %q", l)
	}
}

// wantedNames are the names an unknown-policy error lists.
func wantedNames(err error) []string {
	_, list, _ := strings.Cut(err.Error(), "(want ")
	return strings.Split(strings.TrimSuffix(list, ")"), ", ")
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
	smg, _ := SelectRoutings([]string{PolicySMGCacheAware})
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
		Summaries: []Summary{sum(PolicyEngineDefault, 1000), sum("least_cost", 500), sum(PolicySMGCacheAware, 800)},
		DecodeCaches: []DecodeCache{{Workload: WorkloadAgentic, Rate: 0.2, Policy: "least_cost", GaugeHitRate: 0.85, ReportedHitRate: 0.9},
			{Workload: WorkloadAgentic, Rate: 0.2, Policy: PolicySMGCacheAware, GaugeHitRate: 0.4, ReportedHitRate: 0.88}},
	}
	var b strings.Builder
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"**Agentic workload at 0.20 sessions/s.**",
		"| least_cost | 500 | 0.50× | 1000 | 0.50× | 90 |",
		"| " + PolicyLabel(PolicySMGCacheAware) + " | 800 | 0.80× |",
		"| 0.20 | least_cost | 85.0% | 90.0% | 90.0% |",
		workloadTitles[WorkloadAgentic],
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
