//go:build !linux

package pgcluster

import (
	"errors"
	"os/exec"
	"syscall"
)

// startProcess refuses to start a server on systems without a parent-death
// signal, where it would outlive a process that is killed.
func startProcess(*exec.Cmd) (*process, error) {
	return nil, errors.New("pgcluster: local clusters need Linux, whose parent-death signal stops them with the process that started them")
}

// processAlive reports whether pid names a process that has not exited.
func processAlive(pid int) bool {
	return pid > 0 && !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
