package main

import (
	"strings"
	"testing"
	"time"

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
