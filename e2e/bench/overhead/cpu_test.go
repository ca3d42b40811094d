package main

import "testing"

func TestBusyShare(t *testing.T) {
	before := parseProcStat("cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 5 0 5 40 0 0 0 0 0 0\ncpu1 5 0 5 40 0 0 0 0 0 0\nintr 1 2 3\n")
	after := parseProcStat("cpu0 5 0 5 140 0 0 0 0 0 0\ncpu1 65 0 25 50 10 0 0 0 0 0\n")
	if got := busyShare(before, after, "cpu1"); got < 0.799 || got > 0.801 {
		t.Errorf("cpu1 busy %v, want 0.8", got)
	}
	if got := busyShare(before, after, "cpu0"); got != 0 {
		t.Errorf("cpu0 busy %v, want 0", got)
	}
	if got := busyShare(before, after, "cpu7"); got != -1 {
		t.Errorf("unknown cpu: %v", got)
	}
	if cpuName("1") != "cpu1" || cpuName("0-1") != "" {
		t.Error("cpuName")
	}
	if percent(0.874) != "87 %" || percent(-1) != "—" {
		t.Error("percent")
	}
}
