package maintenance

import (
	"context"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/internal/store"
)

// history records the unfinished keys of each workflow by status at most
// once a minute of the process's clock, for the console's chart: the first
// completer pass of each minute records, the others of the minute send
// nothing. Where several processes run completers, the first to record a
// minute of the database's clock keeps it, and the others' statements
// change nothing.
type history struct {
	mu   sync.Mutex
	last time.Time
	// now is the clock; tests set it.
	now func() time.Time
}

// due reports whether this minute is not yet recorded, and marks it
// recorded: a failed attempt waits for the next minute too, so that a
// database without the history table (a deploy not yet migrated) costs
// one failed statement a minute, not one a pass.
func (h *history) due() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now
	if h.now != nil {
		now = h.now
	}
	minute := now().Truncate(time.Minute)
	if minute.Equal(h.last) {
		return false
	}
	h.last = minute
	return true
}

// recordHistory records the minute's counts when it is due. On a key table
// distributed with Citus the history is a reference table, on every node,
// so a process connected to a worker records it too.
func (c *Completer) recordHistory(ctx context.Context) {
	if !c.history.due() {
		return
	}
	if _, err := store.RecordHistory(ctx, c.db, c.workflows, c.cfg.StuckAfter); err != nil && ctx.Err() == nil {
		c.log.Warn("completer could not record the status history", "err", err)
	}
}

// trimHistory deletes the status history past its retention. A failure
// is logged and the run goes on: the keys matter more than the chart.
func (r *Reaper) trimHistory(ctx context.Context) {
	if _, err := store.TrimHistory(ctx, r.db); err != nil && ctx.Err() == nil {
		r.log.Warn("reaper could not trim the status history", "err", err)
	}
}
