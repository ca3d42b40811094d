package admit

import (
	"errors"
	"testing"
	"time"
)

var t0 = time.Unix(1_000_000, 0)

func testConfig() Config {
	return Config{
		Classes:     []Class{{Name: "batch", Priority: 0, WaitLimit: 30 * time.Second}, {Name: "interactive", Priority: 10, WaitLimit: 5 * time.Second}},
		MaxRequests: 100, MaxTokens: 1 << 30,
	}
}

func mustQueue(t *testing.T, cfg Config) *Queue {
	t.Helper()
	q, err := NewQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func push(t *testing.T, q *Queue, r Request, now time.Time) *Entry {
	t.Helper()
	e, shed, err := q.Push(r, now)
	if err != nil || len(shed) > 0 {
		t.Fatalf("push %+v: shed %d, %v", r, len(shed), err)
	}
	return e
}

func TestConfigValidate(t *testing.T) {
	ok := testConfig()
	tests := []struct {
		name   string
		change func(*Config)
	}{
		{"no classes", func(c *Config) { c.Classes = nil }},
		{"unnamed class", func(c *Config) { c.Classes[0].Name = "" }},
		{"twice", func(c *Config) { c.Classes[1].Name = "batch" }},
		{"no wait", func(c *Config) { c.Classes[0].WaitLimit = 0 }},
		{"no request bound", func(c *Config) { c.MaxRequests = 0 }},
		{"no token bound", func(c *Config) { c.MaxTokens = 0 }},
		{"zero weight", func(c *Config) { c.Weights = map[string]float64{"a": 0} }},
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			tt.change(&c)
			if c.Validate() == nil {
				t.Error("accepted")
			}
		})
	}
}

// The higher class always goes first; inside a class, arrival order for
// one tenant.
func TestPopStrictPriority(t *testing.T) {
	q := mustQueue(t, testConfig())
	b1 := push(t, q, Request{Class: 0, Tokens: 10}, t0)
	b2 := push(t, q, Request{Class: 0, Tokens: 10}, t0)
	i1 := push(t, q, Request{Class: 1, Tokens: 10}, t0.Add(time.Second))
	for i, want := range []*Entry{i1, b1, b2, nil} {
		if got := q.Pop(t0.Add(2 * time.Second)); got != want {
			t.Fatalf("pop %d: got %+v, want %+v", i, got, want)
		}
	}
	if q.Len() != 0 || q.Tokens() != 0 {
		t.Fatalf("left %d requests, %d tokens", q.Len(), q.Tokens())
	}
}

// Fairness is in tokens: a tenant that queued many long prompts first
// does not hold back another tenant's short ones, and weights scale the
// shares.
func TestPopFairInTokens(t *testing.T) {
	tests := []struct {
		name    string
		weights map[string]float64
		// wantShort is how many of the noisy tenant's requests are let
		// through before the quiet tenant's 10 short ones are all out.
		wantNoisyBefore int
	}{
		{"equal weights", nil, 1},
		{"noisy weighs 10: they alternate", map[string]float64{"noisy": 10}, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Weights = tt.weights
			q := mustQueue(t, cfg)
			for range 20 {
				push(t, q, Request{Class: 0, Tenant: "noisy", Tokens: 10_000}, t0)
			}
			for range 10 {
				push(t, q, Request{Class: 0, Tenant: "quiet", Tokens: 1_000}, t0)
			}
			noisy, quiet := 0, 0
			for quiet < 10 {
				e := q.Pop(t0)
				if e.Request.Tenant == "noisy" {
					noisy++
				} else {
					quiet++
				}
			}
			if noisy != tt.wantNoisyBefore {
				t.Errorf("%d noisy requests went before the quiet tenant's 10, want %d", noisy, tt.wantNoisyBefore)
			}
		})
	}
}

// With weight 10 against 1 and equal request sizes, the heavy tenant gets
// about 10 of every 11 let through.
func TestPopWeightedShares(t *testing.T) {
	cfg := testConfig()
	cfg.Weights = map[string]float64{"heavy": 10}
	cfg.MaxRequests = 1000
	q := mustQueue(t, cfg)
	for range 100 {
		push(t, q, Request{Class: 0, Tenant: "heavy", Tokens: 100}, t0)
		push(t, q, Request{Class: 0, Tenant: "light", Tokens: 100}, t0)
	}
	heavy := 0
	for range 110 {
		if q.Pop(t0).Request.Tenant == "heavy" {
			heavy++
		}
	}
	if heavy < 98 || heavy > 102 {
		t.Errorf("heavy got %d of 110, want about 100", heavy)
	}
}

// A full queue sheds the lowest class's last request for a higher class,
// and refuses a request when nothing lower is queued.
func TestPushFull(t *testing.T) {
	tests := []struct {
		name      string
		maxReq    int
		maxTokens int64
		queued    []Request
		arriving  Request
		wantErr   error
		wantShed  int
	}{
		{"room", 3, 1000, []Request{{Class: 0, Tokens: 10}}, Request{Class: 0, Tokens: 10}, nil, 0},
		{"full, same class", 1, 1000, []Request{{Class: 0, Tokens: 10}}, Request{Class: 0, Tokens: 10}, ErrQueueFull, 0},
		{"full, higher sheds lower", 1, 1000, []Request{{Class: 0, Tokens: 10}}, Request{Class: 1, Tokens: 10}, nil, 1},
		{"full, lower refused", 1, 1000, []Request{{Class: 1, Tokens: 10}}, Request{Class: 0, Tokens: 10}, ErrQueueFull, 0},
		{"tokens, sheds two", 5, 100, []Request{{Class: 0, Tokens: 40}, {Class: 0, Tokens: 40}}, Request{Class: 1, Tokens: 90}, nil, 2},
		{"tokens, too large alone", 5, 100, nil, Request{Class: 1, Tokens: 101}, ErrQueueFull, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxRequests, cfg.MaxTokens = tt.maxReq, tt.maxTokens
			q := mustQueue(t, cfg)
			var queued []*Entry
			for _, r := range tt.queued {
				queued = append(queued, push(t, q, r, t0))
			}
			e, shed, err := q.Push(tt.arriving, t0)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if (e == nil) != (err != nil) {
				t.Fatalf("entry %v with err %v", e, err)
			}
			if len(shed) != tt.wantShed {
				t.Fatalf("shed %d, want %d", len(shed), tt.wantShed)
			}
			for _, s := range shed {
				if s.Queued() {
					t.Error("a shed entry is still queued")
				}
			}
			if len(shed) > 0 && shed[0] != queued[len(queued)-1] {
				t.Error("shed the first arrival, not the last in line")
			}
			if q.Len() > cfg.MaxRequests || q.Tokens() > cfg.MaxTokens {
				t.Errorf("queue holds %d requests, %d tokens", q.Len(), q.Tokens())
			}
		})
	}
}

// Deadlines follow each class's wait limit; Expire takes out exactly the
// requests past theirs.
func TestExpire(t *testing.T) {
	q := mustQueue(t, testConfig())
	b := push(t, q, Request{Class: 0, Tokens: 1}, t0)
	i := push(t, q, Request{Class: 1, Tokens: 1}, t0)
	if d, ok := q.NextDeadline(); !ok || !d.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("next deadline %v %v", d, ok)
	}
	if out := q.Expire(t0.Add(4*time.Second), nil); len(out) != 0 {
		t.Fatalf("expired %d early", len(out))
	}
	if out := q.Expire(t0.Add(5*time.Second), nil); len(out) != 1 || out[0] != i {
		t.Fatalf("expired %v, want the interactive one", out)
	}
	if out := q.Expire(t0.Add(time.Minute), nil); len(out) != 1 || out[0] != b {
		t.Fatalf("expired %v, want the batch one", out)
	}
	if _, ok := q.NextDeadline(); ok || q.Len() != 0 {
		t.Fatal("queue not empty")
	}
}

// Once the drain rate is known, a request that would wait past its limit
// is refused at once; while unknown, it is queued.
func TestPushForeseesWait(t *testing.T) {
	q := mustQueue(t, testConfig())
	// Drain 1000 tokens a second for 3 seconds.
	now := t0
	for range 40 {
		push(t, q, Request{Class: 0, Tokens: 100}, t0)
	}
	if _, _, err := q.Push(Request{Class: 1, Tokens: 100}, now); err != nil {
		t.Fatalf("refused while the rate is unknown: %v", err)
	}
	q.Pop(now) // the interactive one
	for range 30 {
		now = now.Add(100 * time.Millisecond)
		q.Pop(now)
	}
	rate := q.DrainRate()
	if rate < 900 || rate > 1100 {
		t.Fatalf("drain rate %.0f tokens/s, want about 1000", rate)
	}
	// 9 batch requests (900 tokens) are queued: a batch request waits
	// about 1 s (limit 30 s), an interactive one nothing.
	if _, _, err := q.Push(Request{Class: 0, Tokens: 100}, now); err != nil {
		t.Fatalf("batch refused: %v", err)
	}
	// Each 1,000-token batch request waits a second more: the 30th or so
	// cannot start within 30 s, and is refused at once.
	accepted := 0
	for {
		_, _, err := q.Push(Request{Class: 0, Tokens: 1000}, now)
		if err != nil {
			if !errors.Is(err, ErrWaitLimit) {
				t.Fatal(err)
			}
			break
		}
		accepted++
	}
	if accepted < 27 || accepted > 31 {
		t.Errorf("%d batch requests of a second each queued before a refusal, want about 29", accepted)
	}
	if _, _, err := q.Push(Request{Class: 1, Tokens: 100}, now); err != nil {
		t.Fatalf("interactive refused behind batch work: %v", err)
	}
	// After a long idle spell the rate is unknown again.
	for q.Pop(now) != nil {
	}
	later := now.Add(time.Minute)
	push(t, q, Request{Class: 0, Tokens: 1}, later)
	if r := q.DrainRate(); r != 0 {
		t.Errorf("rate %.0f after a minute idle, want unknown", r)
	}
}

// Remove is idempotent, and a tenant's credit does not outlive an idle
// class.
func TestRemove(t *testing.T) {
	q := mustQueue(t, testConfig())
	a := push(t, q, Request{Class: 0, Tenant: "a", Tokens: 1000}, t0)
	q.Remove(a)
	q.Remove(a)
	if q.Len() != 0 || q.Tokens() != 0 || a.Queued() {
		t.Fatalf("len %d tokens %d", q.Len(), q.Tokens())
	}
	// Tenant a's cancelled request leaves no debt once the class idled:
	// a and b alternate.
	for range 3 {
		push(t, q, Request{Class: 0, Tenant: "a", Tokens: 10}, t0)
		push(t, q, Request{Class: 0, Tenant: "b", Tokens: 10}, t0)
	}
	got := ""
	for e := q.Pop(t0); e != nil; e = q.Pop(t0) {
		got += e.Request.Tenant
	}
	if got != "ababab" {
		t.Errorf("order %q, want ababab", got)
	}
}
