package admit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// gate is a Gate a test opens and closes.
type gate struct{ open atomic.Bool }

func (g *gate) fn() Gate { return func(float64) bool { return g.open.Load() } }

func newAdmitter(t *testing.T, g *gate, cfg Config) *Admitter {
	t.Helper()
	a, err := NewAdmitter(cfg, g.fn(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// admitAsync runs Admit in a goroutine and returns where its outcome goes.
func admitAsync(ctx context.Context, a *Admitter, r Request) <-chan admitted {
	out := make(chan admitted, 1)
	go func() {
		tk, err := a.Admit(ctx, r, nil)
		out <- admitted{tk, err}
	}()
	return out
}

type admitted struct {
	t   *Ticket
	err error
}

func waitQueued(t *testing.T, a *Admitter, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for a.Snapshot().Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued %d, want %d", a.Snapshot().Queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAdmitAtOnceWhileOpen(t *testing.T) {
	g := &gate{}
	g.open.Store(true)
	a := newAdmitter(t, g, testConfig())
	tk, err := a.Admit(context.Background(), Request{Class: 0, Tokens: 10}, func(time.Duration) { t.Error("queued while open") })
	if err != nil || tk.Queued {
		t.Fatalf("ticket %+v, %v", tk, err)
	}
	tk.Done()
}

// Closed gate: requests queue; as it opens they go one at a time, the
// next only once the previous ticket is Done, higher class first.
func TestAdmitQueuesUntilOpen(t *testing.T) {
	g := &gate{}
	a := newAdmitter(t, g, testConfig())
	var limit time.Duration
	batch := make(chan admitted, 1)
	go func() {
		tk, err := a.Admit(context.Background(), Request{Class: 0, Tokens: 10}, func(d time.Duration) { limit = d })
		batch <- admitted{tk, err}
	}()
	waitQueued(t, a, 1)
	inter := admitAsync(context.Background(), a, Request{Class: 1, Tokens: 10})
	waitQueued(t, a, 2)
	g.open.Store(true)
	a.Kick()
	first := <-inter
	if first.err != nil || !first.t.Queued {
		t.Fatalf("interactive: %+v %v", first.t, first.err)
	}
	select {
	case b := <-batch:
		t.Fatalf("batch let through before the first ticket was done: %+v", b)
	case <-time.After(50 * time.Millisecond):
	}
	first.t.Done()
	b := <-batch
	if b.err != nil {
		t.Fatal(b.err)
	}
	b.t.Done()
	if limit != 30*time.Second {
		t.Errorf("onQueued told %v, want the class's 30s", limit)
	}
}

func TestAdmitClientLeaves(t *testing.T) {
	g := &gate{}
	a := newAdmitter(t, g, testConfig())
	ctx, cancel := context.WithCancel(context.Background())
	out := admitAsync(ctx, a, Request{Class: 0, Tokens: 10})
	waitQueued(t, a, 1)
	cancel()
	if r := <-out; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", r.err)
	}
	if n := a.Snapshot().Queued; n != 0 {
		t.Fatalf("%d still queued", n)
	}
}

func TestAdmitRefusals(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, a *Admitter) error
		want error
	}{
		{"wait limit", func(t *testing.T, a *Admitter) error {
			start := time.Now()
			_, err := a.Admit(context.Background(), Request{Class: 2, Tokens: 1}, nil)
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("refused after %v, limit 100ms", took)
			}
			return err
		}, ErrWaitLimit},
		{"full", func(t *testing.T, a *Admitter) error {
			admitAsync(context.Background(), a, Request{Class: 1, Tokens: 1})
			admitAsync(context.Background(), a, Request{Class: 1, Tokens: 1})
			waitQueued(t, a, 2)
			_, err := a.Admit(context.Background(), Request{Class: 0, Tokens: 1}, nil)
			return err
		}, ErrQueueFull},
		{"shed", func(t *testing.T, a *Admitter) error {
			low := admitAsync(context.Background(), a, Request{Class: 0, Tokens: 1})
			waitQueued(t, a, 1)
			admitAsync(context.Background(), a, Request{Class: 0, Tokens: 1})
			waitQueued(t, a, 2)
			admitAsync(context.Background(), a, Request{Class: 1, Tokens: 1})
			// The second batch request (last in line) is shed, not the first.
			select {
			case r := <-low:
				t.Fatalf("the first batch request ended: %v", r.err)
			case <-time.After(20 * time.Millisecond):
			}
			waitQueued(t, a, 2)
			a.Close()
			return (<-low).err
		}, ErrClosed},
		{"closed", func(t *testing.T, a *Admitter) error {
			a.Close()
			_, err := a.Admit(context.Background(), Request{Class: 0, Tokens: 1}, nil)
			return err
		}, ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxRequests = 2
			cfg.Classes = append(cfg.Classes, Class{Name: "short", Priority: 5, WaitLimit: 100 * time.Millisecond})
			a := newAdmitter(t, &gate{}, cfg)
			err := tt.run(t, a)
			var ref *Refusal
			if !errors.As(err, &ref) || !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want a refusal for %v", err, tt.want)
			}
			if ref.RetryAfter < time.Second {
				t.Errorf("retry after %v", ref.RetryAfter)
			}
		})
	}
}

// Among replicas, a request does not pass a peer's queued request of its
// priority or higher, and a queued one waits for a peer's more important
// one; each change of the queue's head is published.
func TestAdmitShareWith(t *testing.T) {
	g := &gate{}
	g.open.Store(true)
	a := newAdmitter(t, g, testConfig())
	var peer atomic.Int64 // the peers' top priority queued, -1: none
	peer.Store(10)
	heads := make(chan Head, 16)
	a.ShareWith(func() (int, bool) { p := peer.Load(); return int(p), p >= 0 }, func(h Head) { heads <- h })
	out := admitAsync(context.Background(), a, Request{Class: 0, Tokens: 1})
	if h := <-heads; h != (Head{Priority: 0, Queued: true}) {
		t.Fatalf("published %+v, want the batch class queued", h)
	}
	select {
	case r := <-out:
		t.Fatalf("let through while a peer holds an interactive request: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	peer.Store(-1)
	a.Kick()
	r := <-out
	if r.err != nil || !r.t.Queued {
		t.Fatalf("%+v %v", r.t, r.err)
	}
	r.t.Done()
	if h := <-heads; h.Queued {
		t.Fatalf("published %+v, want empty", h)
	}
	// A peer's equal priority queued: queue behind it, then go.
	peer.Store(0)
	out = admitAsync(context.Background(), a, Request{Class: 0, Tokens: 1})
	if r := <-out; r.err != nil || !r.t.Queued {
		t.Fatalf("%+v %v", r.t, r.err)
	}
}

// A class whose share of the thresholds is reached waits while a class
// with room above it goes through.
func TestAdmitShares(t *testing.T) {
	var full atomic.Bool // the engines are past half their thresholds
	full.Store(true)
	cfg := testConfig()
	cfg.Classes[0].Share = 0.5 // batch
	a, err := NewAdmitter(cfg, func(share float64) bool { return !full.Load() || share == 1 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	batch := admitAsync(context.Background(), a, Request{Class: 0, Tokens: 1})
	waitQueued(t, a, 1)
	r := <-admitAsync(context.Background(), a, Request{Class: 1, Tokens: 1})
	if r.err != nil {
		t.Fatalf("interactive: %v", r.err)
	}
	r.t.Done()
	select {
	case b := <-batch:
		t.Fatalf("batch let through past its share: %+v", b)
	case <-time.After(30 * time.Millisecond):
	}
	full.Store(false)
	a.Kick()
	if b := <-batch; b.err != nil {
		t.Fatalf("batch: %v", b.err)
	}
}

// A caller that cannot hold a request as long as its class allows (Envoy's
// max_message_timeout is shorter) caps its wait with MaxWait: the Admitter
// tells it the capped limit and refuses the request by it.
func TestAdmitMaxWaitCapsTheClassLimit(t *testing.T) {
	tests := []struct {
		name    string
		maxWait time.Duration
		want    time.Duration
	}{
		{"no cap", 0, 30 * time.Second},
		{"cap above the class limit", time.Minute, 30 * time.Second},
		{"cap below the class limit", 80 * time.Millisecond, 80 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmitter(t, &gate{}, testConfig())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			told := make(chan time.Duration, 1)
			out := make(chan admitted, 1)
			go func() {
				tk, err := a.Admit(ctx, Request{Class: 0, Tokens: 10, MaxWait: tt.maxWait}, func(d time.Duration) { told <- d })
				out <- admitted{tk, err}
			}()
			if got := <-told; got != tt.want {
				t.Errorf("onQueued told %v, want %v", got, tt.want)
			}
			if tt.want > time.Second {
				cancel()
				<-out
				return
			}
			r := <-out
			var ref *Refusal
			if !errors.As(r.err, &ref) || !errors.Is(ref.Reason, ErrWaitLimit) {
				t.Fatalf("got %v, want a wait-limit refusal", r.err)
			}
			if ref.Waited < tt.want || ref.Waited > tt.want+time.Second {
				t.Errorf("refused after %v, want about %v", ref.Waited, tt.want)
			}
		})
	}
}

// A queued request whose context is cancelled with ErrProxyTimeout (Envoy,
// not the client, gave up) is refused for that reason, and counted apart
// from a client that left.
func TestAdmitProxyTimeout(t *testing.T) {
	a := newAdmitter(t, &gate{}, testConfig())
	ctx, cancel := context.WithCancelCause(context.Background())
	out := admitAsync(ctx, a, Request{Class: 0, Tokens: 10})
	waitQueued(t, a, 1)
	cancel(ErrProxyTimeout)
	r := <-out
	var ref *Refusal
	if !errors.As(r.err, &ref) || !errors.Is(ref.Reason, ErrProxyTimeout) {
		t.Fatalf("got %v, want a proxy-timeout refusal", r.err)
	}
	if got := Outcome(ref.Reason); got != "proxy_timeout" {
		t.Errorf("outcome %q, want proxy_timeout", got)
	}
	if n := a.Snapshot().Queued; n != 0 {
		t.Fatalf("%d still queued", n)
	}
}
