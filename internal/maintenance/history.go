package maintenance

import (
	"context"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/internal/store"
)

// schedule lets a completer record something at most once in each slot
// of a fixed length of the process's clock: the first call of a slot
// records, the others of the slot send nothing. Where several processes
// run completers, the first to record a slot of the database's clock keeps
// it, and the others' statements change nothing.
type schedule struct {
	every time.Duration
	mu    sync.Mutex
	next  time.Time
	// warned is when a failure was last logged.
	warned time.Time
	// now is the clock; tests set it.
	now func() time.Time
}

// due reports whether this slot is not yet recorded, and marks it
// recorded.
func (s *schedule) due() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	if now.Before(s.next) {
		return false
	}
	s.next = now.Truncate(s.every).Add(s.every)
	return true
}

// untilDue is how long until the next slot.
func (s *schedule) untilDue() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.next.Sub(s.clock()), 0)
}

// logFailure reports whether a failure is the first of its minute, to log:
// a database without the table (a deploy not yet migrated) logs one
// warning a minute, not one a slot, and is recorded in the first slot
// after it is migrated.
func (s *schedule) logFailure() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	if now.Sub(s.warned) < time.Minute {
		return false
	}
	s.warned = now
	return true
}

func (s *schedule) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// recordHistory records the minute's counts for the console's chart, and
// every store.SampleEvery the completer's keys for the backlog's drain
// rate, when each is due: in a pass, and on the loop of counts that Start
// runs beside the passes. On a key table distributed with Citus both
// tables are reference tables, on every node, so a process connected to a
// worker records them too.
func (c *Completer) recordHistory(ctx context.Context) {
	if c.history.due() {
		if _, err := store.RecordHistory(ctx, c.db, c.workflows, c.cfg.StuckAfter); err != nil && ctx.Err() == nil && c.history.logFailure() {
			c.log.Warn("completer could not record the status history", "err", err)
		}
	}
	if c.samples.due() {
		if _, err := store.RecordSample(ctx, c.db); err != nil && ctx.Err() == nil && c.samples.logFailure() {
			c.log.Warn("completer could not count its keys for the backlog's drain rate", "err", err)
		}
	}
}

// trimHistory deletes the status history and the backlog's samples past
// their retention. A failure is logged and the run goes on: the keys
// matter more than the chart.
func (r *Reaper) trimHistory(ctx context.Context) {
	if _, err := store.TrimHistory(ctx, r.db); err != nil && ctx.Err() == nil {
		r.log.Warn("reaper could not trim the status history", "err", err)
	}
	if _, err := store.TrimSamples(ctx, r.db); err != nil && ctx.Err() == nil {
		r.log.Warn("reaper could not trim the completers' counts of their keys", "err", err)
	}
}
