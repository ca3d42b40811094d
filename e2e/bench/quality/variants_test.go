package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/bench"
)

// fakeTokenizer makes a directory with the two files -tokenizer needs
// (their content is duet's and duet-sim's business, not the plan's).
func fakeTokenizer(t *testing.T, root, family string) string {
	t.Helper()
	dir := filepath.Join(root, family)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A duet policy's +tokens and +events variants run it with the tokenizer,
// kv_events off and auto; bare names run as before; the variants need a
// tokenizer and duet.
func TestPolicyVariants(t *testing.T) {
	tok := "/tok/qwen3"
	type want struct{ name, prefill, decode, mode string } // mode "": no tokenizer
	tests := []struct {
		names   []string
		tok     string
		want    []want
		wantErr string
	}{
		{names: []string{"least_cost", "least_cost+tokens", "least_cost+events"}, tok: tok, want: []want{
			{"least_cost", "least_cost", "least_cost", ""},
			{"least_cost+tokens", "least_cost", "least_cost", "off"},
			{"least_cost+events", "least_cost", "least_cost", "auto"},
		}},
		{names: []string{"cache_aware/least_tokens+events", "engine_default+tokens"}, tok: tok, want: []want{
			{"cache_aware/least_tokens+events", "cache_aware", "least_tokens", "auto"},
			{"engine_default+tokens", "round_robin", "round_robin", "off"},
		}},
		{names: []string{"least_cost", "cache_aware"}, want: []want{
			{"least_cost", "least_cost", "least_cost", ""}, {"cache_aware", "cache_aware", "cache_aware", ""},
		}},
		{names: []string{"least_cost", "least_cost+events"}, wantErr: "least_cost+events need -tokenizer"},
		{names: []string{bench.PolicySMGCacheAware + "+events"}, tok: tok, wantErr: "without duet"},
		{names: []string{"nope+tokens"}, tok: tok, wantErr: `unknown policy "nope"`},
		{names: []string{"+events"}, tok: tok, wantErr: "unknown policy"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			ps, err := selectPolicies(tc.names, tc.tok, 16)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(ps) != len(tc.want) {
				t.Fatalf("%d policies, want %d", len(ps), len(tc.want))
			}
			for i, w := range tc.want {
				p := ps[i]
				if p.Name != w.name || p.Prefill != w.prefill || p.Decode != w.decode || p.Router != "" {
					t.Errorf("policy %d: %+v, want %+v", i, p, w)
				}
				if w.mode == "" {
					if p.DuetYAML != "" {
						t.Errorf("%s: duet YAML %q, want none", p.Name, p.DuetYAML)
					}
					continue
				}
				wantYAML := "tokenizer:\n  file: /tok/qwen3/tokenizer.json\n  config: /tok/qwen3/tokenizer_config.json\n  page_size: 16\nkv_events:\n  mode: " + w.mode + "\n"
				if p.DuetYAML != wantYAML {
					t.Errorf("%s: duet YAML\n%s\nwant\n%s", p.Name, p.DuetYAML, wantYAML)
				}
			}
		})
	}
	if ps, err := selectPolicies(nil, tok, 16); err != nil || len(ps) != len(bench.Policies()) || ps[0].Name != bench.PolicyEngineDefault {
		t.Errorf("default policies: %v, %v", ps, err)
	}
}

// -repeat runs every policy again, interleaved, under numbered names.
func TestRepeatPolicies(t *testing.T) {
	ps := []bench.Policy{{Name: "a", Prefill: "x"}, {Name: "b", Label: "B label", DuetYAML: "y: 1\n"}}
	got := repeatPolicies(ps, 3)
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
	}
	if want := []string{"a", "b", "a#2", "b#2", "a#3", "b#3"}; !slices.Equal(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
	if got[3].Label != "B label#2" || got[3].DuetYAML != "y: 1\n" || got[2].Prefill != "x" || ps[1].Name != "b" {
		t.Errorf("repeats %+v (originals %+v)", got, ps)
	}
	if got := repeatPolicies(ps, 1); len(got) != 2 {
		t.Errorf("one run: %v", got)
	}
}

// -tokenizer takes a directory or a family under DUET_TOKENIZERS_DIR, and
// refuses one without the two files.
func TestResolveTokenizer(t *testing.T) {
	root := t.TempDir()
	dir := fakeTokenizer(t, root, "qwen3")
	t.Setenv("DUET_TOKENIZERS_DIR", root)
	for _, spec := range []string{dir, "qwen3"} {
		if got, err := resolveTokenizer(spec); err != nil || got != dir {
			t.Errorf("resolveTokenizer(%q) = %q, %v; want %q", spec, got, err, dir)
		}
	}
	if got, err := resolveTokenizer(""); got != "" || err != nil {
		t.Errorf("no tokenizer: %q, %v", got, err)
	}
	if err := os.Remove(filepath.Join(dir, "tokenizer_config.json")); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{"qwen3", "llama3_1", filepath.Join(root, "none")} {
		if _, err := resolveTokenizer(spec); err == nil || !strings.Contains(err.Error(), "make tokenizers") {
			t.Errorf("resolveTokenizer(%q): %v", spec, err)
		}
	}
}

// The plan of -tokenizer: every engine tokenizes and publishes events in
// every case, the variants carry their duet YAML, -repeat repeats them,
// multi_tenant has a default rate; without the flags the plan is as
// before. It reads the duet-sim binary's flags, as the benchmark does.
func TestBuildPlanTokenizer(t *testing.T) {
	root := t.TempDir()
	dir := fakeTokenizer(t, root, "qwen3")
	t.Setenv("DUET_TOKENIZERS_DIR", root)
	o, err := parseFlags([]string{"-workloads", bench.WorkloadMultiTenant, "-tokenizer", "qwen3", "-repeat", "2",
		"-policies", "least_cost,least_cost+tokens,least_cost+events", "-window", "10m", "-warmup", "2m"})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := buildPlan(o)
	if err != nil {
		t.Fatal(err)
	}
	if c := plan.Config; !c.KVEvents || c.SimTokenizer != dir {
		t.Errorf("engines: events %v, tokenizer %q", c.KVEvents, c.SimTokenizer)
	}
	var names []string
	for _, p := range plan.Policies {
		names = append(names, p.Name)
		if strings.HasSuffix(strings.TrimSuffix(p.Name, "#2"), "+events") != strings.Contains(p.DuetYAML, "mode: auto") {
			t.Errorf("%s: duet YAML %q", p.Name, p.DuetYAML)
		}
	}
	if want := []string{"least_cost", "least_cost+tokens", "least_cost+events", "least_cost#2", "least_cost+tokens#2", "least_cost+events#2"}; !slices.Equal(names, want) {
		t.Errorf("policies %v, want %v", names, want)
	}
	if got := plan.Rates[bench.WorkloadMultiTenant]; len(got) != 1 || got[0] != 10 {
		t.Errorf("multi_tenant rates %v", got)
	}
	if plan.Config.Warmup != 2*time.Minute || plan.Window != 10*time.Minute {
		t.Errorf("warm-up %s of a %s window", plan.Config.Warmup, plan.Window)
	}
	if setup := strings.Join(plan.Setup, "\n"); !strings.Contains(setup, "publishes KV events") || !strings.Contains(setup, "ran 2 times") ||
		!strings.Contains(setup, "(first 2m0s excluded)") {
		t.Errorf("setup:\n%s", setup)
	}

	o, _ = parseFlags(nil)
	plan, err = buildPlan(o)
	if err != nil {
		t.Fatal(err)
	}
	if c := plan.Config; c.KVEvents || c.SimTokenizer != "" || len(plan.Policies) != len(bench.Policies()) || c.Warmup != 0 ||
		!slices.Equal(plan.Workloads, bench.Workloads[:3]) || strings.Contains(strings.Join(plan.Setup, "\n"), "KV events") ||
		!strings.Contains(strings.Join(plan.Setup, "\n"), "(first 10% excluded)") {
		t.Errorf("default plan: events %v, tokenizer %q, %d policies, workloads %v", c.KVEvents, c.SimTokenizer, len(plan.Policies), plan.Workloads)
	}
	for _, args := range [][]string{{"-workloads", "nope"}, {"-repeat", "0"}, {"-policies", "least_cost+events"}} {
		o, _ := parseFlags(args)
		if _, err := buildPlan(o); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}
