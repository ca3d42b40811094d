package config

import (
	"reflect"
	"testing"
)

const twoPools = `
policy: {decode: least_tokens}
pools:
- name: deepseek
  models: [deepseek-ai/DeepSeek-V3]
  aliases: [deepseek]
  prefill: [{url: "http://10.0.0.1:30000"}]
  decode: [{url: "http://10.0.0.2:30000"}]
  policy: {prefill: cache_aware}
- name: qwen
  models: [Qwen/Qwen3-8B, qwen3]
  decode: [{url: "http://10.0.1.1:8000", dp_size: 2}]
`

func TestPoolList(t *testing.T) {
	cfg, err := Parse([]byte(twoPools))
	if err != nil {
		t.Fatal(err)
	}
	pools := cfg.PoolList()
	if len(pools) != 2 {
		t.Fatalf("%d pools, want 2", len(pools))
	}
	ds, qw := pools[0], pools[1]
	for _, tt := range []struct {
		name      string
		got, want any
	}{
		{"names", []string{ds.Name, qw.Name}, []string{"deepseek", "qwen"}},
		{"PD", []bool{ds.PD(), qw.PD()}, []bool{true, false}},
		{"implicit", []bool{ds.Implicit(), qw.Implicit()}, []bool{false, false}},
		{"own policy", ds.Policy.Prefill.Name, "cache_aware"},
		{"top-level policy as default", []string{ds.Policy.Decode.Name, qw.Policy.Decode.Name, qw.Policy.Prefill.Name},
			[]string{"least_tokens", "least_tokens", DefaultPrefillPolicy}},
		{"default clusters", []EnvoyClusters{ds.Clusters, qw.Clusters},
			[]EnvoyClusters{{Decode: "duet_deepseek_decode", Prefill: "duet_deepseek_prefill"}, {Decode: "duet_qwen_decode", Prefill: "duet_qwen_prefill"}}},
	} {
		if !reflect.DeepEqual(tt.got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, tt.got, tt.want)
		}
	}

	// Without a pools section: one implicit pool of the top-level lists.
	cfg, err = Parse([]byte(`{prefill: [{url: "http://a:1"}], decode: [{url: "http://b:1"}], envoy: {clusters: {decode: d, prefill: p}}}`))
	if err != nil {
		t.Fatal(err)
	}
	pools = cfg.PoolList()
	if len(pools) != 1 || !pools[0].Implicit() || pools[0].Name != DefaultPoolName || !pools[0].PD() ||
		pools[0].Clusters != (EnvoyClusters{Decode: "d", Prefill: "p"}) || pools[0].Decode[0].URL != "http://b:1" {
		t.Errorf("implicit pool %+v", pools)
	}
}

func TestPoolErrorsNameTheField(t *testing.T) {
	pool := func(name, models, extra string) string {
		return "- {name: " + name + ", models: " + models + ", decode: [{url: \"http://" + name + ":1\"}]" + extra + "}\n"
	}
	checkParseErrors(t, []parseErrorCase{
		{"bad name", "pools:\n" + pool("Big_Pool", "[m]", ""), []string{"pools[0].name", "not a pool name"}},
		{"duplicate name", "pools:\n" + pool("a", "[m]", "") + "- {name: a, models: [n], decode: [{url: \"http://x:1\"}]}\n",
			[]string{"pools[1].name", `"a" is also pools[0].name`}},
		{"no models", "pools:\n" + pool("a", "[]", ""), []string{"pools[0].models: at least one model"}},
		{"empty model", "pools:\n" + pool("a", `[""]`, ""), []string{"pools[0].models[0]: is empty"}},
		{"a model in two pools", "pools:\n" + pool("a", "[m]", "") + pool("b", "[n]", ", aliases: [m]"),
			[]string{"pools[1].aliases[0]", `"m" is already pools[0].models[0]`}},
		{"no engines", "pools:\n- {name: a, models: [m]}\n", []string{"pools[0].decode: at least one endpoint"}},
		{"an engine in two pools", "pools:\n" + pool("a", "[m]", "") + "- {name: b, models: [n], decode: [{url: \"http://a:1\"}]}\n",
			[]string{"pools[1].decode[0].url", "already listed as pools[0].decode[0]"}},
		{"a cluster in two pools", "pools:\n" + pool("a", "[m]", ", clusters: {decode: x}") + pool("b", "[n]", ", clusters: {decode: x}"),
			[]string{"pools[1].clusters.decode", `"x" is already pools[0].clusters.decode`}},
		{"top-level lists too", `decode: [{url: "http://z:1"}]` + "\npools:\n" + pool("a", "[m]", ""),
			[]string{"with a pools section, list each pool's engines under pools[]"}},
		{"services without a kubernetes section", "pools:\n- {name: a, models: [m], kubernetes: {decode: {service: d}}}\n",
			[]string{"pools[0].kubernetes: needs the top-level kubernetes section"}},
		{"a Service in two pools", "kubernetes: {namespace: ns}\npools:\n- {name: a, models: [m], kubernetes: {decode: {service: d}}}\n" +
			"- {name: b, models: [n], kubernetes: {decode: {service: d}}}\n",
			[]string{"pools[1].kubernetes.decode.service", `"d" is already pools[0].kubernetes.decode.service`}},
		{"top-level services too", "kubernetes: {namespace: ns, decode: {service: d}}\npools:\n- {name: a, models: [m], kubernetes: {decode: {service: e}}}\n",
			[]string{"name each pool's Services under pools[].kubernetes"}},
	})
}
