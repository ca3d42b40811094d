package scheduler

import (
	"errors"
	"testing"
)

// New refuses inconsistent EmptyPools and PD settings.
func TestNewEmptyPoolsRejects(t *testing.T) {
	a := newFakeEngine(t, serverInfo200(info(1, "prefill", 9000)))
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no decode without EmptyPools", Config{}},
		{"PD without EmptyPools", Config{PD: true, Decode: specsOf(a)}},
		{"prefill listed without PD", Config{EmptyPools: true, Prefill: specsOf(a)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(testConfig(tt.cfg), nil); err == nil {
				t.Fatal("New accepted the configuration")
			}
		})
	}
}

// With EmptyPools a scheduler starts without endpoints, is not ready and
// fails picks until SetEndpoints lists some, accepts empty lists again later
// (PD mode stays), and still refuses a prefill pool it was not created with.
func TestEmptyPools(t *testing.T) {
	d := newFakeEngine(t, serverInfo200(info(2, "decode", -1)))
	p := newFakeEngine(t, serverInfo200(info(1, "prefill", 9000)))
	tests := []struct {
		name string
		pd   bool
	}{
		{"pd", true},
		{"aggregated", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestScheduler(t, Config{EmptyPools: true, PD: tt.pd, Load: LoadConfig{Interval: -1}}, nil)
			mustDiscover(t, s)
			if s.PD() != tt.pd {
				t.Fatalf("PD() = %v, want %v", s.PD(), tt.pd)
			}
			if s.Ready() {
				t.Fatal("ready without endpoints")
			}
			if _, err := s.Pick(testContext(t), &Request{ID: "r0"}); !errors.Is(err, ErrNoEndpoints) {
				t.Fatalf("Pick without endpoints: %v, want ErrNoEndpoints", err)
			}
			var prefill []EndpointSpec
			if tt.pd {
				prefill = specsOf(p)
			}
			if err := s.SetEndpoints(testContext(t), prefill, specsOf(d)); err != nil {
				t.Fatalf("SetEndpoints: %v", err)
			}
			if !s.Ready() {
				t.Fatal("not ready once both pools have a discovered endpoint")
			}
			dec, err := s.Pick(testContext(t), &Request{ID: "r1"})
			if err != nil {
				t.Fatalf("Pick: %v", err)
			}
			if dec.Decode.Endpoint.URL != d.url() || (dec.Prefill != nil) != tt.pd {
				t.Errorf("Pick = %+v", dec)
			}
			if tt.pd {
				// The prefill pool empties: PD mode stays, picks fail on it.
				if err := s.SetEndpoints(testContext(t), nil, specsOf(d)); err != nil {
					t.Fatalf("SetEndpoints without prefill: %v", err)
				}
				if s.Ready() || !s.PD() {
					t.Errorf("Ready() = %v, PD() = %v without prefill endpoints, want false, true", s.Ready(), s.PD())
				}
				if _, err := s.Pick(testContext(t), &Request{ID: "r2"}); !errors.Is(err, ErrNoEndpoints) {
					t.Errorf("Pick without prefill endpoints: %v, want ErrNoEndpoints", err)
				}
			} else if err := s.SetEndpoints(testContext(t), specsOf(p), specsOf(d)); !errors.Is(err, ErrModeChange) {
				t.Errorf("adding a prefill pool: %v, want ErrModeChange", err)
			}
			if err := s.SetEndpoints(testContext(t), nil, nil); err != nil {
				t.Fatalf("SetEndpoints(nil, nil): %v", err)
			}
			if len(s.Endpoints()) != 0 || s.Ready() {
				t.Errorf("after emptying: %d endpoints, ready %v", len(s.Endpoints()), s.Ready())
			}
		})
	}
}
