package sim

import "testing"

func TestRecordStoreBounded(t *testing.T) {
	tests := []struct {
		max, adds int
		wantFirst int // Status of the oldest record kept
		wantLen   int
	}{
		{max: 5, adds: 3, wantFirst: 0, wantLen: 3},
		{max: 5, adds: 5, wantFirst: 0, wantLen: 5},
		{max: 5, adds: 6, wantFirst: 1, wantLen: 5},
		{max: 20, adds: 25, wantFirst: 6, wantLen: 19},
	}
	for _, tc := range tests {
		s := newRecordStore(tc.max)
		for i := 0; i < tc.adds; i++ {
			s.add(Record{Status: i})
		}
		got := s.list()
		if len(got) != tc.wantLen || got[0].Status != tc.wantFirst || got[len(got)-1].Status != tc.adds-1 {
			t.Errorf("max %d adds %d: len %d first %d last %d", tc.max, tc.adds, len(got), got[0].Status, got[len(got)-1].Status)
		}
	}
}
