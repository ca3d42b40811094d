package scheduler

import (
	"testing"
)

func TestDecodeFallback(t *testing.T) {
	specs := []EndpointSpec{
		{URL: newFakeEngine(t, serverInfo200(info(4, "null", 9000))).url()},
		{URL: newFakeEngine(t, serverInfo200(info(2, "null", 9001))).url()},
		{URL: newFakeEngine(t, serverInfo200(info(4, "null", 9002))).url()},
	}
	s := newTestScheduler(t, Config{Decode: specs}, nil)
	mustDiscover(t, s)
	eps := s.Endpoints()
	target := func(i, rank int) Target { return Target{Endpoint: &eps[i], Rank: rank} }

	// Rank 3 exists only on the dp-4 engines: the fallback is always engine 2.
	for range 4 {
		if fb := s.DecodeFallback(target(0, 3)); fb == nil || fb.URL != eps[2].URL {
			t.Fatalf("rank 3 on engine 0: fallback %v, want engine 2", fb)
		}
	}
	// Rank 1 fits both others: consecutive calls rotate over them, never
	// naming the chosen engine itself.
	seen := map[string]bool{}
	for range 6 {
		fb := s.DecodeFallback(target(0, 1))
		if fb == nil || fb.URL == eps[0].URL {
			t.Fatalf("rank 1 on engine 0: fallback %v", fb)
		}
		seen[fb.URL] = true
	}
	if len(seen) != 2 {
		t.Errorf("fallbacks %v, want both other engines", seen)
	}
	// An engine that refused a connection is ejected: no longer a fallback.
	s.Complete(Feedback{RequestID: "x", Role: RoleDecode, Address: eps[2].Address, Rank: 0, Failed: true, Unreachable: true})
	if fb := s.DecodeFallback(target(0, 3)); fb != nil {
		t.Errorf("rank 3 with engine 2 ejected: fallback %v, want none", fb)
	}
	if fb := s.DecodeFallback(Target{}); fb != nil {
		t.Errorf("no endpoint: fallback %v", fb)
	}
}

func TestDecodeFallbackSingleEngine(t *testing.T) {
	s := newTestScheduler(t, Config{Decode: enginePool(t, 1, 2, "null")}, nil)
	mustDiscover(t, s)
	eps := s.Endpoints()
	if fb := s.DecodeFallback(Target{Endpoint: &eps[0], Rank: 0}); fb != nil {
		t.Errorf("one engine: fallback %v, want none", fb)
	}
}
