package recovery_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

// awayFromTheMinuteEnd waits for the next minute when the current one has
// less than five seconds left, so that the passes of a test fall in one
// minute.
func awayFromTheMinuteEnd() {
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 5*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
}

func historyRows(t *testing.T, db *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM atomicphase_status_history`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestTheCompleterRecordsTheStatusHistoryOnceAMinute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	w := effectsWorkflow(t, db)
	// Keys wait an hour before the completer takes them: the pass counts
	// them and leaves them.
	waitAnHour := func(cfg *phase.Config) { cfg.Completer.StuckAfter = time.Hour }
	a := client(t, db, waitAnHour, w)
	abandon(t, db, "effects", "k1", `{"n":1}`)
	abandon(t, db, "effects", "k2", `{"n":2}`)
	abandon(t, db, "effects", "k3", `{"n":3}`)
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET hold = 'dead' WHERE idempotency_key = 'k3'`); err != nil {
		t.Fatal(err)
	}
	awayFromTheMinuteEnd()

	if _, err := a.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	history, err := a.History(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(history) != 1 || history[0].Workflow != "effects" || history[0].Waiting != 2 || history[0].Dead != 1 ||
		history[0].InFlight+history[0].Stuck+history[0].Unknown != 0 {
		t.Fatalf("history after one pass = %+v; want one minute of effects with 2 waiting and 1 dead", history)
	}
	if n := historyRows(t, db); n != 5 {
		t.Fatalf("one pass wrote %d rows; want one per unfinished status, 5", n)
	}

	// A second process in the same minute: its statement keeps the first
	// row set of the minute.
	abandon(t, db, "effects", "k4", `{"n":4}`)
	b := client(t, db, waitAnHour, w)
	if _, err := b.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	if history, err = b.History(ctx, time.Hour); err != nil || len(history) != 1 || history[0].Waiting != 2 {
		t.Fatalf("history after another process's pass = %+v, %v; want the first row set kept", history, err)
	}

	// The first process sends nothing more this minute.
	if _, err := db.Exec(ctx, `DELETE FROM atomicphase_status_history`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := a.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := historyRows(t, db); n != 0 {
		t.Fatalf("passes later in the minute wrote %d rows; want none", n)
	}
}

func TestTheCompleterRecordsItsWorkflowsWithNoUnfinishedKeyAsZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	c := client(t, db, nil, effectsWorkflow(t, db))
	if _, err := c.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	history, err := c.History(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(history) != 1 || history[0].Workflow != "effects" || history[0].Unfinished() != 0 {
		t.Fatalf("history of a workflow without keys = %+v; want one minute of zeros", history)
	}
}

func TestTheReaperDeletesTheStatusHistoryAfterADay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	c := client(t, db, nil, effectsWorkflow(t, db))
	_, err := db.Exec(ctx, `INSERT INTO atomicphase_status_history (minute, workflow, status, keys)
		VALUES (date_trunc('minute', now()) - interval '25 hours', 'effects', 'stuck', 3),
		       (date_trunc('minute', now()) - interval '23 hours', 'effects', 'stuck', 2)`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, `SELECT keys FROM atomicphase_status_history`)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil || len(kept) != 1 || kept[0] != 2 {
		t.Fatalf("after a reaper run the history holds %v (%v); want only the minute of 23 hours ago", kept, err)
	}
}

// awayFromTheSlotEnd waits for the next slot of store.SampleEvery when the
// current one has less than a second left, so that the passes of a test
// fall in one slot, and returns the slot's end.
func awayFromTheSlotEnd() time.Time {
	end := time.Now().Truncate(5 * time.Second).Add(5 * time.Second)
	if time.Until(end) < time.Second {
		time.Sleep(time.Until(end) + 50*time.Millisecond)
		end = end.Add(5 * time.Second)
	}
	return end
}

func samples(t *testing.T, db *pgxpool.Pool) []int {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT keys FROM atomicphase_backlog_samples ORDER BY slot`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestTheCompleterCountsItsKeysEveryFiveSeconds: the first pass of each
// five seconds counts the unfinished keys not on hold, in flight, waiting
// or stuck, for the backlog's drain rate; the other passes of the five
// seconds, of this process or another, add nothing; the reaper deletes
// the counts after an hour.
func TestTheCompleterCountsItsKeysEveryFiveSeconds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	w := effectsWorkflow(t, db)
	waitAnHour := func(cfg *phase.Config) { cfg.Completer.StuckAfter = time.Hour }
	a := client(t, db, waitAnHour, w)
	for i := range 4 {
		abandon(t, db, "effects", fmt.Sprintf("k%d", i), fmt.Sprintf(`{"n":%d}`, i))
	}
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET hold = 'dead' WHERE idempotency_key = 'k3'`); err != nil {
		t.Fatal(err)
	}
	end := awayFromTheSlotEnd()
	if _, err := a.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	abandon(t, db, "effects", "k4", `{"n":4}`)
	b := client(t, db, waitAnHour, w)
	for _, c := range []*phase.Client{a, b, a} {
		if _, err := c.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if time.Now().After(end) {
		t.Skip("the passes took longer than the five seconds they were meant to fall in")
	}
	if got := samples(t, db); !slices.Equal(got, []int{3}) {
		t.Fatalf("counts after passes in one five seconds = %v; want the first pass's 3 alone", got)
	}
	time.Sleep(time.Until(end) + 50*time.Millisecond)
	if _, err := b.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	if got := samples(t, db); !slices.Equal(got, []int{3, 4}) {
		t.Fatalf("counts after a pass in the next five seconds = %v; want 3, then 4", got)
	}
	if _, err := db.Exec(ctx, `UPDATE atomicphase_backlog_samples SET slot = slot - interval '61 minutes' WHERE keys = 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := samples(t, db); !slices.Equal(got, []int{4}) {
		t.Fatalf("counts after a reaper run = %v; want the one of an hour ago gone", got)
	}
}

// TestTheCompleterCountsItsKeysWhilePassesPause: a completer whose passes
// pause for a minute (its Interval, or a backoff after failing passes)
// still counts its keys every five seconds, so that the backlog's drain
// rate is measured over seconds after an outage too.
func TestTheCompleterCountsItsKeysWhilePassesPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	abandon(t, db, "effects", "k1", `{"n":1}`)
	c := client(t, db, func(cfg *phase.Config) {
		cfg.Completer.Interval = time.Minute
		cfg.Completer.StuckAfter = time.Hour
	}, effectsWorkflow(t, db))
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx) //nolint:errcheck // the test's end
	deadline := time.Now().Add(15 * time.Second)
	for len(samples(t, db)) < 3 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if got := samples(t, db); !slices.Equal(got, []int{1, 1, 1}) {
		t.Fatalf("counts within 15 s of a start whose next pass is a minute away = %v; want the one key counted three times", got)
	}
}
