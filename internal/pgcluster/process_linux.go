package pgcluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// startProcess starts cmd so that the kernel kills it with SIGKILL when this
// process exits, however it exits.
//
// The parent-death signal fires when the thread that forked the child exits,
// not the process, and the Go runtime may end a thread long before the
// process exits. So the child is forked from a goroutine locked to its own
// thread, which then stays blocked in wait(2) until the child is reaped, and
// only then lets the thread go.
func startProcess(cmd *exec.Cmd) (*process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL

	p := &process{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends a thread whose goroutine exits
		// while locked, which no longer matters once the child is reaped.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// processAlive reports whether pid names a process that has not exited. A
// zombie counts as exited: an orphan's zombie lingers until init reaps it,
// and some container inits never do.
func processAlive(pid int) bool {
	if pid <= 0 {
		// kill(2) reads these as process groups, not processes.
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}
