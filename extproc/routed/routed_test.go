package routed

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/duet-router/duet/extproc/accesslog"
)

const (
	decodeHost   = "10.0.0.1:30000"
	fallbackHost = "10.0.0.2:30000"
	prefillHost  = "10.0.1.1:30000"
	otherHost    = "10.0.9.9:30000"
)

var pdRoute = Route{Decode: decodeHost, DecodeFallback: fallbackHost, DecodeRank: 1, Prefill: prefillHost, PrefillRank: 3}

func decodeLeg(upstream string, rank int) accesslog.Completion {
	return accesslog.Completion{RequestID: "r1", Leg: accesslog.LegDecode, Upstream: upstream, DPRank: rank}
}

func prefillLeg(upstream string, rank int) accesslog.Completion {
	return accesslog.Completion{RequestID: "r1", Leg: accesslog.LegPrefill, Upstream: upstream, DPRank: rank}
}

func unreachable(c accesslog.Completion) accesslog.Completion {
	c.Failed, c.Unreachable = true, true
	return c
}

func failed(c accesslog.Completion) accesslog.Completion {
	c.Failed = true
	return c
}

var requestEntry = accesslog.Completion{RequestID: "r1", Leg: accesslog.LegRequest, Upstream: decodeHost}

// TestAdmit: each sequence of entries about request r1, routed along a
// route, is admitted or refused entry by entry.
func TestAdmit(t *testing.T) {
	type step struct {
		c      accesslog.Completion
		reason string // "" admitted
	}
	aggregated := Route{Decode: decodeHost, DecodeRank: NoRank, PrefillRank: NoRank}
	tests := []struct {
		name   string
		route  *Route // nil: r1 never routed
		steps  []step
		forget bool // r1 is forgotten once every expected entry arrived
	}{
		{"PD request, every entry once", &pdRoute, []step{
			{decodeLeg(decodeHost, 1), ""}, {prefillLeg(prefillHost, 3), ""}, {requestEntry, ""},
		}, true},
		{"entries in any order", &pdRoute, []step{
			{requestEntry, ""}, {prefillLeg(prefillHost, 3), ""}, {decodeLeg(decodeHost, 1), ""},
		}, true},
		{"request duet never routed", nil, []step{
			{failed(decodeLeg(decodeHost, 1)), ReasonUnknown}, {requestEntry, ReasonUnknown},
		}, false},
		{"upstream entry without duet's id", &pdRoute, []step{
			{accesslog.Completion{Leg: accesslog.LegDecode, Upstream: decodeHost, DPRank: 1}, ReasonNoRequestID},
		}, false},
		{"decode leg on a host duet did not choose", &pdRoute, []step{
			{unreachable(decodeLeg(otherHost, 1)), ReasonWrongUpstream}, {decodeLeg(decodeHost, 1), ""},
		}, false},
		{"decode leg on the fallback first", &pdRoute, []step{
			{failed(decodeLeg(fallbackHost, 1)), ReasonWrongUpstream},
		}, false},
		{"decode leg with another rank", &pdRoute, []step{
			{failed(decodeLeg(decodeHost, 0)), ReasonWrongRank},
		}, false},
		{"prefill leg on another host or rank", &pdRoute, []step{
			{failed(prefillLeg(otherHost, 3)), ReasonWrongUpstream}, {failed(prefillLeg(prefillHost, 0)), ReasonWrongRank},
			{prefillLeg(prefillHost, 3), ""},
		}, false},
		{"prefill leg of an aggregated request", &aggregated, []step{
			{failed(prefillLeg(prefillHost, NoRank)), ReasonNoSuchLeg}, {decodeLeg(decodeHost, NoRank), ""}, {requestEntry, ""},
		}, true},
		{"each leg counts once", &pdRoute, []step{
			{decodeLeg(decodeHost, 1), ""}, {failed(decodeLeg(decodeHost, 1)), ReasonRepeated},
			{prefillLeg(prefillHost, 3), ""}, {failed(prefillLeg(prefillHost, 3)), ReasonRepeated},
		}, false},
		{"Envoy's retry on the listed fallback (claim 24)", &pdRoute, []step{
			{unreachable(decodeLeg(decodeHost, 1)), ""}, {decodeLeg(fallbackHost, 1), ""},
			{prefillLeg(prefillHost, 3), ""}, {requestEntry, ""},
		}, true},
		{"a retry on a host duet did not list", &pdRoute, []step{
			{unreachable(decodeLeg(decodeHost, 1)), ""}, {decodeLeg(otherHost, 1), ReasonWrongUpstream},
		}, false},
		{"a second decode entry after one that connected", &pdRoute, []step{
			{failed(decodeLeg(decodeHost, 1)), ""}, {decodeLeg(fallbackHost, 1), ReasonRepeated},
		}, false},
		{"no retry without a fallback", &Route{Decode: decodeHost, DecodeRank: NoRank, PrefillRank: NoRank}, []step{
			{unreachable(decodeLeg(decodeHost, NoRank)), ""}, {decodeLeg("", NoRank), ReasonWrongUpstream},
		}, false},
		{"a leg that reached no host", &pdRoute, []step{
			{failed(prefillLeg("", 3)), ""},
		}, false},
		{"the request entry twice", &pdRoute, []step{
			{requestEntry, ""}, {requestEntry, ReasonRepeated},
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(Options{})
			if tt.route != nil {
				b.Record("r1", *tt.route)
			}
			for i, s := range tt.steps {
				ok, reason := b.Admit(ptr(s.c))
				if ok != (s.reason == "") || reason != s.reason {
					t.Errorf("step %d (%s on %q rank %d): admitted %v reason %q, want reason %q",
						i, s.c.Leg, s.c.Upstream, s.c.DPRank, ok, reason, s.reason)
				}
			}
			if got, want := b.Len() == 0, tt.forget || tt.route == nil; got != want {
				t.Errorf("forgotten = %v, want %v", got, want)
			}
		})
	}
}

// sinkFunc adapts a function to accesslog.Sink.
type sinkFunc func(accesslog.Completion)

func (f sinkFunc) Complete(_ context.Context, c accesslog.Completion) { f(c) }

// TestGate: the gate passes believed entries on, counts the others by
// reason, and drops the entries of requests duet never routed silently.
func TestGate(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := New(Options{Registerer: reg})
	b.Record("r1", pdRoute)
	var passed []accesslog.Completion
	g := b.Gate(sinkFunc(func(c accesslog.Completion) { passed = append(passed, c) }))
	ctx := context.Background()
	g.Complete(ctx, failed(decodeLeg(otherHost, 1)))                                       // forged
	g.Complete(ctx, accesslog.Completion{RequestID: "forged-0", Leg: accesslog.LegDecode}) // forged
	g.Complete(ctx, accesslog.Completion{Leg: accesslog.LegRequest, Status: 400})          // duet's own 400
	g.Complete(ctx, decodeLeg(decodeHost, 1))
	if len(passed) != 1 || passed[0].Upstream != decodeHost {
		t.Fatalf("passed %+v, want the one true decode entry", passed)
	}
	for _, c := range []struct {
		reason string
		want   float64
	}{{ReasonWrongUpstream, 1}, {ReasonUnknown, 1}, {ReasonNoRequestID, 0}} {
		if got := testutil.ToFloat64(b.untrusted.WithLabelValues("decode", c.reason)); got != c.want {
			t.Errorf("untrusted{decode,%s} = %v, want %v", c.reason, got, c.want)
		}
	}
	if got := testutil.ToFloat64(b.untrusted.WithLabelValues("request", ReasonNoRequestID)); got != 0 {
		t.Errorf("a request duet answered itself was counted as untrusted")
	}
}

// TestSweep: a request whose feedback never all arrives is forgotten after
// the TTL, and its late entries are not believed.
func TestSweep(t *testing.T) {
	b := New(Options{TTL: time.Minute})
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }
	b.Record("r1", pdRoute)
	now = now.Add(30 * time.Second)
	b.Record("r2", pdRoute)
	now = now.Add(45 * time.Second)
	if n := b.Sweep(); n != 1 || b.Len() != 1 {
		t.Fatalf("swept %d, %d left; want 1 and 1", n, b.Len())
	}
	if ok, reason := b.Admit(ptr(decodeLeg(decodeHost, 1))); ok || reason != ReasonUnknown {
		t.Errorf("a forgotten request's entry: admitted %v (%s)", ok, reason)
	}
}

// BenchmarkRecordAdmit is the Book's cost per routed PD request: a record
// and its three entries.
func BenchmarkRecordAdmit(b *testing.B) {
	book := New(Options{})
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = "req-" + time.Duration(i).String()
	}
	entries := []accesslog.Completion{decodeLeg(decodeHost, 1), prefillLeg(prefillHost, 3), requestEntry}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := ids[i%len(ids)]
		book.Record(id, pdRoute)
		for _, c := range entries {
			c.RequestID = id
			book.Admit(ptr(c))
		}
	}
}

// Among replicas an entry can come before its request's route: with
// Orphans, Adopt admits the entries that waited for the route, once each,
// and entries that wait too long are forgotten.
func TestAdopt(t *testing.T) {
	b := New(Options{Orphans: 2, OrphanTTL: time.Minute})
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }
	for _, c := range []accesslog.Completion{decodeLeg(decodeHost, 1), prefillLeg(otherHost, 3), requestEntry} {
		if ok, reason := b.Admit(ptr(c)); ok || reason != ReasonUnknown {
			t.Fatalf("%s before its route: admitted %v (%s)", c.Leg, ok, reason)
		}
	}
	got := b.Adopt("r1", pdRoute)
	if len(got) != 1 || got[0].Leg != accesslog.LegDecode {
		t.Errorf("adopted %+v; want the decode leg only (the prefill leg names another host; the third entry was past the bound)", got)
	}
	if again := b.Adopt("r1", pdRoute); len(again) != 0 {
		t.Errorf("adopted %d entries twice", len(again))
	}
	if ok, _ := b.Admit(ptr(decodeLeg(decodeHost, 1))); ok {
		t.Error("the adopted leg was admitted again")
	}
	// An orphan whose route never comes is forgotten after OrphanTTL.
	b.Admit(ptr(accesslog.Completion{RequestID: "r2", Leg: accesslog.LegDecode, Upstream: decodeHost, DPRank: 1}))
	now = now.Add(2 * time.Minute)
	b.Sweep()
	if got := b.Adopt("r2", pdRoute); len(got) != 0 {
		t.Errorf("an expired orphan was adopted: %+v", got)
	}
	// Without Orphans nothing waits.
	plain := New(Options{})
	plain.Admit(ptr(decodeLeg(decodeHost, 1)))
	if got := plain.Adopt("r1", pdRoute); len(got) != 0 {
		t.Errorf("a Book without Orphans kept %d entries", len(got))
	}
}

// With Orphans, the gate counts an entry about an unknown request only if
// its route never comes: adopted entries are believed and never counted.
func TestGateCountsOrphansOnExpiry(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := New(Options{Registerer: reg, Orphans: 10, OrphanTTL: time.Minute})
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }
	var passed int
	g := b.Gate(sinkFunc(func(accesslog.Completion) { passed++ }))
	unknown := func() float64 { return testutil.ToFloat64(b.untrusted.WithLabelValues("decode", ReasonUnknown)) }
	g.Complete(context.Background(), decodeLeg(decodeHost, 1)) // r1: its route comes later
	g.Complete(context.Background(), accesslog.Completion{RequestID: "never", Leg: accesslog.LegDecode, Upstream: decodeHost})
	if n := unknown(); n != 0 {
		t.Fatalf("counted %v entries at once; they wait for their routes", n)
	}
	if got := b.Adopt("r1", pdRoute); len(got) != 1 {
		t.Fatalf("adopted %d", len(got))
	}
	now = now.Add(2 * time.Minute)
	b.Sweep()
	if n := unknown(); n != 1 {
		t.Errorf("after expiry: %v counted, want 1 (the entry whose route never came)", n)
	}
	if testutil.ToFloat64(b.adopted) != 1 {
		t.Errorf("adopted counter %v, want 1", testutil.ToFloat64(b.adopted))
	}
}

// ptr returns a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }
