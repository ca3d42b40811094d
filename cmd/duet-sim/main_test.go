package main

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/duet-router/duet/e2e/sim"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(t *testing.T, o options)
		wantErr string
	}{
		{name: "defaults", args: nil, check: func(t *testing.T, o options) {
			c := o.cfg
			if c.Mode != sim.ModeNull || c.Listen != "127.0.0.1:30000" || c.DPSize != 1 || c.BootstrapPort != 8998 ||
				c.Model != "sim-model" || c.KVTimeout != 300*time.Second || c.PrefillPer1KTokens != 10*time.Millisecond ||
				c.DecodePerToken != 2*time.Millisecond || c.MaxTotalTokens != 500000 || c.LegacyServerInfo || o.logLevel != "info" {
				t.Fatalf("defaults %+v %q", c, o.logLevel)
			}
		}},
		{name: "all flags", args: []string{"--mode", "prefill", "--listen", "0.0.0.0:1", "--dp-size", "8",
			"--bootstrap-port", "9000", "--model", "m", "--kv-timeout", "2s", "--prefill-ms-per-1k-tokens", "0.5",
			"--decode-ms-per-token", "0", "--max-total-tokens", "42", "--legacy-server-info", "--log-level", "debug"},
			check: func(t *testing.T, o options) {
				c := o.cfg
				if c.Mode != sim.ModePrefill || c.Listen != "0.0.0.0:1" || c.DPSize != 8 || c.BootstrapPort != 9000 ||
					c.Model != "m" || c.KVTimeout != 2*time.Second || c.PrefillPer1KTokens != 500*time.Microsecond ||
					c.DecodePerToken != 0 || c.MaxTotalTokens != 42 || !c.LegacyServerInfo || o.logLevel != "debug" {
					t.Fatalf("parsed %+v %q", c, o.logLevel)
				}
			}},
		{name: "engine model flags", args: []string{"--profile", "dsv3-dp8-h100-node", "--time-scale", "10", "--seed", "42",
			"--kv-transfer-gbps", "25", "--fault-spike-prob", "0.1", "--fault-spike-ms", "250", "--fault-error-rate", "0.01",
			"--fault-die-after", "100", "--fault-slow-scrape-ms", "30", "--max-running-requests", "64"},
			check: func(t *testing.T, o options) {
				c := o.cfg
				f := c.Faults
				if c.Profile != "dsv3-dp8-h100-node" || c.TimeScale != 10 || c.Seed != 42 || c.KVTransferGBps != 25 ||
					f.SpikeProb != 0.1 || f.Spike != 250*time.Millisecond || f.ErrorRate != 0.01 || f.DieAfter != 100 ||
					f.SlowScrape != 30*time.Millisecond || c.MaxRunningRequests != 64 || c.Flavor != sim.FlavorSGLang {
					t.Fatalf("parsed %+v", c)
				}
				// Not given: the profile decides (0 in Config).
				if c.DPSize != 0 || c.MaxTotalTokens != 0 || c.DPAttention != nil {
					t.Fatalf("profile defaults overridden: dp %d max tokens %d dp-attention %v", c.DPSize, c.MaxTotalTokens, c.DPAttention)
				}
				s, err := sim.New(c, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if e := s.Config(); e.DPSize != 8 || e.MaxTotalTokens != 150000 || !*e.DPAttention {
					t.Fatalf("effective %+v", e)
				}
			}},
		{name: "explicit values win over the profile", args: []string{"--profile", "dense-8b-h100", "--dp-size", "4",
			"--max-total-tokens", "1000", "--dp-attention"},
			check: func(t *testing.T, o options) {
				c := o.cfg
				if c.DPSize != 4 || c.MaxTotalTokens != 1000 || c.DPAttention == nil || !*c.DPAttention || c.MaxRunningRequests != 0 {
					t.Fatalf("parsed %+v", c)
				}
			}},
		{name: "dp-attention off", args: []string{"--profile", "dsv3-dp8-h100-node", "--dp-attention=false"},
			check: func(t *testing.T, o options) {
				if o.cfg.DPAttention == nil || *o.cfg.DPAttention {
					t.Fatalf("dp-attention %v", o.cfg.DPAttention)
				}
			}},
		{name: "vllm", args: []string{"--flavor", "vllm"},
			check: func(t *testing.T, o options) {
				if o.cfg.Flavor != sim.FlavorVLLM {
					t.Fatalf("flavor %q", o.cfg.Flavor)
				}
			}},
		{name: "hang and loads faults", args: []string{"--fault-hang", "--fault-loads", "garbage", "--health-timeout", "3s"},
			check: func(t *testing.T, o options) {
				f := o.cfg.Faults
				if !f.Hang || f.Loads != sim.LoadsGarbage || o.cfg.HealthTimeout != 3*time.Second {
					t.Fatalf("parsed %+v health timeout %v", f, o.cfg.HealthTimeout)
				}
			}},
		{name: "fault defaults", args: nil, check: func(t *testing.T, o options) {
			f := o.cfg.Faults
			if f.Hang || f.Loads != sim.LoadsOK || o.cfg.HealthTimeout != 20*time.Second {
				t.Fatalf("parsed %+v health timeout %v", f, o.cfg.HealthTimeout)
			}
		}},
		{name: "loads 500", args: []string{"--fault-loads", "500"}, check: func(t *testing.T, o options) {
			if o.cfg.Faults.Loads != sim.Loads500 {
				t.Fatalf("loads %q", o.cfg.Faults.Loads)
			}
		}},
		{name: "decode radix cache flags", args: []string{"--mode", "decode", "--profile", "dense-8b-h100",
			"--disaggregation-decode-enable-radix-cache", "--enable-hierarchical-cache", "--hicache-ratio", "3",
			"--hicache-load-gbps", "12.5", "--sim-double-count-cached-tokens"},
			check: func(t *testing.T, o options) {
				c := o.cfg
				if !c.DecodeRadixCache || !c.HierarchicalCache || c.HiCacheRatio != 3 || c.HiCacheLoadGBps != 12.5 || !c.DoubleCountCachedTokens {
					t.Fatalf("parsed %+v", c)
				}
				s, err := sim.New(c, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
			}},
		{name: "decode radix cache defaults", args: nil, check: func(t *testing.T, o options) {
			c := o.cfg
			if c.DecodeRadixCache || c.HierarchicalCache || c.HiCacheRatio != 2 || c.HiCacheLoadGBps != 25 || c.DoubleCountCachedTokens {
				t.Fatalf("parsed %+v", c)
			}
		}},
		{name: "host tier alone is a config error", args: []string{"--mode", "decode", "--enable-hierarchical-cache"},
			check: func(t *testing.T, o options) {
				_, err := sim.New(o.cfg, nil)
				if err == nil || !strings.Contains(err.Error(), "--enable-hierarchical-cache requires --disaggregation-decode-enable-radix-cache") {
					t.Fatalf("err %v", err)
				}
			}},
		{name: "kv events config", args: []string{"--profile", "dense-8b-h100", "--kv-events-config",
			`{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "bind": true, "replay_endpoint": "tcp://127.0.0.1:5558", "buffer_steps": 7}`},
			check: func(t *testing.T, o options) {
				if !strings.Contains(o.cfg.KVEventsConfig, `"buffer_steps": 7`) {
					t.Fatalf("kv events config %q", o.cfg.KVEventsConfig)
				}
				s, err := sim.New(o.cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
			}},
		{name: "kv events config errors", args: []string{"--kv-events-config", `{"publisher": "kafka"}`},
			check: func(t *testing.T, o options) {
				_, err := sim.New(o.cfg, nil)
				if err == nil || !strings.Contains(err.Error(), "Unknown event publisher 'kafka'") {
					t.Fatalf("err %v", err)
				}
			}},
		{name: "kv events config alone is refused, naming --profile", args: []string{"--kv-events-config",
			`{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5600"}`},
			check: func(t *testing.T, o options) {
				s, err := sim.New(o.cfg, nil)
				if err == nil {
					s.Close()
					t.Fatal("duet-sim accepted --kv-events-config without --profile: it would publish nothing")
				}
				for _, want := range []string{"--kv-events-config needs --profile", "dense-8b-h100", "--tokenizer-path"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("err %q lacks %q", err, want)
					}
				}
			}},
		{name: "kv events without a tokenizer warn", args: []string{"--profile", "dense-8b-h100", "--kv-events-config",
			`{"publisher":"zmq","endpoint":"tcp://*:5557"}`},
			check: func(t *testing.T, o options) {
				core, logs := observer.New(zap.WarnLevel)
				s, err := sim.New(o.cfg, zap.New(core))
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if logs.FilterMessageSnippet("without --tokenizer-path only prompts sent as token ids").Len() != 1 {
					t.Fatalf("warnings %v: want the text prompts named", logs.All())
				}
			}},
		{name: "priority scheduling flags", args: []string{"--enable-priority-scheduling", "--schedule-low-priority-values-first",
			"--abort-on-priority-when-disabled"},
			check: func(t *testing.T, o options) {
				c := o.cfg
				if !c.EnablePriorityScheduling || !c.ScheduleLowPriorityValuesFirst || !c.AbortOnPriorityWhenDisabled {
					t.Fatalf("parsed %+v", c)
				}
			}},
		{name: "priority scheduling defaults", args: nil, check: func(t *testing.T, o options) {
			c := o.cfg
			if c.EnablePriorityScheduling || c.ScheduleLowPriorityValuesFirst || c.AbortOnPriorityWhenDisabled {
				t.Fatalf("parsed %+v", c)
			}
		}},
		{name: "priority flags are SGLang's", args: []string{"--flavor", "vllm", "--enable-priority-scheduling"},
			check: func(t *testing.T, o options) {
				_, err := sim.New(o.cfg, nil)
				if err == nil || !strings.Contains(err.Error(), "flavor vllm does not take them") {
					t.Fatalf("err %v", err)
				}
			}},
		{name: "bad loads fault", args: []string{"--fault-loads", "slow"}, wantErr: "invalid loads fault"},
		{name: "bad flavor", args: []string{"--flavor", "tgi"}, wantErr: "invalid flavor"},
		{name: "negative spike", args: []string{"--fault-spike-ms", "-1"}, wantErr: "must not be negative"},
		{name: "bad mode", args: []string{"--mode", "both"}, wantErr: "invalid mode"},
		{name: "negative latency", args: []string{"--decode-ms-per-token", "-1"}, wantErr: "must not be negative"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}
}

func TestNewLogger(t *testing.T) {
	if _, err := newLogger("loud"); err == nil {
		t.Fatal("invalid level accepted")
	}
	if _, err := newLogger("warn"); err != nil {
		t.Fatal(err)
	}
}

func TestEnvTrue(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{{"1", true}, {"true", true}, {"True", true}, {" yes ", true}, {"", false}, {"0", false}, {"false", false}, {"on?", false}} {
		if got := envTrue(tc.v); got != tc.want {
			t.Errorf("envTrue(%q) = %v, want %v", tc.v, got, tc.want)
		}
	}
}
