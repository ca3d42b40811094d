package bench

import (
	"fmt"
	"strings"
)

// Policy is one routing configuration under test.
type Policy struct {
	// Name labels the policy in reports.
	Name string
	// EngineRanks leaves DP ranks to the engines (duet's engine_ranks):
	// prefill ranks follow a random bootstrap room (room % dp), decode
	// ranks are the engine's round robin. Under SMG (Router) it runs SMG
	// without --dp-aware: SMG picks engines, the engines pick ranks.
	EngineRanks bool
	// Prefill and Decode are duet's policy sections (YAML flow form), or
	// SMG's --prefill-policy and --decode-policy under Router RouterSMG.
	Prefill, Decode string
	// Router is what routes: "" for Envoy + duet, RouterSMG for SMG's
	// binary in place of both.
	Router string
	// DPMinTokens adds SMG's --dp-minimum-tokens-scheduler (Router
	// RouterSMG only).
	DPMinTokens bool
	// Label, if set, names the policy in reports instead of Name.
	Label string
	// DuetYAML is appended to duet's configuration for this policy
	// (harness.Options.DuetYAML), e.g. a tokenizer or kv_events section.
	// It holds no admission section: RunPlan writes that one
	// (AdmissionYAML).
	DuetYAML string
	// AdmissionOff runs duet with its admission queue off
	// (admission.enabled: false), whatever the workload's admission
	// section (Plan.Admission) says.
	AdmissionOff bool
}

// AdmissionYAML is duet's admission section of a case: the section's keys
// (YAML indented by two spaces; "" for none) with enabled: false first
// when off; "" when there are no keys and the queue stays on (duet's
// defaults).
func AdmissionYAML(keys string, off bool) string {
	if keys == "" && !off {
		return ""
	}
	out := "admission:\n"
	if off {
		out += "  enabled: false\n"
	}
	if keys != "" {
		out += strings.TrimSuffix(keys, "\n") + "\n"
	}
	return out
}

// forWorkload returns p as it runs a workload whose admission section has
// keys (Plan.Admission): duet's configuration with its admission section
// appended. Another router than duet is returned as it is.
func (p Policy) forWorkload(keys string) Policy {
	if p.Router == "" {
		p.DuetYAML += AdmissionYAML(keys, p.AdmissionOff)
	}
	return p
}

// PolicyEngineDefault is the baseline: duet picks engines round robin and
// SGLang's own dispatch picks the ranks.
const PolicyEngineDefault = "engine_default"

// Names of the policies run only when asked for (see SelectPolicies and
// SelectRoutings).
const (
	// PolicyDecodeByLoad is duet's least_cost with the decode priced by
	// load alone (ignore_decode_cache): what least_cost was before it
	// read decode radix caches.
	PolicyDecodeByLoad = "least_cost_decode_by_load"
	// PolicySMGCacheAware is SMG's real binary in place of Envoy + duet,
	// PD mode, cache_aware on both roles, DP-aware (--dp-aware).
	PolicySMGCacheAware = "smg_cache_aware"
	// PolicySMG is the former name of PolicySMGCacheAware, still accepted
	// (the committed decode-cache-envoy-smg-* reports use it).
	PolicySMG = "smg"
	// PolicySMGCacheAwareDPMin is PolicySMGCacheAware with SMG's
	// --dp-minimum-tokens-scheduler.
	PolicySMGCacheAwareDPMin = "smg_cache_aware_dpmin"
	// PolicySMGLeastLoadDPMin is SMG's least_load on both roles,
	// --dp-aware and --dp-minimum-tokens-scheduler.
	PolicySMGLeastLoadDPMin = "smg_least_load_dpmin"
	// PolicySMGEngineRanks is PolicySMGCacheAware without --dp-aware: SMG
	// picks engines, the engines their ranks.
	PolicySMGEngineRanks = "smg_engine_ranks"
)

// policyAliases maps former policy names to the policies they now are.
var policyAliases = map[string]string{PolicySMG: PolicySMGCacheAware}

// ForceQueryPrefillDPRankEnv is the environment SGLang's prefill engines
// need behind a router that pins their DP rank without minting the
// bootstrap room for it (room % dp_size), as SMG's --dp-aware does:
// without it they refuse such a request (follow_bootstrap_room conflict).
// duet-sim reads it as SGLang does (cmd/duet-sim, sim.Config.
// ForceQueryPrefillDPRank).
const ForceQueryPrefillDPRankEnv = "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1"

// PrefillSimEnv is the environment the prefill engines run with under p:
// ForceQueryPrefillDPRankEnv behind SMG's DP-aware routings, none
// otherwise (duet mints the room for the rank it picks).
func (p Policy) PrefillSimEnv() []string {
	if p.Router == RouterSMG && !p.EngineRanks {
		return []string{ForceQueryPrefillDPRankEnv}
	}
	return nil
}

// RouterSMG is Policy.Router for SMG (see SMGVersion).
const RouterSMG = "smg"

// Policies returns the policies compared, baseline first.
func Policies() []Policy {
	out := []Policy{{Name: PolicyEngineDefault, EngineRanks: true, Prefill: "round_robin", Decode: "round_robin"}}
	for _, name := range []string{"round_robin", "least_tokens", "cache_aware", "weighted", "least_cost"} {
		out = append(out, Policy{Name: name, Prefill: name, Decode: name})
	}
	return out
}

// ExtraPolicies returns duet policies that run only when named, not in
// the default set.
func ExtraPolicies() []Policy {
	return []Policy{{Name: PolicyDecodeByLoad, Prefill: "least_cost", Decode: "{name: least_cost, ignore_decode_cache: true}"}}
}

// RouterPolicies returns the routings by another router than duet, run
// only when named (SelectRoutings). Each Label says what was launched.
// SMG 1.13 has a least_load policy, so smg_least_load_dpmin runs it (not a
// stand-in such as power_of_two).
func RouterPolicies() []Policy {
	return []Policy{
		{Name: PolicySMGCacheAware, Router: RouterSMG, Prefill: "cache_aware", Decode: "cache_aware",
			Label: "smg_cache_aware (smg " + SMGVersion + ", --prefill-policy cache_aware --decode-policy cache_aware --dp-aware; prefills with " + ForceQueryPrefillDPRankEnv + ")"},
		{Name: PolicySMGCacheAwareDPMin, Router: RouterSMG, Prefill: "cache_aware", Decode: "cache_aware", DPMinTokens: true,
			Label: "smg_cache_aware_dpmin (smg " + SMGVersion + ", --prefill-policy cache_aware --decode-policy cache_aware --dp-aware --dp-minimum-tokens-scheduler; prefills with " + ForceQueryPrefillDPRankEnv + ")"},
		{Name: PolicySMGLeastLoadDPMin, Router: RouterSMG, Prefill: "least_load", Decode: "least_load", DPMinTokens: true,
			Label: "smg_least_load_dpmin (smg " + SMGVersion + ", --prefill-policy least_load --decode-policy least_load --dp-aware --dp-minimum-tokens-scheduler; prefills with " + ForceQueryPrefillDPRankEnv + ")"},
		{Name: PolicySMGEngineRanks, Router: RouterSMG, EngineRanks: true, Prefill: "cache_aware", Decode: "cache_aware",
			Label: "smg_engine_ranks (smg " + SMGVersion + ", --prefill-policy cache_aware --decode-policy cache_aware, engines pick DP ranks)"},
	}
}

// SelectPolicies returns the named duet policies from Policies and
// ExtraPolicies, in that order; an empty list selects every policy of
// Policies. A name of the form PREFILL/DECODE (e.g.
// round_robin/least_tokens) runs one duet policy per role.
func SelectPolicies(names []string) ([]Policy, error) {
	return selectFrom(names, Policies(), ExtraPolicies())
}

// SelectRoutings is SelectPolicies that also knows RouterPolicies: what
// a benchmark running real routers (e2e/bench/quality) accepts.
func SelectRoutings(names []string) ([]Policy, error) {
	return selectFrom(names, Policies(), append(ExtraPolicies(), RouterPolicies()...))
}

// selectFrom returns the named policies from defaults and extra; an empty
// list selects defaults.
func selectFrom(names []string, defaults, extra []Policy) ([]Policy, error) {
	if len(names) == 0 {
		return defaults, nil
	}
	all := append(append([]Policy{}, defaults...), extra...)
	var out []Policy
	for _, n := range names {
		if prefill, decode, ok := strings.Cut(n, "/"); ok && prefill != "" && decode != "" {
			out = append(out, Policy{Name: n, Prefill: prefill, Decode: decode})
			continue
		}
		name := n
		if a, ok := policyAliases[n]; ok {
			name = a
		}
		found := false
		for _, p := range all {
			if p.Name == name {
				out = append(out, p)
				found = true
			}
		}
		if !found {
			var known []string
			for _, p := range all {
				known = append(known, p.Name)
				for a, to := range policyAliases {
					if to == p.Name {
						known = append(known, a)
					}
				}
			}
			return nil, fmt.Errorf("unknown policy %q (want %s)", n, strings.Join(known, ", "))
		}
	}
	return out, nil
}

// PolicyLabel is how reports name the policy called name: its Label when
// it is a known policy (or an alias of one) with one, else name.
func PolicyLabel(name string) string {
	if a, ok := policyAliases[name]; ok {
		name = a
	}
	for _, p := range append(append(Policies(), ExtraPolicies()...), RouterPolicies()...) {
		if p.Name == name && p.Label != "" {
			return p.Label
		}
	}
	return name
}
