package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat (USER_HZ, 100 on
// every Linux architecture Go runs on).
const userHZ = 100

// The roles a variant's processes play, for CPU per request.
const (
	roleProxy     = "proxy"     // Envoy, or SMG
	roleProcessor = "processor" // duet, or the floor processor
	roleEngines   = "engines"   // the fake engines
)

// roles lists the roles in the order the report shows them.
var roles = []string{roleProxy, roleProcessor, roleEngines}

// procStat is a process's parent and CPU time (user + system, all its
// threads, ticks) from /proc/<pid>/stat.
type procStat struct {
	ppid  int
	ticks uint64
}

// parseProcPidStat parses /proc/<pid>/stat. The command name, in
// parentheses, may hold spaces and parentheses: the fields are counted from
// the last ')'.
func parseProcPidStat(text string) (procStat, error) {
	i := strings.LastIndexByte(text, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("no command name in %q", text)
	}
	f := strings.Fields(text[i+1:])
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("ppid: %w", err)
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("stime: %w", err)
	}
	return procStat{ppid: ppid, ticks: utime + stime}, nil
}

// readProcs reads every process's stat from /proc (processes that end
// while it reads are left out).
func readProcs() map[int]procStat {
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	out := make(map[int]procStat, len(paths))
	for _, path := range paths {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err != nil {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if st, err := parseProcPidStat(string(data)); err == nil {
			out[pid] = st
		}
	}
	return out
}

// childrenOf maps each process in procs to its children.
func childrenOf(procs map[int]procStat) map[int][]int {
	children := map[int][]int{}
	for pid, st := range procs {
		children[st.ppid] = append(children[st.ppid], pid)
	}
	return children
}

// treeCPU sums the CPU time of roots and all their descendants in procs,
// whose children childrenOf lists (SMG's launcher starts its router as a
// child).
func treeCPU(procs map[int]procStat, children map[int][]int, roots []int) time.Duration {
	var ticks uint64
	seen := map[int]bool{}
	queue := append([]int(nil), roots...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		if st, ok := procs[pid]; ok {
			ticks += st.ticks
		}
		queue = append(queue, children[pid]...)
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// roleCPU snapshots the CPU time each role's processes (pids by role) have
// used so far.
func roleCPU(pids map[string][]int) map[string]time.Duration {
	if len(pids) == 0 {
		return nil
	}
	procs := readProcs()
	children := childrenOf(procs)
	out := make(map[string]time.Duration, len(pids))
	for role, roots := range pids {
		out[role] = treeCPU(procs, children, roots)
	}
	return out
}

// cpuPerRequest is each role's CPU time between two snapshots divided by
// the requests sent meanwhile, in µs (nil when unknown).
func cpuPerRequest(before, after map[string]time.Duration, requests int) map[string]float64 {
	if len(before) == 0 || requests == 0 {
		return nil
	}
	out := make(map[string]float64, len(before))
	for role, b := range before {
		if a, ok := after[role]; ok {
			out[role] = float64((a - b).Microseconds()) / float64(requests)
		}
	}
	return out
}
