package extproc

import "testing"

func TestBufferPool(t *testing.T) {
	p := BufferPool() // tiers 2^8 .. 2^22
	tests := []struct {
		n, wantCap int
	}{
		{0, 0}, {1, 256}, {256, 256}, {257, 512}, {33 << 10, 64 << 10}, {2 << 20, 2 << 20}, {4 << 20, 4 << 20}, {4<<20 + 1, 4<<20 + 1},
	}
	for _, tt := range tests {
		for range 2 { // fresh, then (for pooled sizes) reused
			b := p.Get(tt.n)
			if len(*b) != tt.n || cap(*b) != tt.wantCap {
				t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tt.n, len(*b), cap(*b), tt.n, tt.wantCap)
			}
			p.Put(b)
		}
	}
	// A buffer from elsewhere goes to the tier its capacity covers.
	odd := make([]byte, 10, 700)
	p.Put(&odd)
	if b := p.Get(300); cap(*b) < 300 || len(*b) != 300 {
		t.Errorf("Get(300) after putting a 700-byte buffer: len %d cap %d", len(*b), cap(*b))
	}
}
