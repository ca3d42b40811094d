package extproc

import (
	"math"
	"testing"
)

func TestMintRoomCarriesRank(t *testing.T) {
	for _, dp := range []int{1, 2, 3, 8, 16, 1000} {
		for p := range min(dp, 20) {
			seen := map[uint64]bool{}
			for range 50 {
				room := MintRoom(p, dp)
				if room > math.MaxInt64 {
					t.Fatalf("room %d exceeds 2^63-1", room)
				}
				if got := int(room % uint64(dp)); got != p {
					t.Fatalf("MintRoom(%d, %d) = %d, room %% dp = %d", p, dp, room, got)
				}
				seen[room] = true
			}
			if len(seen) < 45 {
				t.Fatalf("rooms repeat too often: %d distinct of 50", len(seen))
			}
		}
	}
}

func TestMintRoomClampsBadInput(t *testing.T) {
	if r := MintRoom(5, 0); r > math.MaxInt64 {
		t.Fatalf("room %d out of range", r)
	}
	if r := MintRoom(7, 4); r%4 != 0 {
		t.Fatalf("out-of-range rank must fall back to 0, got room %% 4 = %d", r%4)
	}
}
