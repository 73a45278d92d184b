package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is the unit of CPU times in /proc/<pid>/stat (USER_HZ), 100 on
// every Linux platform Go runs on.
const clockTicks = 100

// cpuClock returns a function that reads the CPU time used so far by this
// process, and by the servers whose postmasters are postmasters: each
// postmaster, its children (backends, WAL writer, checkpointer,
// autovacuum) and the children it has reaped. It needs Linux's /proc.
func cpuClock(postmasters ...int) (func() (client, server time.Duration, err error), error) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return nil, errors.New("no /proc: CPU time is not measured")
	}
	return func() (time.Duration, time.Duration, error) {
		var self syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
			return 0, 0, err
		}
		return time.Duration(self.Utime.Nano() + self.Stime.Nano()), serverCPU(postmasters...), nil
	}, nil
}

// serverCPU returns the CPU time used so far by the servers whose
// postmasters are postmasters, as cpuClock counts it, from Linux's /proc.
func serverCPU(postmasters ...int) time.Duration {
	var total time.Duration
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the process ended meanwhile
		}
		// The fields after the command, which is in parentheses and may
		// hold spaces: state, ppid, ... utime (14), stime (15),
		// cutime (16), cstime (17), counted from 1 with pid.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 15 {
			continue
		}
		pid, _ := strconv.Atoi(strings.Fields(s)[0])
		ppid, _ := strconv.Atoi(f[1])
		var ticks int64
		switch {
		case slices.Contains(postmasters, pid):
			for _, k := range []int{11, 12, 13, 14} { // utime, stime, cutime, cstime
				n, _ := strconv.ParseInt(f[k], 10, 64)
				ticks += n
			}
		case slices.Contains(postmasters, ppid):
			for _, k := range []int{11, 12} {
				n, _ := strconv.ParseInt(f[k], 10, 64)
				ticks += n
			}
		}
		total += time.Duration(ticks) * time.Second / clockTicks
	}
	return total
}
