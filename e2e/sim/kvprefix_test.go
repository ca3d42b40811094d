package sim

import (
	"fmt"
	"testing"
	"time"
)

func TestPrefixBoard(t *testing.T) {
	tests := []struct {
		name string
		run  func(b *prefixBoard, got *[]string)
		want string
	}{
		{name: "item first", run: func(b *prefixBoard, got *[]string) {
			defer b.register(1, func(n int) { *got = append(*got, fmt.Sprint("1:", n)) })()
			*got = append(*got, b.deliver(1, 64))
		}, want: "[1:64 applied]"},
		{name: "prefix first, kept for the item", run: func(b *prefixBoard, got *[]string) {
			*got = append(*got, b.deliver(2, 32))
			defer b.register(2, func(n int) { *got = append(*got, fmt.Sprint("2:", n)) })()
		}, want: "[pending 2:32]"},
		{name: "after the item left", run: func(b *prefixBoard, got *[]string) {
			b.register(3, func(n int) { *got = append(*got, fmt.Sprint("3:", n)) })()
			*got = append(*got, b.deliver(3, 16))
		}, want: "[pending]"},
		{name: "another room", run: func(b *prefixBoard, got *[]string) {
			defer b.register(4, func(n int) { *got = append(*got, fmt.Sprint("4:", n)) })()
			*got = append(*got, b.deliver(5, 16))
		}, want: "[pending]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			tc.run(newPrefixBoard(), &got)
			if fmt.Sprint(got) != tc.want {
				t.Fatalf("got %v, want %s", got, tc.want)
			}
		})
	}
}

func TestPrefixBoardBounded(t *testing.T) {
	b := newPrefixBoard()
	now := time.Unix(0, 0)
	b.now = func() time.Time { return now }
	b.deliver(-1, 1) // will be stale
	now = now.Add(2 * pendingPrefixTTL)
	for i := 0; i < maxPendingPrefixes; i++ {
		now = now.Add(time.Millisecond)
		b.deliver(int64(i), i)
	}
	if n := b.pendingCount(); n != maxPendingPrefixes {
		t.Fatalf("%d pending, want the bound %d", n, maxPendingPrefixes)
	}
	if _, ok := b.pending[-1]; ok {
		t.Fatal("a stale prefix was kept")
	}
	if _, ok := b.pending[0]; !ok {
		t.Fatal("a fresh prefix was dropped while a stale one was there")
	}
	b.deliver(1<<40, 7)
	if _, ok := b.pending[0]; ok || b.pendingCount() != maxPendingPrefixes {
		t.Fatalf("over the bound the oldest prefix should go: %d pending", b.pendingCount())
	}
}

func TestKVPrefixEndpoint(t *testing.T) {
	engine := startTest(t, Config{Mode: ModePrefill, Profile: "dense-8b-h100"})
	simple := startTest(t, Config{Mode: ModePrefill})
	tests := []struct {
		name       string
		srv        *testServer
		body       string
		wantStatus int
		wantBody   string
	}{
		{name: "kept for its item", srv: engine, body: `{"room":7,"decode_prefix_len":128}`, wantStatus: 200,
			wantBody: `{"decode_prefix_len":128,"room":7,"status":"pending"}`},
		{name: "simple model ignores it", srv: simple, body: `{"room":7,"decode_prefix_len":128}`, wantStatus: 200,
			wantBody: `{"decode_prefix_len":128,"room":7,"status":"ignored"}`},
		{name: "missing room", srv: engine, body: `{"decode_prefix_len":1}`, wantStatus: 400},
		{name: "negative length", srv: engine, body: `{"room":1,"decode_prefix_len":-1}`, wantStatus: 400},
		{name: "not JSON", srv: engine, body: `room=1`, wantStatus: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, tc.srv.boot.URL+"/sim/kv_prefix", tc.body)
			if r.status != tc.wantStatus || (tc.wantBody != "" && string(r.body) != tc.wantBody+"\n" && string(r.body) != tc.wantBody) {
				t.Fatalf("got %d %s, want %d %s", r.status, r.body, tc.wantStatus, tc.wantBody)
			}
		})
	}
}
