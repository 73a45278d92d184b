package maintenance

import (
	"context"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/internal/store"
)

// schedule lets a completer pass record something at most once in each
// slot of a fixed length of the process's clock: the first pass of a slot
// records, the others of the slot send nothing. Where several processes
// run completers, the first to record a slot of the database's clock keeps
// it, and the others' statements change nothing.
type schedule struct {
	every time.Duration
	mu    sync.Mutex
	next  time.Time
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

// failed puts the next attempt off to the next minute, so that a database
// without the table (a deploy not yet migrated) costs one failed statement
// a minute, not one a slot or a pass.
func (s *schedule) failed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if minute := s.clock().Truncate(time.Minute).Add(time.Minute); minute.After(s.next) {
		s.next = minute
	}
}

func (s *schedule) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// recordHistory records the minute's counts for the console's chart, and
// every store.SampleEvery the completer's keys for the backlog's drain
// rate, when each is due. On a key table distributed with Citus both
// tables are reference tables, on every node, so a process connected to a
// worker records them too.
func (c *Completer) recordHistory(ctx context.Context) {
	if c.history.due() {
		if _, err := store.RecordHistory(ctx, c.db, c.workflows, c.cfg.StuckAfter); err != nil && ctx.Err() == nil {
			c.history.failed()
			c.log.Warn("completer could not record the status history", "err", err)
		}
	}
	if c.samples.due() {
		if _, err := store.RecordSample(ctx, c.db); err != nil && ctx.Err() == nil {
			c.samples.failed()
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
