package harness

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestParseEnvoyCounters(t *testing.T) {
	got, err := parseEnvoyCounters("cluster.duet_decode.upstream_rq_total: 830\ncluster.duet_prefill.upstream_rq_total: 829\nnoise\n")
	if err != nil {
		t.Fatal(err)
	}
	if got["cluster.duet_decode.upstream_rq_total"] != 830 || got["cluster.duet_prefill.upstream_rq_total"] != 829 || len(got) != 2 {
		t.Errorf("got %v", got)
	}
	if _, err := parseEnvoyCounters("cluster.x.upstream_rq_time: P0(nan,1) P25(nan,2)\n"); err == nil {
		t.Error("a histogram line parsed as a counter")
	}
}

// A process that fails to bind its port is told apart from other failures,
// so that Start can try again on other ports.
func TestWaitHTTPPortTaken(t *testing.T) {
	for _, tt := range []struct {
		name, stderr string
		taken        bool
	}{
		{"envoy", "cannot bind '127.0.0.1:42781': Address already in use", true},
		{"go", "listen tcp 127.0.0.1:9003: bind: address already in use", true},
		{"other", "config: unknown field", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := startProcess(t.TempDir(), tt.name, "/bin/sh", "-c", "echo \""+tt.stderr+"\" >&2; exit 1")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = waitHTTP(ctx, p, "http://127.0.0.1:1/never")
			if err == nil || errors.Is(err, errPortTaken) != tt.taken {
				t.Errorf("err = %v, want port taken: %v", err, tt.taken)
			}
		})
	}
}
