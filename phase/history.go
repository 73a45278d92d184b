package phase

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// StatusMinute is how many unfinished keys of one workflow were in each
// status at one minute, as a completer recorded them in its first pass of
// that minute; Counts.Finished is always zero.
type StatusMinute struct {
	At       time.Time
	Workflow string
	keyrow.Counts
}

// History returns the unfinished keys of each workflow by status in each
// minute of the last window that a completer recorded, oldest first, one
// StatusMinute per workflow and minute. A minute no completer recorded
// (none ran) is missing, not zero. It reads a table of a few rows a minute, kept for a day, however
// many keys the key table holds; a database whose schema predates it has
// no history.
func (c *Client) History(ctx context.Context, window time.Duration) ([]StatusMinute, error) {
	ms, err := store.History(ctx, c.db, window)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]StatusMinute, len(ms))
	for i, m := range ms {
		out[i] = StatusMinute(m)
	}
	return out, nil
}

// DrainWindow is how far back Backlog looks for the rate at which the
// backlog drains.
const DrainWindow = 5 * time.Minute

// Backlog is the completer's backlog, the stuck keys, and how fast it
// drains.
type Backlog struct {
	// Keys are the stuck keys now: unfinished, not on hold, free, and idle
	// for longer than the completer's StuckAfter.
	Keys int `json:"keys"`
	// PerSecond is how many keys a second the stuck keys fell by, over
	// the minutes the completers recorded in the last DrainWindow (see
	// History), from the one with the most to the newest, negative when
	// they rose (measured from the oldest when the newest has the most):
	// the completers' pace less the keys that became stuck meanwhile. A
	// backlog that formed within the window counts from its peak, not from
	// the quiet minutes before it. It is measured only
	// from minutes that follow a recorded minute, so it needs three
	// minutes recorded in a row; Measured says so.
	PerSecond float64 `json:"per_second"`
	Measured  bool    `json:"measured"`
}

// EmptyIn is how long the backlog takes to drain at PerSecond: zero for
// an empty backlog, and ok false for one that is not draining or whose
// rate is not measured.
func (b Backlog) EmptyIn() (d time.Duration, ok bool) {
	switch {
	case b.Keys == 0:
		return 0, true
	case !b.Measured || b.PerSecond <= 0:
		return 0, false
	}
	return time.Duration(float64(b.Keys) / b.PerSecond * float64(time.Second)), true
}

// Rate says, for people, how fast the backlog drains and when it will be
// empty: "draining 5.0 a second over the last 5m0s, empty in about 2s".
func (b Backlog) Rate() string {
	over := "over the last " + DrainWindow.String()
	empty, ok := b.EmptyIn()
	switch {
	case !b.Measured:
		return "drain rate unknown: fewer than three minutes in a row of status history " + over
	case b.PerSecond < 0:
		return fmt.Sprintf("growing by %.1f a second %s", -b.PerSecond, over)
	case ok && b.Keys > 0:
		return fmt.Sprintf("draining %.1f a second %s, empty in about %s", b.PerSecond, over, empty.Round(time.Second))
	}
	return fmt.Sprintf("drained %.1f a second %s", b.PerSecond, over)
}

// Backlog returns the stuck keys now and how fast they drained over the
// last DrainWindow. Like Counts, it reads no finished key; the rate comes
// from the status history, so it is not measured where none is recorded
// (no completer ran).
func (c *Client) Backlog(ctx context.Context) (Backlog, error) {
	counts, err := c.Counts(ctx)
	if err != nil {
		return Backlog{}, err
	}
	return c.backlog(ctx, counts.Stuck)
}

// backlog is Backlog with the stuck keys counted.
func (c *Client) backlog(ctx context.Context, stuck int) (Backlog, error) {
	ms, err := c.History(ctx, DrainWindow)
	if err != nil {
		return Backlog{}, err
	}
	b := Backlog{Keys: stuck}
	b.PerSecond, b.Measured = drainRate(ms)
	return b, nil
}

// drainRate returns how many stuck keys a second, summed over their
// workflows, the minute of ms with the most and the newest are apart (the
// oldest and the newest, when the newest has the most), of the minutes
// that follow a recorded minute, and false when ms holds fewer than two
// such minutes. Each minute is recorded by the first completer pass in it: in
// a minute that follows a recorded one, passes ran across its start, and
// the record was made within about a pass of it; the first minute of a
// series (a completer started, or passes resumed after a pause) may have
// been recorded at any second of it, so its record is not placed in time
// well enough to measure from.
func drainRate(ms []StatusMinute) (float64, bool) {
	recorded := map[time.Time]bool{}
	for _, m := range ms {
		recorded[m.At] = true
	}
	stuck := map[time.Time]int{}
	for _, m := range ms {
		if recorded[m.At.Add(-time.Minute)] {
			stuck[m.At] += m.Stuck
		}
	}
	var first, last, peak time.Time
	for at, n := range stuck {
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
		if peak.IsZero() || n > stuck[peak] || n == stuck[peak] && at.Before(peak) {
			peak = at
		}
	}
	if first.IsZero() || first.Equal(last) {
		return 0, false
	}
	if !peak.Equal(last) {
		first = peak
	}
	then, now := stuck[first], stuck[last]
	return float64(then-now) / last.Sub(first).Seconds(), true
}
