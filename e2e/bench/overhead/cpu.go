package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cpuTimes are one CPU's cumulative busy and total ticks from /proc/stat.
type cpuTimes struct{ busy, total uint64 }

// parseProcStat returns the per-CPU lines of /proc/stat ("cpu0", "cpu1",
// ...; "cpu" is the sum) as busy and total ticks: idle and iowait are
// idle, user to steal count (guest time is already in user).
func parseProcStat(text string) map[string]cpuTimes {
	out := map[string]cpuTimes{}
	for line := range strings.SplitSeq(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		var t cpuTimes
		var idle uint64
		ok := true
		for i, s := range f[1:9] { // user nice system idle iowait irq softirq steal
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				ok = false
				break
			}
			t.total += v
			if i == 3 || i == 4 {
				idle += v
			}
		}
		if ok {
			t.busy = t.total - idle
			out[f[0]] = t
		}
	}
	return out
}

// busyShare is the fraction of ticks cpu was busy between two snapshots,
// or -1 if either lacks it or no tick passed.
func busyShare(before, after map[string]cpuTimes, cpu string) float64 {
	a, okA := before[cpu]
	b, okB := after[cpu]
	if !okA || !okB || b.total <= a.total {
		return -1
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total)
}

// cpuName is /proc/stat's name of a taskset CPU list that is one CPU
// ("1" → "cpu1"), or "" for a list of several.
func cpuName(list string) string {
	if _, err := strconv.Atoi(list); err != nil {
		return ""
	}
	return "cpu" + list
}

// readProcStat snapshots /proc/stat (nil where it cannot be read).
func readProcStat() map[string]cpuTimes {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	return parseProcStat(string(data))
}

// percent formats a busy share, e.g. "87 %", or "—" when unknown.
func percent(v float64) string {
	if v < 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f %%", 100*v)
}
