package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/scheduler"
)

// readyWhy is a readiness with fixed answers.
type readyWhy struct {
	ready    bool
	reason   string
	excluded []string
}

func (r readyWhy) Ready() bool             { return r.ready }
func (r readyWhy) Why() (string, []string) { return r.reason, r.excluded }

// /readyz says why duet is not ready, and which engines it does not
// schedule while it is.
func TestReadyzSaysWhy(t *testing.T) {
	tests := []struct {
		name     string
		sched    readyWhy
		stopping bool
		code     int
		body     string
	}{
		{"ready", readyWhy{ready: true}, false, 200, "ready\n"},
		{"ready with an engine left out", readyWhy{ready: true, excluded: []string{`prefill engine http://p:1 reports disaggregation_mode "decode", expected "prefill"`}},
			false, 200, "ready\nnot scheduled: prefill engine http://p:1 reports disaggregation_mode \"decode\", expected \"prefill\"\n"},
		{"waiting for an engine", readyWhy{reason: "no usable decode engine: waiting for decode engine http://d:1 (not discovered yet)"},
			false, 503, "not ready: no usable decode engine: waiting for decode engine http://d:1 (not discovered yet)\n"},
		{"no reason known", readyWhy{}, false, 503, "not ready: no ready endpoint\n"},
		{"stopping", readyWhy{ready: true}, true, 503, "shutting down\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stopping atomic.Bool
			stopping.Store(tt.stopping)
			srv := httptest.NewServer(adminMux(prometheus.NewRegistry(), tt.sched, &stopping))
			defer srv.Close()
			code, body := readyz(t, srv.URL)
			if code != tt.code || body != tt.body {
				t.Errorf("/readyz = %d %q, want %d %q", code, body, tt.code, tt.body)
			}
		})
	}
}

// readyz fetches base's /readyz.
func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// With several pools, each line names its pool; a pool whose only engine
// runs in the wrong mode does not make duet unready while another pool
// serves, but /readyz names the engine.
func TestPoolSetWhy(t *testing.T) {
	engine := func(mode string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, `{"dp_size":1,"disaggregation_mode":%q}`, mode)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	wrong, right := engine("prefill"), engine("null")
	var ps poolSet
	for _, p := range []struct{ name, url string }{{"a", wrong}, {"b", right}} {
		s, err := scheduler.New(scheduler.Config{Decode: []scheduler.EndpointSpec{{URL: p.url}},
			Load: scheduler.LoadConfig{Interval: -1}, DiscoveryTimeout: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Discover(context.Background())
		ps = append(ps, &pool{cfg: config.Pool{Name: p.name}, sched: s})
	}
	why := fmt.Sprintf(`pool a: decode engine %s reports disaggregation_mode "prefill", expected "null"`, wrong)
	reason, excluded := ps.Why()
	if !ps.Ready() || reason != fmt.Sprintf(`pool a: no usable decode engine: decode engine %s reports disaggregation_mode "prefill", expected "null"`, wrong) ||
		len(excluded) != 1 || excluded[0] != why {
		t.Errorf("Ready %v, Why = %q, %q; want ready, pool a's engine named", ps.Ready(), reason, excluded)
	}
	var stopping atomic.Bool
	srv := httptest.NewServer(adminMux(prometheus.NewRegistry(), ps, &stopping))
	defer srv.Close()
	if code, body := readyz(t, srv.URL); code != 200 || body != "ready\nnot scheduled: "+why+"\n" {
		t.Errorf("/readyz = %d %q", code, body)
	}
}
