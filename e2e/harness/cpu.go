package harness

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// every Linux architecture Go builds for).
const clockTicks = 100

// CPUTime is the CPU time (user and system, every thread) the running
// process has used so far, from /proc/<pid>/stat (Linux), at 10 ms
// resolution.
func (p *Process) CPUTime() (time.Duration, error) {
	if p.Exited() {
		return 0, fmt.Errorf("cpu time of %s: exited", p.Name)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return 0, fmt.Errorf("cpu time of %s: %w", p.Name, err)
	}
	return parseStatCPU(string(data))
}

// parseStatCPU reads utime + stime (fields 14 and 15) of a /proc/<pid>/stat
// line. The command name (field 2) is in parentheses and may hold spaces:
// fields are counted after its closing one.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat %q: no command name", stat)
	}
	fields := strings.Fields(stat[i+1:])
	// fields[0] is field 3 (state): utime is field 14, stime field 15.
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc stat %q: %d fields after the name", stat, len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat: cpu field %q: %w", f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
