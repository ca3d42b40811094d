package scheduler

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestLedgerLoadAndCover(t *testing.T) {
	t0 := time.Unix(1000, 0)
	key := TargetKey{URL: "http://a:1", Rank: 0}
	tests := []struct {
		name        string
		scrapeStart time.Time // zero: no scrape
		scraped     int64
		loadAt      time.Time
		wantTokens  int64
		wantFresh   bool
	}{
		{"reservation only", time.Time{}, 0, t0, 100, false},
		{"scrape before the request reached the engine keeps the hold", t0.Add(50 * time.Millisecond), 7, t0.Add(time.Second), 107, true},
		{"scrape after it covers the hold", t0.Add(500 * time.Millisecond), 90, t0.Add(time.Second), 90, true},
		{"stale scrape is not trusted", t0.Add(500 * time.Millisecond), 90, t0.Add(time.Minute), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(100*time.Millisecond, 5*time.Second, time.Hour)
			l.mu.Lock()
			ts := l.state(key)
			l.reserve(ts, "r1", RoleDecode, 100, t0, "m", 400)
			l.mu.Unlock()
			if !tt.scrapeStart.IsZero() {
				l.observe([]rankLoad{{key: key, tokens: tt.scraped}}, tt.scrapeStart, tt.scrapeStart.Add(10*time.Millisecond))
			}
			l.mu.Lock()
			got := l.load(ts, tt.loadAt)
			l.mu.Unlock()
			if got.Tokens != tt.wantTokens || got.Fresh != tt.wantFresh {
				t.Errorf("load = %+v, want tokens %d fresh %v", got, tt.wantTokens, tt.wantFresh)
			}
		})
	}
}

// TestLedgerPrefillAccounting checks the two ways prefill ranks are
// loaded: in flight (the default), where a prefill hold outlives covering
// scrapes until its leg's feedback and the load is the larger of holds and
// scraped pending tokens, and covered, where it behaves like decode.
func TestLedgerPrefillAccounting(t *testing.T) {
	t0 := time.Unix(1000, 0)
	key := TargetKey{URL: "http://p:1", Rank: 0}
	tests := []struct {
		name       string
		inFlight   bool
		scraped    int64
		release    bool // the prefill leg's feedback arrives before the load is read
		wantTokens int64
	}{
		{"in flight: a covering scrape keeps the hold", true, 30, false, 100},
		{"in flight: more pending than held (traffic duet did not send) wins", true, 250, false, 250},
		{"in flight: the leg's feedback ends the hold", true, 30, true, 30},
		{"covered: the scrape ends the hold", false, 30, false, 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(100*time.Millisecond, 5*time.Second, time.Hour)
			l.prefillInFlight = tt.inFlight
			l.mu.Lock()
			ts := l.state(key)
			ts.role = RolePrefill
			l.reserve(ts, "r1", RolePrefill, 100, t0, "m", 400)
			l.mu.Unlock()
			start := t0.Add(500 * time.Millisecond)
			l.observe([]rankLoad{{key: key, tokens: tt.scraped}}, start, start.Add(10*time.Millisecond))
			if tt.release {
				l.release("r1", RolePrefill)
			}
			l.mu.Lock()
			got := l.load(ts, t0.Add(time.Second))
			l.mu.Unlock()
			if got.Tokens != tt.wantTokens {
				t.Errorf("load = %+v, want tokens %d", got, tt.wantTokens)
			}
		})
	}
}

func TestLedgerReleaseByRole(t *testing.T) {
	l := newLedger(0, 0, 0)
	now := time.Now()
	l.mu.Lock()
	p, d := l.state(TargetKey{"http://p:1", 0}), l.state(TargetKey{"http://d:1", 1})
	l.reserve(p, "r1", RolePrefill, 40, now, "m", 160)
	l.reserve(d, "r1", RoleDecode, 60, now, "m", 160)
	l.mu.Unlock()

	if _, _, ok := l.release("r1", RolePrefill); !ok {
		t.Fatal("release found nothing")
	}
	if p.reserved != 0 || d.reserved != 60 {
		t.Fatalf("after prefill release: prefill %d decode %d", p.reserved, d.reserved)
	}
	model, bytes, ok := l.release("r1", "")
	if !ok || model != "m" || bytes != 160 || d.reserved != 0 {
		t.Fatalf("release all = %q %d %v, decode %d", model, bytes, ok, d.reserved)
	}
	if _, _, ok := l.release("r1", ""); ok {
		t.Error("a released request is still known")
	}
	if len(l.requests) != 0 {
		t.Errorf("%d requests left", len(l.requests))
	}
}

func TestLedgerExpireAndRetain(t *testing.T) {
	l := newLedger(0, 0, time.Minute)
	t0 := time.Unix(0, 0)
	l.mu.Lock()
	a, b := l.state(TargetKey{"http://a:1", 0}), l.state(TargetKey{"http://b:1", 0})
	l.reserve(a, "old", RoleDecode, 5, t0, "", 0)
	l.reserve(b, "new", RoleDecode, 7, t0.Add(2*time.Minute), "", 0)
	l.mu.Unlock()
	if n := l.expire(t0.Add(2 * time.Minute)); n != 1 || a.reserved != 0 || b.reserved != 7 {
		t.Fatalf("expire = %d, a %d b %d", n, a.reserved, b.reserved)
	}
	// Removing an endpoint drops its targets and their holds at once.
	l.mu.Lock()
	l.retain(func(k TargetKey) bool { return k.URL != "http://b:1" })
	_, stillB := l.targets[TargetKey{"http://b:1", 0}]
	l.reserve(b, "late", RoleDecode, 9, t0, "", 0) // a stale snapshot's pick
	l.mu.Unlock()
	if stillB || !b.removed || b.reserved != 0 || len(l.requests["new"].holds) != 0 || l.requests["late"] != nil {
		t.Errorf("retain kept b: present %v removed %v reserved %d", stillB, b.removed, b.reserved)
	}
	// The finished record lingers for the whole-request log entry, then goes.
	l.expire(time.Now().Add(finishedGrace + time.Second))
	if len(l.requests) != 0 {
		t.Errorf("%d finished requests not forgotten after the grace period", len(l.requests))
	}
}

func TestLedgerConcurrent(t *testing.T) {
	l := newLedger(time.Millisecond, time.Second, time.Hour)
	keys := []TargetKey{{"http://a:1", 0}, {"http://a:1", 1}}
	l.mu.Lock()
	states := []*targetState{l.state(keys[0]), l.state(keys[1])}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				id := fmt.Sprintf("g%d-%d", g, i)
				l.mu.Lock()
				l.reserve(states[i%2], id, RoleDecode, 10, time.Now(), "m", 40)
				l.mu.Unlock()
				if i%3 == 0 {
					l.observe([]rankLoad{{key: keys[i%2], tokens: 5}}, time.Now(), time.Now())
				}
				l.release(id, "")
			}
		})
	}
	wg.Wait()
	if states[0].reserved != 0 || states[1].reserved != 0 || len(l.requests) != 0 {
		t.Errorf("leaked reservations: %d %d, %d requests", states[0].reserved, states[1].reserved, len(l.requests))
	}
}
