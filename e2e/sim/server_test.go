package sim

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "defaults", cfg: Config{}},
		{name: "bad mode", cfg: Config{Mode: "both"}, wantErr: "invalid mode"},
		{name: "bad listen", cfg: Config{Listen: "nope"}, wantErr: "invalid listen address"},
		{name: "negative dp", cfg: Config{DPSize: -1}, wantErr: "dp-size must be >= 1"},
		{name: "bootstrap port", cfg: Config{BootstrapPort: 70000}, wantErr: "bootstrap-port out of range"},
		{name: "negative latency", cfg: Config{DecodePerToken: -1}, wantErr: "latencies must not be negative"},
		{name: "negative capacity", cfg: Config{MaxTotalTokens: -5}, wantErr: "max-total-tokens"},
		{name: "negative health timeout", cfg: Config{HealthTimeout: -time.Second}, wantErr: "health timeout"},
		{name: "bad loads fault", cfg: Config{Faults: Faults{Loads: "flaky"}}, wantErr: "invalid loads fault"},
		{name: "bad error rate", cfg: Config{Faults: Faults{ErrorRate: 1.5}}, wantErr: "fault error rate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, nil)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestStartAndClose runs a prefill and a decode on real loopback listeners
// with free ports and sends a PD pair through them.
func TestStartAndClose(t *testing.T) {
	ctx := context.Background()
	p, err := New(Config{Mode: ModePrefill, Listen: "127.0.0.1:0", DPSize: 2}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatalf("start prefill: %v", err)
	}
	defer p.Close()
	if err := p.Start(ctx); err == nil {
		t.Fatal("second Start succeeded")
	}
	bootPort := p.BootstrapAddr().(*net.TCPAddr).Port
	if p.Config().BootstrapPort != bootPort || bootPort == 0 {
		t.Fatalf("bootstrap port %d, config %d", bootPort, p.Config().BootstrapPort)
	}
	d, err := New(Config{Mode: ModeDecode, Listen: "127.0.0.1:0", DPSize: 2, BootstrapPort: bootPort, KVTimeout: 5 * time.Second},
		zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatalf("start decode: %v", err)
	}
	defer d.Close()
	if d.BootstrapAddr() != nil {
		t.Fatal("decode listens on a bootstrap port")
	}

	pURL, dURL := "http://"+p.Addr().String(), "http://"+d.Addr().String()
	var info map[string]any
	get(t, pURL+"/server_info").json(t, &info)
	if info["disaggregation_bootstrap_port"] != float64(bootPort) || info["port"] != float64(p.Addr().(*net.TCPAddr).Port) {
		t.Fatalf("server_info ports %v %v", info["disaggregation_bootstrap_port"], info["port"])
	}
	body := pdBody("127.0.0.1", nil, 1234, "")
	if r := post(t, pURL+"/v1/chat/completions", body); r.status != 200 || r.header.Get("X-Sim-Server") != p.Addr().String() {
		t.Fatalf("prefill %d %v", r.status, r.header)
	}
	if r := post(t, dURL+"/v1/chat/completions", body); r.status != 200 || r.header.Get("X-Sim-Prefill-DP-Rank") != "0" {
		t.Fatalf("decode %d %v %s", r.status, r.header, r.body)
	}

	// Close aborts a request that is still waiting for its KV.
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(dURL+"/v1/chat/completions", "application/json",
			strings.NewReader(pdBody("127.0.0.1", nil, 999, "")))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	eventually(t, "decode waiting", func() bool {
		s := d.load.snapshot()
		return s[0].transfer+s[1].transfer == 1
	})
	if err := d.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not abort the waiting request")
	}
	if _, err := http.Get(dURL + "/health"); err == nil {
		t.Fatal("decode still serving after Close")
	}
	shutCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := p.Shutdown(shutCtx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}
