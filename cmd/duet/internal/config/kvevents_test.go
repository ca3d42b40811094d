package config

import (
	"strings"
	"testing"
	"time"
)

// TestKVEvents: the section's defaults, its refusals, and which pools
// follow events in each mode.
func TestKVEvents(t *testing.T) {
	const base = "decode:\n  - url: http://10.0.0.2:30000\n"
	tests := []struct {
		name, yaml string
		wantErr    string
		tokenizer  bool // whether the pool has a tokenizer
		enabled    bool
	}{
		{name: "defaults, no tokenizer", yaml: base},
		{name: "defaults, a tokenizer", yaml: base + "tokenizer: {file: t.json, config: c.json}\n", tokenizer: true, enabled: true},
		{name: "on without a tokenizer", yaml: base + "kv_events: {mode: on}\n", enabled: true},
		{name: "off with a tokenizer", yaml: base + "tokenizer: {file: t.json, config: c.json}\nkv_events: {mode: off}\n", tokenizer: true},
		{name: "configured ports", yaml: base + "kv_events: {mode: on, port: 5557, replay_port: 5558, topic: kv}\n", enabled: true},
		{name: "unknown mode", yaml: base + "kv_events: {mode: always}\n", wantErr: `kv_events.mode: "always"`},
		{name: "bad port", yaml: base + "kv_events: {port: 70000}\n", wantErr: "kv_events.port: 70000 is not a port"},
		{name: "replay without port", yaml: base + "kv_events: {replay_port: 5558}\n", wantErr: "kv_events.replay_port: set without kv_events.port"},
		{name: "negative warmup", yaml: base + "kv_events: {warmup: -1s}\n", wantErr: "kv_events.warmup"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.yaml))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			k := cfg.KVEvents
			if k.MaxLag != 5*time.Second || k.Warmup != time.Minute || k.ExpectFor != 30*time.Second || k.ProbeInterval != 2*time.Second || k.MaxPages != 1<<20 {
				t.Errorf("defaults %+v", k)
			}
			pools := cfg.PoolList()
			if len(pools) != 1 || (pools[0].Tokenizer != nil) != tc.tokenizer {
				t.Fatalf("pools %+v", pools)
			}
			if got := k.Enabled(pools[0]); got != tc.enabled {
				t.Errorf("Enabled = %v, want %v", got, tc.enabled)
			}
		})
	}
}
