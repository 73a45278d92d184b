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
	ms, _, err := c.history(ctx, window)
	return ms, err
}

// history is History with the database's time now (zero when no minute
// was recorded).
func (c *Client) history(ctx context.Context, window time.Duration) ([]StatusMinute, time.Time, error) {
	ms, now, err := store.History(ctx, c.db, window)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]StatusMinute, len(ms))
	for i, m := range ms {
		out[i] = StatusMinute(m)
	}
	return out, now, nil
}

// DrainWindow is how far back Backlog looks for a recorded minute to
// measure how fast the backlog drains from.
const DrainWindow = 5 * time.Minute

// DrainSpan is the shortest span Backlog measures a drain over: the rate
// runs from the newest recorded minute at least this old to now, so from
// a quarter of a minute to a minute and a quarter while completers run.
// A minute's record is made by the first completer pass in it, at most
// about a pass after the minute began; the longer the span, the less
// that blurs the rate, which it can only make read low.
const DrainSpan = 15 * time.Second

// Backlog is the completer's backlog, the stuck keys, and how fast it
// drains.
type Backlog struct {
	// Keys are the stuck keys now: unfinished, not on hold, free, and idle
	// for longer than the completer's StuckAfter.
	Keys int `json:"keys"`
	// Unfinished are the keys the completer may yet have to finish now:
	// unfinished and not on hold (in flight, waiting or stuck), Keys among
	// them. Keys the completer tried while their provider was down wait
	// out their backoff as waiting keys, not stuck ones.
	Unfinished int `json:"unfinished"`
	// PerSecond is how many keys a second Unfinished fell by, from the
	// newest minute the completers recorded at least DrainSpan before now
	// (see History) to now: the completers' pace less the keys left
	// unfinished meanwhile, negative when more were left than finished.
	// Over is that span, between DrainSpan and DrainWindow and a minute. Keys passing
	// from waiting to stuck do not change it. It is measured only from a
	// minute that follows a recorded minute (the first of a series may
	// have been recorded at any second of it); Measured says whether there
	// was one.
	PerSecond float64       `json:"per_second"`
	Over      time.Duration `json:"over_ns"`
	Measured  bool          `json:"measured"`
}

// EmptyIn is how long the backlog takes to drain at PerSecond, its
// unfinished keys with it: zero when no key is stuck, and ok false for a
// backlog that is not draining or whose rate is not measured.
func (b Backlog) EmptyIn() (d time.Duration, ok bool) {
	switch {
	case b.Keys == 0:
		return 0, true
	case !b.Measured || b.PerSecond <= 0:
		return 0, false
	}
	return time.Duration(float64(max(b.Unfinished, b.Keys)) / b.PerSecond * float64(time.Second)), true
}

// Rate says, for people, how fast the backlog drains and when it will be
// empty: "draining 5.0 a second over the last 1m12s, empty in about 2s".
func (b Backlog) Rate() string {
	if !b.Measured {
		return "drain rate unknown: no status history recorded at least " + DrainSpan.String() +
			" ago, after a minute recorded before it, in the last " + DrainWindow.String()
	}
	over := "over the last " + b.Over.Round(time.Second).String()
	empty, ok := b.EmptyIn()
	switch {
	case b.PerSecond < 0:
		return fmt.Sprintf("growing by %.1f a second %s", -b.PerSecond, over)
	case ok && b.Keys > 0:
		return fmt.Sprintf("draining %.1f a second %s, empty in about %s", b.PerSecond, over, empty.Round(time.Second))
	case b.Keys > 0:
		return "not draining " + over
	}
	return fmt.Sprintf("drained %.1f a second %s", b.PerSecond, over)
}

// Backlog returns the stuck keys now and how fast the completer's keys
// drained since the newest minute of status history at least DrainSpan
// old. Like Counts, it reads no finished
// key; the rate comes from the status history, so it is not measured
// where none is recorded (no completer ran).
func (c *Client) Backlog(ctx context.Context) (Backlog, error) {
	counts, err := c.Counts(ctx)
	if err != nil {
		return Backlog{}, err
	}
	ms, now, err := c.history(ctx, DrainWindow)
	if err != nil {
		return Backlog{}, err
	}
	return backlog(counts, ms, now), nil
}

// backlog is the Backlog of the keys counted now, at now by the
// database's clock, and of the minutes ms recorded before it.
func backlog(now keyrow.Counts, ms []StatusMinute, at time.Time) Backlog {
	b := Backlog{Keys: now.Stuck, Unfinished: completerKeys(now)}
	b.PerSecond, b.Over, b.Measured = drainRate(ms, at, b.Unfinished)
	return b
}

// completerKeys are the keys of c the completer may yet have to finish:
// unfinished and not on hold.
func completerKeys(c keyrow.Counts) int { return c.InFlight + c.Waiting + c.Stuck }

// drainRate returns how many keys a second the completer's keys, summed
// over their workflows, fell by from the newest minute of ms recorded at
// least DrainSpan before now, of the minutes that follow a recorded
// minute, to unfinished now; and false when ms holds no such minute. Each
// minute is recorded by the first completer pass in it: in a minute that
// follows a recorded one, passes ran across its start, and the record was
// made within about a pass of it; the first minute of a series (a
// completer started, or passes resumed after a pause) may have been
// recorded at any second of it, so its record is not placed in time well
// enough to measure from.
func drainRate(ms []StatusMinute, now time.Time, unfinished int) (float64, time.Duration, bool) {
	recorded := map[time.Time]bool{}
	for _, m := range ms {
		recorded[m.At] = true
	}
	keys := map[time.Time]int{}
	var from time.Time
	for _, m := range ms {
		if !recorded[m.At.Add(-time.Minute)] || now.Sub(m.At) < DrainSpan {
			continue
		}
		keys[m.At] += completerKeys(m.Counts)
		if m.At.After(from) {
			from = m.At
		}
	}
	if from.IsZero() {
		return 0, 0, false
	}
	over := now.Sub(from)
	return float64(keys[from]-unfinished) / over.Seconds(), over, true
}

// recent returns the minutes of ms that History(DrainWindow) would at now.
func recent(ms []StatusMinute, now time.Time) []StatusMinute {
	since := now.Truncate(time.Minute).Add(-DrainWindow)
	i := 0
	for i < len(ms) && ms[i].At.Before(since) {
		i++
	}
	return ms[i:]
}
