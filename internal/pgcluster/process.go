package pgcluster

import "os/exec"

// process is a child started by startProcess.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the child has been reaped
	err  error         // the result of cmd.Wait, set before done is closed
}
