package main

import (
	"testing"
	"time"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/scheduler"
)

// The health section reaches the scheduler field by field.
func TestSchedulerConfigHealth(t *testing.T) {
	cfg, err := config.Parse([]byte(`
decode: [{url: "http://127.0.0.1:30000"}]
health: {interval: 2s, timeout: 500ms, path: /ping, unreachable_to_eject: 2, failures_to_eject: -1,
         probe_failures: 3, base_ejection: 1s, max_ejection: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := scheduler.HealthConfig{
		Interval: 2 * time.Second, Timeout: 500 * time.Millisecond, Path: "/ping",
		UnreachableToEject: 2, FailuresToEject: -1, ProbeFailures: 3,
		BaseEjection: time.Second, MaxEjection: time.Minute,
	}
	if got := schedulerConfig(cfg).Health; got != want {
		t.Errorf("Health = %+v, want %+v", got, want)
	}
}
