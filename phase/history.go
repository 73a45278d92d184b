package phase

import (
	"context"
	"encoding/json"
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

// DrainWindow is the longest span Backlog measures a drain over: with no
// count of the completer's keys between DrainSpan and DrainWindow old (no
// completer ran lately), the rate is not measured, rather than averaged
// over a span in which a backlog may have both grown and drained.
const DrainWindow = 30 * time.Second

// DrainSpan is the shortest span Backlog measures a drain over: the rate
// runs from the newest count of the completer's keys at least this old to
// now. Each process's completer counts its keys every five seconds, on a
// loop of its own beside its passes, each count with the database's time;
// so while completers run the span is 10 to 15 seconds.
const DrainSpan = 10 * time.Second

// Backlog is the completer's backlog, the stuck and waiting keys, and how
// fast it drains.
type Backlog struct {
	// Stuck are the keys unfinished, not on hold, free, and idle for longer
	// than the completer's StuckAfter now: the completer takes them, those
	// it failed on once past their backoff (see NotDue).
	Stuck int `json:"stuck"`
	// Waiting are the keys unfinished, not on hold and free now that have
	// not been idle for StuckAfter yet, such as keys whose runs were cut a
	// moment ago, or that the completer tried while their provider was
	// down. The completer takes them once they are stuck and past their
	// backoff.
	Waiting int `json:"waiting"`
	// Unfinished are the keys the completer may yet have to finish now:
	// unfinished and not on hold (in flight, waiting or stuck), Stuck and
	// Waiting among them. The keys in flight are held by a lease: live
	// requests, the completers' own, and the keys of a process that died
	// holding them, until their leases run out.
	Unfinished int `json:"unfinished"`
	// PerSecond is how many keys a second Unfinished fell by, from the
	// newest count of them a completer took at least DrainSpan before now
	// to now: the completers' pace less the keys left unfinished
	// meanwhile, negative when more were left than finished. Over is that
	// span, between DrainSpan and DrainWindow. Keys passing from waiting
	// to stuck do not change it. Measured says whether there was a count
	// to measure from.
	PerSecond float64       `json:"per_second"`
	Over      time.Duration `json:"over_ns"`
	Measured  bool          `json:"measured"`
	// LastCount is how long ago the newest count of the completer's keys
	// was taken, measured or not: about five seconds at most while a
	// completer runs, more once none does; zero when there is no count
	// (none ran in the hour the counts are kept).
	LastCount time.Duration `json:"last_count_ns"`
	// Unmigrated says the rate is not measured because the schema lacks
	// the completers' counts (migration 015).
	Unmigrated bool `json:"unmigrated"`
	// NotDue are the keys of Stuck and Waiting that the completer does not
	// take yet, by this client's CompleterConfig: idle for less than its
	// StuckAfter, or waiting out the backoff of the completer's failures on
	// them. FirstDue and LastDue are how long until the first and the
	// last of them comes due; zero when NotDue is.
	NotDue   int           `json:"not_due"`
	FirstDue time.Duration `json:"first_due_ns"`
	LastDue  time.Duration `json:"last_due_ns"`
}

// Keys is the backlog's size: its stuck and waiting keys.
func (b Backlog) Keys() int { return b.Stuck + b.Waiting }

// EmptyIn is how long the backlog takes to drain at PerSecond, its
// unfinished keys with it, and no sooner than its last stuck or waiting
// key comes due (LastDue; keys in flight are not judged, and a killed
// process's come due when their leases run out): zero when no key is
// stuck or waiting, and ok false for a backlog that is not draining, whose
// rate is not measured, or that no completer counted lately (none runs).
// When none of its keys is due yet (after a crash cut a drain short, or
// while the keys wait out their backoff), the rate is not the completer's
// pace but how fast keys come due: EmptyIn is then LastDue, whatever the
// rate, as the completer takes each key once it comes due (if it then
// finishes).
func (b Backlog) EmptyIn() (d time.Duration, ok bool) {
	switch {
	case b.Keys() == 0:
		return 0, true
	case !b.counted():
		return 0, false
	case b.noneDue():
		return b.LastDue, true
	case !b.Measured || b.PerSecond <= 0:
		return 0, false
	}
	return max(time.Duration(float64(max(b.Unfinished, b.Keys()))/b.PerSecond*float64(time.Second)), b.LastDue), true
}

// counted reports whether a completer counted its keys lately: within
// twice the five seconds they count every.
func (b Backlog) counted() bool { return b.LastCount > 0 && b.LastCount <= 2*store.SampleEvery }

// noneDue reports whether the backlog has keys and none of them is due.
func (b Backlog) noneDue() bool { return b.Keys() > 0 && b.NotDue >= b.Keys() }

// comeDue says how many keys come due and when: "45 come due in 2s to
// 48s"; empty when none is waiting to.
func (b Backlog) comeDue() string {
	if b.NotDue == 0 {
		return ""
	}
	first, last := max(b.FirstDue.Round(time.Second), time.Second), max(b.LastDue.Round(time.Second), time.Second)
	if first == last {
		return fmt.Sprintf("%d come due in %s", b.NotDue, last)
	}
	return fmt.Sprintf("%d come due in %s to %s", b.NotDue, first, last)
}

// MarshalJSON writes b's fields and "empty_in_ns", EmptyIn in
// nanoseconds, or null when the backlog is not draining or its rate is not
// measured.
func (b Backlog) MarshalJSON() ([]byte, error) {
	type fields Backlog
	var emptyIn *time.Duration
	if d, ok := b.EmptyIn(); ok {
		emptyIn = &d
	}
	return json.Marshal(struct {
		fields
		EmptyIn *time.Duration `json:"empty_in_ns"`
	}{fields(b), emptyIn})
}

// Rate says, for people, how fast the backlog drains and when it will be
// empty: "draining 5.0 a second over the last 12s, empty in about 2s".
// It says how many keys the completer does not take yet and when they
// come due, and when that is all of them it says so instead of the rate:
// "none due yet: 45 come due in 2s to 48s". It names the keys in flight,
// if any, which "empty in about" counts too (a killed process's keys wait
// for their leases to run out); when no completer has counted for over
// twice the five seconds they count every, it says so, and says no time
// to empty.
func (b Backlog) Rate() string {
	s := b.rate()
	if due := b.comeDue(); due != "" && !b.noneDue() {
		s += "; " + due
	}
	if !b.Unmigrated && b.LastCount > 2*store.SampleEvery {
		s += fmt.Sprintf("; no completer has counted for %s", b.LastCount.Round(time.Second))
	}
	if inFlight := b.Unfinished - b.Keys(); inFlight > 0 {
		s += fmt.Sprintf("; %d in flight", inFlight)
	}
	return s
}

// rate is Rate without its notes.
func (b Backlog) rate() string {
	switch {
	case b.Unmigrated:
		return "drain rate unknown: the schema lacks the completers' counts of their keys (migration 015): migrate it"
	case b.noneDue():
		return "none due yet: " + b.comeDue()
	case !b.Measured && b.LastCount == 0:
		return "drain rate unknown: no completer has counted its keys in the last hour"
	case !b.Measured:
		return "drain rate unknown: no completer counted its keys between " + DrainSpan.String() +
			" and " + DrainWindow.String() + " ago"
	}
	over := "over the last " + b.Over.Round(time.Second).String()
	empty, ok := b.EmptyIn()
	switch {
	case b.Keys() == 0 || !b.counted() && b.PerSecond >= 0:
		// Keys in flight are no backlog: their rise is not its growth.
		// With no completer counting lately the drain is over, for now
		// (Rate says so).
		return fmt.Sprintf("drained %.1f a second %s", max(b.PerSecond, 0), over)
	case b.PerSecond < 0:
		return fmt.Sprintf("growing by %.1f a second %s", -b.PerSecond, over)
	case ok:
		return fmt.Sprintf("draining %.1f a second %s, empty in about %s", b.PerSecond, over, max(empty.Round(time.Second), time.Second))
	}
	return "not draining " + over
}

// Backlog returns the stuck and waiting keys now, which of them are not
// due yet, and how fast the completer's keys drained since the newest
// count of them a completer took at least DrainSpan ago. Like Counts, it reads no finished key; the rate
// comes from the completers' counts, so it is not measured where none was
// taken between DrainSpan and DrainWindow ago (no completer ran then), or
// the schema predates them.
func (c *Client) Backlog(ctx context.Context) (Backlog, error) {
	counts, err := c.Counts(ctx)
	if err != nil {
		return Backlog{}, err
	}
	return c.BacklogOf(ctx, counts)
}

// BacklogOf is Backlog of the keys as counted a moment before, by Counts
// or by CountsByWorkflow summed: a report that shows the counts beside the
// backlog (`atomicphase counts`, the console's overview) shows one count
// of the keys. It reads the completers' counts and, for NotDue, the
// unfinished keys alone.
func (c *Client) BacklogOf(ctx context.Context, now keyrow.Counts) (Backlog, error) {
	b := Backlog{Stuck: now.Stuck, Waiting: now.Waiting, Unfinished: now.InFlight + now.Waiting + now.Stuck}
	cfg := c.cfg.Completer
	due, err := store.CountNotDue(ctx, c.db, cfg.StuckAfter, cfg.Backoff, cfg.MaxBackoff)
	if err != nil {
		return b, err
	}
	// Read a moment after now, the keys not due may count a key that was
	// in flight then; the backlog is now's.
	if due.Keys > 0 && b.Keys() > 0 {
		b.NotDue, b.FirstDue, b.LastDue = min(due.Keys, b.Keys()), due.First, due.Last
	}
	r, err := store.LatestSample(ctx, c.db, DrainSpan, DrainWindow)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
		b.Unmigrated = true
		return b, nil
	}
	if err != nil {
		return b, err
	}
	if !r.Newest.IsZero() {
		b.LastCount = r.Now.Sub(r.Newest)
	}
	if r.From == nil {
		return b, nil
	}
	sample, at := *r.From, r.Now
	b.Over = at.Sub(sample.At)
	b.PerSecond = float64(sample.Keys-b.Unfinished) / b.Over.Seconds()
	b.Measured = true
	return b, nil
}
