package admit

import (
	"context"
	"testing"
)

// BenchmarkAdmitOpen is what admission costs a request while the pool has
// room (the gate here is free; the scheduler's is BenchmarkSaturated).
func BenchmarkAdmitOpen(b *testing.B) {
	a, err := NewAdmitter(testConfig(), func(float64) bool { return true }, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		t, err := a.Admit(ctx, Request{Class: 1, Tenant: "t", Tokens: 1000}, nil)
		if err != nil {
			b.Fatal(err)
		}
		t.Done()
	}
}
