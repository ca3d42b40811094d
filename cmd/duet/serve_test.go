package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/scheduler"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
	if got := schedulerConfig(cfg, cfg.PoolList()[0]).Health; got != want {
		t.Errorf("Health = %+v, want %+v", got, want)
	}
}

// readyFlag is a readiness a test switches.
type readyFlag struct{ ready atomic.Bool }

func (r *readyFlag) Ready() bool { return r.ready.Load() }

func (r *readyFlag) Why() (string, []string) { return "", nil }

// gRPC health follows readiness, so that Envoy's health checks send no
// stream to a replica that does not know its engines yet.
func TestFollowReadiness(t *testing.T) {
	hs := health.NewServer()
	var sched readyFlag
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go followReadiness(ctx, hs, &sched, time.Millisecond)
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		r, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return r.GetStatus()
	}
	for _, step := range []struct {
		ready bool
		want  healthpb.HealthCheckResponse_ServingStatus
	}{{false, healthpb.HealthCheckResponse_NOT_SERVING}, {true, healthpb.HealthCheckResponse_SERVING}, {false, healthpb.HealthCheckResponse_NOT_SERVING}} {
		sched.ready.Store(step.ready)
		deadline := time.Now().Add(2 * time.Second)
		for status() != step.want {
			if time.Now().After(deadline) {
				t.Fatalf("ready=%v: gRPC health %v, want %v", step.ready, status(), step.want)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
