package pgcluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// process is a child started by startProcess.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the child has been reaped
	err  error         // the result of cmd.Wait, set before done is closed
}

// waitReady polls until dsn accepts a connection, for at most readyTimeout,
// giving up at once when the child exits. Polling a real connection, rather
// than waiting for the socket file, also waits out "the database system is
// starting up". Errors name the program and end with its log, read from
// logPath.
func (p *process) waitReady(ctx context.Context, program, dsn, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	ticker := time.NewTicker(readyPoll)
	defer ticker.Stop()
	for {
		err := ping(ctx, dsn)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("pgcluster: %s exited during startup (%v); log:\n%s", program, p.err, logTail(logPath))
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: %s did not accept connections within %v: %w; log:\n%s", program, readyTimeout, err, logTail(logPath))
		case <-ticker.C:
		}
	}
}

// stop sends sig to the child and waits for it to exit, killing it if that
// takes longer than stopTimeout. The error names the program and ends with
// its log, read from logPath.
func (p *process) stop(sig os.Signal, program, logPath string) error {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("pgcluster: %s did not shut down within %v and was killed; log:\n%s", program, stopTimeout, logTail(logPath))
	}
}

// logTail returns the end of the log file at path.
func logTail(path string) string {
	const max = 4 << 10
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if info, err := f.Stat(); err == nil && info.Size() > max {
		_, _ = f.Seek(-max, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}
