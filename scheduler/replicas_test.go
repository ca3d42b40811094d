package scheduler

import (
	"fmt"
	"testing"
)

// replicaPair builds two least_tokens schedulers over the same engines;
// with share, each applies the other's picks, as replicas do over NATS.
func replicaPair(t *testing.T, share bool) (a, b *Scheduler) {
	t.Helper()
	pool := enginePool(t, 2, 2, "null")
	mk := func(other **Scheduler) *Scheduler {
		cfg := Config{Decode: pool, DecodePolicy: PolicySpec{Name: "least_tokens"}}
		if share {
			cfg.OnPicked = func(p Picked) { (*other).ApplyPicked(p) }
		}
		s := newTestScheduler(t, cfg, nil)
		mustDiscover(t, s)
		return s
	}
	a, b = mk(&b), mk(&a)
	return a, b
}

// Requests alternate between two replicas. Sharing their picks, they
// spread the work over every target as one scheduler would; sharing
// nothing, each fills the same targets first.
func TestReplicasSharePicks(t *testing.T) {
	for _, tt := range []struct {
		share   bool
		targets int // distinct targets of the first four picks
	}{{true, 4}, {false, 2}} {
		t.Run(fmt.Sprintf("share=%v", tt.share), func(t *testing.T) {
			a, b := replicaPair(t, tt.share)
			seen := map[string]bool{}
			for i := range 4 {
				s := []*Scheduler{a, b}[i%2]
				d, err := s.Pick(testContext(t), &Request{ID: fmt.Sprint("r", i), Prompt: make([]byte, 400)})
				if err != nil {
					t.Fatal(err)
				}
				seen[d.Decode.String()] = true
			}
			if len(seen) != tt.targets {
				t.Errorf("the first four picks reached %d targets, want %d: %v", len(seen), tt.targets, seen)
			}
		})
	}
}

// A request's feedback, applied on every replica, ends its holds on every
// replica, whichever routed it.
func TestReplicasReleaseEverywhere(t *testing.T) {
	a, b := replicaPair(t, true)
	d, err := a.Pick(testContext(t), &Request{ID: "r", Prompt: make([]byte, 400), MaxTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	reserved := func(s *Scheduler) int64 {
		s.ledger.mu.Lock()
		defer s.ledger.mu.Unlock()
		var n int64
		for _, ts := range s.ledger.targets {
			n += ts.reserved
		}
		return n
	}
	if ra, rb := reserved(a), reserved(b); ra == 0 || ra != rb {
		t.Fatalf("reserved: router %d, peer %d; want the same, non-zero", ra, rb)
	}
	f := Feedback{RequestID: "r", Role: RoleDecode, Address: d.Decode.Endpoint.Address, Rank: d.Decode.Rank}
	for _, s := range []*Scheduler{a, b} {
		s.Complete(f)
	}
	if ra, rb := reserved(a), reserved(b); ra != 0 || rb != 0 {
		t.Errorf("after the feedback: router %d, peer %d reserved", ra, rb)
	}
}

// A pick's prefix blocks are indexed on the peer's same target, and a
// target the peer does not know is skipped.
func TestApplyPickedIndexesPrefix(t *testing.T) {
	_, b := replicaPair(t, false)
	key := b.snap.Load().decode.targets[1].Key()
	unknown := TargetKey{URL: "http://10.9.9.9:1", Rank: 0}
	b.ApplyPicked(Picked{RequestID: "x", Blocks: []uint64{1, 2, 3},
		Holds:   []PickedHold{{Role: RoleDecode, Target: key, Tokens: 50, Work: 40}, {Role: RoleDecode, Target: unknown, Tokens: 5}},
		Indexed: []TargetKey{key, unknown}})
	if n := b.index.Blocks(key); n != 3 {
		t.Errorf("the peer indexed %d blocks on %v, want 3", n, key)
	}
	b.ledger.mu.Lock()
	ts := b.ledger.targets[key]
	got, work := ts.reserved, ts.reservedWork
	b.ledger.mu.Unlock()
	if got != 50 || work != 40 {
		t.Errorf("the peer reserved %d tokens (%d work), want 50 (40)", got, work)
	}
	// The same event again (sent twice) changes nothing.
	b.ApplyPicked(Picked{RequestID: "x", Holds: []PickedHold{{Role: RoleDecode, Target: key, Tokens: 50, Work: 40}}})
	b.ledger.mu.Lock()
	again := ts.reserved
	b.ledger.mu.Unlock()
	if again != 50 {
		t.Errorf("a repeated pick reserved again: %d tokens", again)
	}
}
