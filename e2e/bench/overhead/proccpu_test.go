package main

import (
	"os"
	"testing"
	"time"
)

func TestParseProcPidStat(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    procStat
		wantErr bool
	}{
		{name: "plain", text: "42 (envoy) S 7 42 42 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 9 0 100 1000 200 18446744073709551615\n",
			want: procStat{ppid: 7, ticks: 175}},
		{name: "name with spaces and parentheses", text: "43 (a (b) c) R 1 43 43 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1\n",
			want: procStat{ppid: 1, ticks: 7}},
		{name: "no name", text: "44 S 1", wantErr: true},
		{name: "too short", text: "45 (x) S 1 2 3", wantErr: true},
		{name: "bad utime", text: "46 (x) S 1 46 46 0 -1 0 0 0 0 0 u 4 0 0", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcPidStat(tc.text)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err == nil && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestTreeCPU(t *testing.T) {
	procs := map[int]procStat{
		1:  {ppid: 0, ticks: 1000},
		10: {ppid: 1, ticks: 50}, // a root
		11: {ppid: 10, ticks: 30},
		12: {ppid: 11, ticks: 20}, // grandchild
		20: {ppid: 1, ticks: 7},   // another root
		30: {ppid: 1, ticks: 500}, // not asked for
	}
	children := childrenOf(procs)
	if got, want := treeCPU(procs, children, []int{10, 20}), 1070*time.Millisecond; got != want {
		t.Errorf("treeCPU = %v, want %v", got, want)
	}
	if got := treeCPU(procs, children, []int{99}); got != 0 {
		t.Errorf("treeCPU of a gone process = %v, want 0", got)
	}
}

func TestCPUPerRequest(t *testing.T) {
	before := map[string]time.Duration{roleProxy: time.Second, roleEngines: 0}
	after := map[string]time.Duration{roleProxy: 1500 * time.Millisecond, roleEngines: 100 * time.Millisecond}
	got := cpuPerRequest(before, after, 1000)
	if got[roleProxy] != 500 || got[roleEngines] != 100 || len(got) != 2 {
		t.Errorf("cpuPerRequest = %v, want proxy 500 µs, engines 100 µs", got)
	}
	if cpuPerRequest(nil, after, 10) != nil || cpuPerRequest(before, after, 0) != nil {
		t.Error("cpuPerRequest without a snapshot or requests should be unknown (nil)")
	}
}

// This process's own entry in /proc is read and counts its own CPU.
func TestRoleCPUReadsThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	deadline := time.Now().Add(50 * time.Millisecond)
	for n := 0; time.Now().Before(deadline); n++ {
		_ = n * n
	}
	got := roleCPU(map[string][]int{roleProxy: {os.Getpid()}})
	if got[roleProxy] < 10*time.Millisecond {
		t.Errorf("this process's CPU %v after 50 ms of work, want at least 10 ms", got[roleProxy])
	}
}
