package phase_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// TestBacklogRateIsTheFallOfTheCompletersKeysSinceTheNewestCount: the
// rate runs from the newest count of the completer's keys taken at least
// DrainSpan ago to the keys counted now, over the time between them by the
// database's clock; a count younger than DrainSpan or older than
// DrainWindow is not measured from; keys passing from waiting to stuck
// are neither a drain nor growth; a schema without the counts says so.
func TestBacklogRateIsTheFallOfTheCompletersKeysSinceTheNewestCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	fp, err := keyrow.Fingerprint("orders", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	// 6 stuck keys and 4 waiting ones (tried a moment ago), 10 unfinished.
	_, err = e.db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params, last_run_at)
SELECT 'acme', 'k' || i, 'orders', $1, '{}', now() - CASE WHEN i <= 6 THEN interval '1 hour' ELSE interval '0' END
FROM generate_series(1, 10) AS i`, fp[:])
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The waiting keys come due once idle for StuckAfter: this test's
	// lines leave them out (see TestBacklogSaysWhenItsKeysComeDue).
	notDue := func(b *phase.Backlog) {
		t.Helper()
		if b.NotDue != 4 || b.FirstDue <= 50*time.Second || b.LastDue > recovery.DefaultStuckAfter {
			t.Errorf("backlog %+v; want its 4 waiting keys due within StuckAfter", b)
		}
		b.NotDue, b.FirstDue, b.LastDue = 0, 0, 0
	}
	notDue(&b)
	if want := (phase.Backlog{Stuck: 6, Waiting: 4, Unfinished: 10}); b != want {
		t.Fatalf("backlog with no count taken = %+v; want %+v", b, want)
	}
	if got, want := b.Rate(), "drain rate unknown: no completer has counted its keys in the last hour"; got != want {
		t.Errorf("rate %q; want %q", got, want)
	}
	// counted replaces the completers' counts with keys counted ago.
	counted := func(counts map[time.Duration]int) {
		t.Helper()
		if _, err := e.db.Exec(ctx, `DELETE FROM atomicphase_backlog_samples`); err != nil {
			t.Fatal(err)
		}
		for ago, keys := range counts {
			_, err := e.db.Exec(ctx, `
INSERT INTO atomicphase_backlog_samples (slot, at, keys)
SELECT to_timestamp(floor(extract(epoch FROM now() - $1::interval) / 5) * 5), now() - $1::interval, $2`, ago, keys)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name   string
		counts map[time.Duration]int
		from   int
		ago    time.Duration
		newest time.Duration
		rate   string
	}{
		{"a drain in progress", map[time.Duration]int{6 * time.Minute: 90_000, 40 * time.Second: 400, 20 * time.Second: 250, 5 * time.Second: 3},
			250, 20 * time.Second, 5 * time.Second, `draining 12.0 a second over the last 20s, empty in about 1s`},
		{"a rising backlog", map[time.Duration]int{12 * time.Second: 4, 2 * time.Second: 8}, 4, 12 * time.Second, 2 * time.Second,
			`growing by 0.5 a second over the last 12s`},
		{"keys becoming stuck", map[time.Duration]int{15 * time.Second: 10, 4 * time.Second: 10}, 10, 15 * time.Second, 4 * time.Second,
			`not draining over the last 15s`},
		// The newest count is from 25 s ago: no completer ran since.
		{"no completer since", map[time.Duration]int{25 * time.Second: 110}, 110, 25 * time.Second, 25 * time.Second,
			`drained 4.0 a second over the last 25s; no completer has counted for 25s`},
	} {
		counted(c.counts)
		b, err := e.c.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		notDue(&b)
		// The span runs to the database's time of the read, a moment after
		// the count was written.
		if !b.Measured || b.Over < c.ago || b.Over > c.ago+5*time.Second || b.PerSecond != float64(c.from-10)/b.Over.Seconds() {
			t.Errorf("%s: backlog %+v; want %d keys less 10 over %v", c.name, b, c.from, c.ago)
		}
		// The newest count is the one measured from, or a younger one.
		if b.LastCount < c.newest || b.LastCount > c.newest+5*time.Second || b.LastCount > b.Over {
			t.Errorf("%s: the newest count is %v old; want %v, no older than the %v span", c.name, b.LastCount, c.newest, b.Over)
		}
		b.Over, b.LastCount = c.ago, c.newest
		b.PerSecond = float64(c.from-10) / c.ago.Seconds()
		if got := b.Rate(); got != c.rate {
			t.Errorf("%s: rate %q; want %q", c.name, got, c.rate)
		}
	}
	// BacklogOf takes the keys as counted already, for a report that
	// shows them beside it.
	counted(map[time.Duration]int{20 * time.Second: 409})
	b, err = e.c.BacklogOf(ctx, keyrow.Counts{InFlight: 2, Stuck: 7, Dead: 3, Finished: 100})
	if err != nil || b.Stuck != 7 || b.Waiting != 0 || b.Unfinished != 9 || b.PerSecond != 400/b.Over.Seconds() {
		t.Errorf("BacklogOf 2 in flight and 7 stuck = %+v, %v; want 7 stuck of 9 unfinished, 400 drained", b, err)
	}
	// A count younger than DrainSpan is too near to measure from, and one
	// older than DrainWindow too far: no completer ran lately, and the
	// backlog may have grown and drained since.
	for _, counts := range []map[time.Duration]int{{9 * time.Second: 500}, {40 * time.Second: 500}, {6 * time.Minute: 500}} {
		counted(counts)
		if b, err := e.c.Backlog(ctx); err != nil || b.Measured {
			t.Errorf("backlog from %v = %+v, %v; want the rate not measured", counts, b, err)
		}
	}
	// A schema without the counts' table says so.
	if _, err := e.db.Exec(ctx, `DROP TABLE atomicphase_backlog_samples`); err != nil {
		t.Fatal(err)
	}
	b, err = e.c.Backlog(ctx)
	notDue(&b)
	if want := "drain rate unknown: the schema lacks the completers' counts of their keys (migration 015): migrate it"; err != nil || b.Measured || !b.Unmigrated || b.Rate() != want {
		t.Errorf("backlog on a schema without migration 015 = %+v, %v, %q; want %q", b, err, b.Rate(), want)
	}
}

// TestBacklogSaysWhenItsKeysComeDue: of the stuck and waiting keys, those
// the completer does not take yet (idle for less than StuckAfter, or
// waiting out the backoff of its failures) are counted with when the
// first and the last come due; keys leased, on hold or finished are not
// the backlog's. With none due the line says so instead of a rate.
func TestBacklogSaysWhenItsKeysComeDue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	fp, err := keyrow.Fingerprint("orders", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	// With the defaults (StuckAfter a minute, Backoff 30 s): two keys a
	// client left 50 s ago, due in 10 s; one the completer failed twice,
	// idle 70 s (stuck) and waiting out 60 s of backoff, due in 50 s; and
	// keys that are no backlog: leased, on hold, finished.
	_, err = e.db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
                              last_run_at, failures, locked_at, lock_expires_at, lock_token, hold,
                              finished_at, recovery_point, response_status)
SELECT 'acme', k, 'orders', $1, '{}', now() - idle, failures, lease, lease + interval '1 minute',
       CASE WHEN lease IS NOT NULL THEN gen_random_uuid() END, hold,
       finished, CASE WHEN finished IS NULL THEN 'started' ELSE 'finished' END, CASE WHEN finished IS NULL THEN NULL ELSE 201 END
FROM (VALUES ('cut-1', interval '50 seconds', 0, NULL::timestamptz, NULL, NULL::timestamptz),
             ('cut-2', interval '50 seconds', 0, NULL, NULL, NULL),
             ('failed', interval '70 seconds', 2, NULL, NULL, NULL),
             ('leased', interval '1 hour', 0, now(), NULL, NULL),
             ('held', interval '1 hour', 0, NULL, 'unknown', NULL),
             ('done', interval '1 hour', 0, NULL, NULL, now())) AS v(k, idle, failures, lease, hold, finished)`, fp[:])
	if err != nil {
		t.Fatal(err)
	}
	// No completer counted its keys: none takes them when they come due.
	b, err := e.c.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := b.EmptyIn(); !strings.HasPrefix(b.Rate(), "none due yet: 3 come due in ") || ok {
		t.Errorf("rate %q, empty in %v, %v with no completer; want none due, and no time to empty", b.Rate(), d, ok)
	}
	// A completer counted its keys a second ago.
	if _, err := e.db.Exec(ctx, `INSERT INTO atomicphase_backlog_samples (slot, at, keys) VALUES (now() - interval '1 second', now() - interval '1 second', 3)`); err != nil {
		t.Fatal(err)
	}
	b, err = e.c.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Stuck != 1 || b.Waiting != 2 || b.NotDue != 3 ||
		b.FirstDue <= 8*time.Second || b.FirstDue > 10*time.Second || b.LastDue <= 48*time.Second || b.LastDue > 50*time.Second {
		t.Fatalf("backlog %+v; want 1 stuck and 2 waiting, all 3 due in 10 s to 50 s", b)
	}
	if d, ok := b.EmptyIn(); !strings.HasPrefix(b.Rate(), "none due yet: 3 come due in ") || !ok || d != b.LastDue {
		t.Errorf("rate %q, empty in %v, %v; want none due, empty when the last comes due", b.Rate(), d, ok)
	}
	// A key due now: the line gives the rate, and the keys not due.
	if _, err := e.db.Exec(ctx, `UPDATE idempotency_keys SET last_run_at = now() - interval '1 hour' WHERE idempotency_key = 'cut-1'`); err != nil {
		t.Fatal(err)
	}
	b, err = e.c.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Stuck != 2 || b.Waiting != 1 || b.NotDue != 2 || b.FirstDue > 10*time.Second || b.LastDue <= 48*time.Second ||
		!strings.HasPrefix(b.Rate(), "drain rate unknown: ") || !strings.Contains(b.Rate(), "; 2 come due in ") {
		t.Errorf("backlog %+v, rate %q; want 2 of 3 not due, the rate unknown", b, b.Rate())
	}
}

// TestBacklogSaysHowLongItsUnfinishedKeysTake: the time to empty counts the
// keys waiting out a backoff too, a backlog of waiting keys alone is not
// empty, keys in flight alone are no backlog but are named, a backlog
// whose keys do not fall says it is not draining, and a rate from counts
// no completer added to lately says so.
func TestBacklogSaysHowLongItsUnfinishedKeysTake(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		b     phase.Backlog
		empty time.Duration
		ok    bool
		rate  string
	}{
		{phase.Backlog{Stuck: 600, Waiting: 200, Unfinished: 1000, PerSecond: 10, Over: 12 * time.Second, Measured: true, LastCount: 4 * time.Second},
			100 * time.Second, true, "draining 10.0 a second over the last 12s, empty in about 1m40s; 200 in flight"},
		{phase.Backlog{Waiting: 2500, Unfinished: 2500, PerSecond: 100, Over: 12 * time.Second, Measured: true, LastCount: 4 * time.Second},
			25 * time.Second, true, "draining 100.0 a second over the last 12s, empty in about 25s"},
		{phase.Backlog{Stuck: 1, Waiting: 1, Unfinished: 3, PerSecond: 20, Over: 20 * time.Second, Measured: true, LastCount: 4 * time.Second},
			150 * time.Millisecond, true, "draining 20.0 a second over the last 20s, empty in about 1s; 1 in flight"},
		{phase.Backlog{Waiting: 2500, Unfinished: 2500, Over: 12 * time.Second, Measured: true, LastCount: 4 * time.Second},
			0, false, "not draining over the last 12s"},
		{phase.Backlog{Stuck: 600, Unfinished: 600, PerSecond: -2.5, Over: 80 * time.Second, Measured: true, LastCount: 4 * time.Second},
			0, false, "growing by 2.5 a second over the last 1m20s"},
		{phase.Backlog{Unfinished: 5, PerSecond: 40, Over: 11 * time.Second, Measured: true},
			0, true, "drained 40.0 a second over the last 11s; 5 in flight"},
		{phase.Backlog{PerSecond: 40, Over: 11 * time.Second, Measured: true},
			0, true, "drained 40.0 a second over the last 11s"},
		// Keys in flight rising (a surge, or a killed process's leases)
		// are no backlog growing.
		{phase.Backlog{Unfinished: 6, PerSecond: -0.5, Over: 12 * time.Second, Measured: true},
			0, true, "drained 0.0 a second over the last 12s; 6 in flight"},
		{phase.Backlog{Unfinished: 6}, 0, true, "drain rate unknown: no completer has counted its keys in the last hour; 6 in flight"},
		// No completer counted lately: it says so, and gives no time to
		// empty.
		{phase.Backlog{Stuck: 5, Unfinished: 5, PerSecond: 1, Over: 29 * time.Second, LastCount: 17 * time.Second, Measured: true},
			0, false, "drained 1.0 a second over the last 29s; no completer has counted for 17s"},
		{phase.Backlog{Stuck: 3, Unfinished: 3, LastCount: 3 * time.Second}, 0, false, "drain rate unknown: no completer counted its keys between 10s and 30s ago"},
		{phase.Backlog{Stuck: 3, Unfinished: 3, LastCount: 5 * time.Minute}, 0, false,
			"drain rate unknown: no completer counted its keys between 10s and 30s ago; no completer has counted for 5m0s"},
		// Keys not due yet: the drain ends no sooner than the last comes
		// due, and with none due the rate is not the completer's pace.
		{phase.Backlog{Stuck: 600, Waiting: 45, Unfinished: 645, PerSecond: 10, Over: 12 * time.Second, Measured: true, LastCount: 4 * time.Second, NotDue: 45, FirstDue: 2 * time.Second, LastDue: 48 * time.Second},
			64500 * time.Millisecond, true, "draining 10.0 a second over the last 12s, empty in about 1m5s; 45 come due in 2s to 48s"},
		{phase.Backlog{Stuck: 10, Waiting: 45, Unfinished: 55, PerSecond: 10, Over: 12 * time.Second, Measured: true, LastCount: 4 * time.Second, NotDue: 45, FirstDue: 2 * time.Second, LastDue: 48 * time.Second},
			48 * time.Second, true, "draining 10.0 a second over the last 12s, empty in about 48s; 45 come due in 2s to 48s"},
		{phase.Backlog{Waiting: 45, Unfinished: 75, PerSecond: 0.1, Over: 12 * time.Second, Measured: true, LastCount: 4 * time.Second, NotDue: 45, FirstDue: 1400 * time.Millisecond, LastDue: 48 * time.Second},
			48 * time.Second, true, "none due yet: 45 come due in 1s to 48s; 30 in flight"},
		{phase.Backlog{Stuck: 2, Unfinished: 2, LastCount: 2 * time.Second, NotDue: 2, FirstDue: 20 * time.Minute, LastDue: 20 * time.Minute},
			20 * time.Minute, true, "none due yet: 2 come due in 20m0s"},
		{phase.Backlog{Stuck: 2, Unfinished: 2, LastCount: 2 * time.Minute, NotDue: 2, FirstDue: 20 * time.Minute, LastDue: 20 * time.Minute},
			0, false, "none due yet: 2 come due in 20m0s; no completer has counted for 2m0s"},
		{phase.Backlog{Stuck: 5, Waiting: 1, Unfinished: 6, LastCount: 3 * time.Second, NotDue: 1, FirstDue: 300 * time.Millisecond, LastDue: 300 * time.Millisecond},
			0, false, "drain rate unknown: no completer counted its keys between 10s and 30s ago; 1 come due in 1s"},
	} {
		name := fmt.Sprintf("%+v", c.b)
		if d, ok := c.b.EmptyIn(); d != c.empty || ok != c.ok {
			t.Errorf("%s: empty in %v, %v; want %v, %v", name, d, ok, c.empty, c.ok)
		}
		if got := c.b.Rate(); got != c.rate {
			t.Errorf("%s: rate %q; want %q", name, got, c.rate)
		}
		// JSON carries the fields and EmptyIn, null when not ok.
		data, err := json.Marshal(c.b)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			phase.Backlog
			EmptyIn *time.Duration `json:"empty_in_ns"`
		}
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		if got.Backlog != c.b || (got.EmptyIn != nil) != c.ok || (c.ok && *got.EmptyIn != c.empty) {
			t.Errorf("%s: JSON %s", name, data)
		}
	}
}
