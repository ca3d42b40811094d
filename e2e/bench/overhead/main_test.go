package main

import "testing"

func TestParseCases(t *testing.T) {
	cases, err := parseCases("1, 32", "200,500", 20)
	if err != nil {
		t.Fatal(err)
	}
	want := []loadCase{
		{bodyBytes: 1 << 10, rate: 200}, {bodyBytes: 1 << 10, rate: 500}, {bodyBytes: 1 << 10, workers: 20},
		{bodyBytes: 32 << 10, rate: 200}, {bodyBytes: 32 << 10, rate: 500}, {bodyBytes: 32 << 10, workers: 20},
	}
	if len(cases) != len(want) {
		t.Fatalf("got %v", cases)
	}
	for i := range want {
		if cases[i] != want[i] {
			t.Errorf("case %d: got %v, want %v", i, cases[i], want[i])
		}
	}
	if _, err := parseCases("1,x", "200", 0); err == nil {
		t.Error("bad size accepted")
	}
	if _, err := parseCases("1", "", 0); err == nil {
		t.Error("no case accepted")
	}
}
