package exampleprog

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Intervals of Progress: a terminal's line is redrawn often, a log gets a
// line now and then.
const (
	terminalInterval = 250 * time.Millisecond
	logInterval      = 5 * time.Second
	// maxWidth keeps a redrawn line on one row of an 80-column terminal.
	maxWidth = 79
)

// Progress shows status, a line of at most 79 columns, while a long step
// runs. On a terminal it redraws one line in place four times a second, cut
// to 79 columns so that it never wraps;
// anywhere else (a file, a pipe) it writes a full line every 5 seconds, so
// that a log holds readable lines rather than one line of carriage returns.
// stop writes the last status as a full line and returns once nothing more
// will be written.
func Progress(w io.Writer, status func() string) (stop func()) {
	live := isTerminal(w)
	every := logInterval
	if live {
		every = terminalInterval
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		var last int // length of the line drawn last, to blank its tail
		draw := func(final bool) {
			line := status()
			if live && len(line) > maxWidth {
				line = line[:maxWidth]
			}
			switch {
			case !live:
				fmt.Fprintln(w, line)
			case final:
				fmt.Fprintln(w, "\r"+line+strings.Repeat(" ", max(0, last-len(line))))
			default:
				fmt.Fprint(w, "\r"+line+strings.Repeat(" ", max(0, last-len(line))))
				last = len(line)
			}
		}
		for {
			select {
			case <-done:
				draw(true)
				return
			case <-t.C:
				draw(false)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// isTerminal reports whether w is a terminal (a character device such as a
// tty, or /dev/null, where redrawing does no harm).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
