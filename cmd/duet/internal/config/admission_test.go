package config

import (
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// oneEngine is a configuration's engines, for sections tested alone.
const oneEngine = "decode: [{url: \"http://10.0.0.2:30000\"}]\n"

// keyHash is the hex SHA-256 of an API key, as admission.api_keys takes it.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// fullAdmission sets every key of the section.
var fullAdmission = oneEngine + `admission:
  enabled: true
  classes:
  - {name: interactive, priority: 10, wait_limit: 5s, engine_priority: 7}
  - {name: batch, priority: 0, wait_limit: 30s}
  default_class: batch
  class_header: X-Duet-Priority
  tenant_header: x-duet-tenant
  tenant_from_api_key: true
  api_keys: {` + keyHash("secret-token-interactive") + `: interactive}
  models: {small-model: interactive}
  pools: {default: batch}
  tenant_weights: {acme: 2}
  max_queued: 64
  max_queued_tokens: 1048576
  engine_priority: on
  saturation: {prefill_tokens: 16384, kv_fraction: 0.8, waiting: -1}
`

// TestAdmissionDefaults: what an absent or partial section loads as.
func TestAdmissionDefaults(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       Admission
	}{
		{
			name: "absent",
			yaml: oneEngine,
			want: Admission{Enabled: true, Classes: []AdmissionClass{{Name: "default", WaitLimit: 10 * time.Second}},
				DefaultClass: "default", MaxQueued: 128, MaxQueuedTokens: 4 << 20, EnginePriorityMode: "auto",
				Saturation: Saturation{PrefillTokens: 8192, KVFraction: 0.8, Waiting: 16}},
		},
		{
			name: "off, the rest defaulted",
			yaml: oneEngine + "admission: {enabled: false}\n",
			want: Admission{Classes: []AdmissionClass{{Name: "default", WaitLimit: 10 * time.Second}},
				DefaultClass: "default", MaxQueued: 128, MaxQueuedTokens: 4 << 20, EnginePriorityMode: "auto",
				Saturation: Saturation{PrefillTokens: 8192, KVFraction: 0.8, Waiting: 16}},
		},
		{
			name: "the lowest class is the default; an unset wait limit is 10s; a small Envoy limit halves max_queued",
			yaml: oneEngine + "envoy: {max_routing_requests: 40}\nadmission:\n  classes: [{name: hi, priority: 5}, {name: lo, priority: -1, wait_limit: 1m}, {name: lo2, priority: -1}]\n",
			want: Admission{Enabled: true, Classes: []AdmissionClass{{Name: "hi", Priority: 5, WaitLimit: 10 * time.Second},
				{Name: "lo", Priority: -1, WaitLimit: time.Minute}, {Name: "lo2", Priority: -1, WaitLimit: 10 * time.Second}},
				DefaultClass: "lo", MaxQueued: 20, MaxQueuedTokens: 4 << 20, EnginePriorityMode: "auto",
				Saturation: Saturation{PrefillTokens: 8192, KVFraction: 0.8, Waiting: 16}},
		},
		{
			name: "saturation measures off",
			yaml: oneEngine + "admission: {saturation: {prefill_tokens: -1, kv_fraction: -1, waiting: -1}}\n",
			want: Admission{Enabled: true, Classes: []AdmissionClass{{Name: "default", WaitLimit: 10 * time.Second}},
				DefaultClass: "default", MaxQueued: 128, MaxQueuedTokens: 4 << 20, EnginePriorityMode: "auto",
				Saturation: Saturation{PrefillTokens: -1, KVFraction: -1, Waiting: -1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.Admission, tt.want) {
				t.Errorf("admission =\n%+v\nwant\n%+v", cfg.Admission, tt.want)
			}
		})
	}
}

// TestAdmissionErrorsNameTheField: every refusal names its field and says
// what is wrong.
func TestAdmissionErrorsNameTheField(t *testing.T) {
	pools := `pools:
- {name: chat, models: [m1], aliases: [m1-alias], decode: [{url: "http://10.0.0.3:30000"}]}
`
	checkParseErrors(t, []parseErrorCase{
		{"class without a name", oneEngine + "admission: {classes: [{priority: 1}]}", []string{"admission.classes[0].name: \"\" is not a class name"}},
		{"class name with a space", oneEngine + "admission: {classes: [{name: 'a b'}]}", []string{"admission.classes[0].name"}},
		{"class twice", oneEngine + "admission: {classes: [{name: a}, {name: a}]}", []string{"admission.classes[1].name: \"a\" is also admission.classes[0].name"}},
		{"negative wait limit", oneEngine + "admission: {classes: [{name: a, wait_limit: -1s}]}", []string{"admission.classes[0].wait_limit: -1s is not in (0, 5m0s]"}},
		{"wait limit over 5m", oneEngine + "admission: {classes: [{name: a, wait_limit: 6m}]}", []string{"admission.classes[0].wait_limit: 6m0s"}},
		{"saturation share above 1", oneEngine + "admission: {classes: [{name: a, saturation_share: 1.5}]}", []string{"admission.classes[0].saturation_share: 1.5 is not in (0, 1]"}},
		{"unknown default class", oneEngine + "admission: {default_class: gold}", []string{"admission.default_class: \"gold\" is not a class of admission.classes (default)"}},
		{"api key not a hash", oneEngine + "admission: {api_keys: {sk-123: default}}", []string{"admission.api_keys.sk-123: the key is not the hex SHA-256", "sha256sum"}},
		{"api key hash too short", oneEngine + "admission: {api_keys: {abcd: default}}", []string{"admission.api_keys.abcd"}},
		{"api key of no class", oneEngine + "admission: {api_keys: {" + keyHash("k") + ": gold}}", []string{"admission.api_keys." + keyHash("k") + ": \"gold\" is not a class"}},
		{"api key twice in two cases", oneEngine + "admission: {api_keys: {" + keyHash("k") + ": default, " + strings.ToUpper(keyHash("k")) + ": default}}",
			[]string{"the same hash as admission.api_keys."}},
		{"model of no pool", pools + "admission: {models: {m2: default}}", []string{"admission.models.m2: \"m2\" is not a model or alias of any pool"}},
		{"model of no class", oneEngine + "admission: {models: {m1: gold}}", []string{"admission.models.m1: \"gold\" is not a class"}},
		{"unknown pool", pools + "admission: {pools: {default: default}}", []string{"admission.pools.default: \"default\" is not a pool (chat)"}},
		{"pool of no class", oneEngine + "admission: {pools: {default: gold}}", []string{"admission.pools.default: \"gold\" is not a class"}},
		{"zero tenant weight", oneEngine + "admission: {tenant_weights: {acme: 0}}", []string{"admission.tenant_weights.acme: 0 is not a positive weight"}},
		{"negative tenant weight", oneEngine + "admission: {tenant_weights: {acme: -2}}", []string{"admission.tenant_weights.acme"}},
		{"negative max_queued", oneEngine + "admission: {max_queued: -1}", []string{"admission.max_queued: -1 must be positive"}},
		{"max_queued at Envoy's limit", oneEngine + "envoy: {max_routing_requests: 100}\nadmission: {max_queued: 100}",
			[]string{"admission.max_queued: 100 is not below envoy.max_routing_requests 100", "503", "429"}},
		{"negative max_queued_tokens", oneEngine + "admission: {max_queued_tokens: -5}", []string{"admission.max_queued_tokens: -5 must be positive"}},
		{"unknown engine_priority", oneEngine + "admission: {engine_priority: always}", []string{"admission.engine_priority: \"always\" is not auto, on or off"}},
		{"kv_fraction over 1", oneEngine + "admission: {saturation: {kv_fraction: 1.5}}", []string{"admission.saturation.kv_fraction: 1.5 is neither in (0, 1] nor -1"}},
		{"kv_fraction negative, not -1", oneEngine + "admission: {saturation: {kv_fraction: -0.5}}", []string{"admission.saturation.kv_fraction"}},
		{"prefill_tokens -2", oneEngine + "admission: {saturation: {prefill_tokens: -2}}", []string{"admission.saturation.prefill_tokens: -2 is neither a token count nor -1"}},
		{"waiting -3", oneEngine + "admission: {saturation: {waiting: -3}}", []string{"admission.saturation.waiting: -3"}},
		{"class header a client sets", oneEngine + "admission: {class_header: x-priority}",
			[]string{"admission.class_header: \"x-priority\" does not start with x-duet-", "claim_to_headers", "trust_client_headers"}},
		{"tenant header a client sets", oneEngine + "admission: {tenant_header: x-tenant}", []string{"admission.tenant_header: \"x-tenant\" does not start with x-duet-"}},
		{"authorization as tenant", oneEngine + "admission: {tenant_header: authorization, trust_client_headers: true}",
			[]string{"admission.tenant_header: \"authorization\" carries the client's token"}},
		{"duet's own header", oneEngine + "admission: {class_header: x-duet-pool}", []string{"admission.class_header: \"x-duet-pool\" is one of duet's own routing headers"}},
		{"not a header name", oneEngine + "admission: {class_header: 'x-duet-a b'}", []string{"admission.class_header: \"x-duet-a b\" is not a header name"}},
		{"one header for both", oneEngine + "admission: {class_header: x-duet-who, tenant_header: X-Duet-Who}", []string{"admission.tenant_header: \"X-Duet-Who\" is also admission.class_header"}},
		{"unknown key", oneEngine + "admission: {max_queue: 3}", []string{`line 2: admission.max_queue: unknown key: did you mean "max_queued"?`}},
		{"unknown class key", oneEngine + "admission: {classes: [{name: a, wait: 1s}]}", []string{`line 2: admission.classes[0].wait: unknown key: did you mean "wait_limit"?`}},
	})
}

// TestAdmissionAccepts: configurations that must load.
func TestAdmissionAccepts(t *testing.T) {
	pools := `pools:
- {name: chat, models: [m1], aliases: [m1-alias], decode: [{url: "http://10.0.0.3:30000"}]}
- {name: bulk, models: [m2], decode: [{url: "http://10.0.0.4:30000"}]}
`
	tests := []struct{ name, yaml string }{
		{"every key", fullAdmission},
		{"a client's header, trusted", oneEngine + "admission: {class_header: x-priority, tenant_header: x-tenant-id, trust_client_headers: true}"},
		{"x-duet- header, trusted", oneEngine + "admission: {tenant_header: x-duet-tenant, trust_client_headers: true}"},
		{"upper-case hash", oneEngine + "admission: {api_keys: {" + strings.ToUpper(keyHash("k")) + ": default}}"},
		{"any model without pools", oneEngine + "admission: {models: {whatever: default}}"},
		{"models and aliases of pools", pools + "admission: {models: {m1: default, m1-alias: default, m2: default}, pools: {chat: default, bulk: default}}"},
		{"equal priorities", oneEngine + "admission: {classes: [{name: a}, {name: b}]}"},
		{"wait limit 5m", oneEngine + "admission: {classes: [{name: a, wait_limit: 5m}]}"},
		{"kv_fraction 1", oneEngine + "admission: {saturation: {kv_fraction: 1}}"},
		{"max_queued just below Envoy's", oneEngine + "envoy: {max_routing_requests: 100}\nadmission: {max_queued: 99}"},
		{"a default max_queued below a small Envoy limit", oneEngine + "envoy: {max_routing_requests: 2}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Parse([]byte(tt.yaml)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAdmissionConversions: the section as package admit and the scheduler
// take it, and the lookups duet makes per request.
func TestAdmissionConversions(t *testing.T) {
	cfg, err := Parse([]byte(fullAdmission))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Admission
	wantConfig := admit.Config{
		Classes:     []admit.Class{{Name: "interactive", Priority: 10, WaitLimit: 5 * time.Second}, {Name: "batch", WaitLimit: 30 * time.Second}},
		MaxRequests: 64, MaxTokens: 1 << 20, Weights: map[string]float64{"acme": 2},
	}
	wantRules := admit.Rules{
		Classes: []string{"interactive", "batch"}, Default: "batch", ClassHeader: "x-duet-priority",
		APIKeys: map[string]string{keyHash("secret-token-interactive"): "interactive"},
		Models:  map[string]string{"small-model": "interactive"}, Pools: map[string]string{"default": "batch"},
		TenantHeader: "x-duet-tenant", TenantFromAPIKey: true,
	}
	for _, tt := range []struct {
		name      string
		got, want any
	}{
		{"AdmitConfig", a.AdmitConfig(), wantConfig},
		{"AdmitRules", a.AdmitRules(), wantRules},
		{"SaturationConfig", a.SaturationConfig(), scheduler.SaturationConfig{PrefillTokens: 16384, KVFraction: 0.8, Waiting: -1}},
		{"MaxWaitLimit", a.MaxWaitLimit(), 30 * time.Second},
		{"ClassNames", a.ClassNames(), []string{"interactive", "batch"}},
		{"EnginePriority given", a.EnginePriority("interactive", false), 7},
		{"EnginePriority given, low values first", a.EnginePriority("interactive", true), 7},
		{"EnginePriority from priority", a.EnginePriority("batch", false), 0},
		{"EnginePriority of no class", a.EnginePriority("gold", false), 0},
		{"engine_priority mode", a.EnginePriorityMode, EnginePriorityOn},
		{"enabled", a.Enabled, true},
	} {
		if !reflect.DeepEqual(tt.got, tt.want) {
			t.Errorf("%s = %+v, want %+v", tt.name, tt.got, tt.want)
		}
	}
	if err := a.AdmitConfig().Validate(); err != nil {
		t.Errorf("package admit refuses AdmitConfig: %v", err)
	}
	cl, err := a.AdmitRules().Compile()
	if err != nil {
		t.Fatalf("package admit refuses AdmitRules: %v", err)
	}
	headers := map[string]string{"x-duet-priority": "interactive", "x-duet-tenant": "acme"}
	if class, tenant := cl.Classify(func(h string) string { return headers[h] }, "other-model", "default"); class != 0 || tenant != "acme" {
		t.Errorf("Classify by header = %d, %q; want 0 (interactive), acme", class, tenant)
	}
	headers = map[string]string{"authorization": "Bearer secret-token-interactive"}
	if class, tenant := cl.Classify(func(h string) string { return headers[h] }, "other-model", "default"); class != 0 || tenant != keyHash("secret-token-interactive")[:16] {
		t.Errorf("Classify by API key = %d, %q; want 0 (interactive) and the key's tenant", class, tenant)
	}
	if class, _ := cl.Classify(func(string) string { return "" }, "other-model", "default"); class != 1 {
		t.Errorf("Classify by pool = %d, want 1 (batch)", class)
	}

	// The default section converts to what package admit takes too.
	def, err := Parse([]byte(oneEngine))
	if err != nil {
		t.Fatal(err)
	}
	if err := def.Admission.AdmitConfig().Validate(); err != nil {
		t.Errorf("package admit refuses the default AdmitConfig: %v", err)
	}
	if _, err := def.Admission.AdmitRules().Compile(); err != nil {
		t.Errorf("package admit refuses the default AdmitRules: %v", err)
	}
	if got := def.Admission.EnginePriority(DefaultAdmissionClass, false); got != 0 {
		t.Errorf("EnginePriority(default) = %d, want 0", got)
	}
}

// TestWritesEnginePriority: the engine_priority modes, with the pool's
// engines advertising priority scheduling or not.
func TestWritesEnginePriority(t *testing.T) {
	tests := []struct {
		mode                  string
		advertised, notAdvert bool
	}{
		{EnginePriorityAuto, true, false},
		{EnginePriorityOn, true, true},
		{EnginePriorityOff, false, false},
	}
	for _, tt := range tests {
		a := Admission{EnginePriorityMode: tt.mode}
		if got := a.WritesEnginePriority(true); got != tt.advertised {
			t.Errorf("%s, advertised: %v, want %v", tt.mode, got, tt.advertised)
		}
		if got := a.WritesEnginePriority(false); got != tt.notAdvert {
			t.Errorf("%s, not advertised: %v, want %v", tt.mode, got, tt.notAdvert)
		}
	}
}
