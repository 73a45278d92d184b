package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/keyrow"
)

// HistoryRetention is how long the status history keeps a minute's counts
// before the reaper deletes them.
const HistoryRetention = 24 * time.Hour

// recordHistorySQL records the current minute's unfinished keys of each
// workflow by status: the counts of countUnfinishedSQL, which reads the
// unfinished keys only, one row per workflow and
// status, with a zero row set for each workflow $2 names (the recording
// process's) so that a workflow drained to no unfinished keys draws as
// zero rather than as a minute nobody recorded. ON CONFLICT DO NOTHING
// keeps the first row set of the minute: the completers of several
// processes record the same counts, and the later ones change nothing.
var recordHistorySQL = recordHistoryOf(countUnfinishedSQL)

// recordHistoryDistributedSQL is recordHistorySQL on Citus, of the counts
// of countUnfinishedDistributedSQL.
var recordHistoryDistributedSQL = recordHistoryOf(countUnfinishedDistributedSQL)

// recordHistoryOf is the statement that records the counts of count.
func recordHistoryOf(count string) string {
	return `
INSERT INTO atomicphase_status_history (minute, workflow, status, keys)
SELECT date_trunc('minute', now()), c.workflow, s.status, sum(s.keys)::int
FROM (` + count + `
      UNION ALL
      SELECT w, 0, 0, 0, 0, 0, 0 FROM unnest($2::text[]) AS w) AS c
CROSS JOIN LATERAL (VALUES ('in_flight', c.in_flight), ('waiting', c.waiting), ('stuck', c.stuck),
                           ('unknown', c.unknown), ('dead', c.dead)) AS s(status, keys)
GROUP BY c.workflow, s.status
ON CONFLICT DO NOTHING`
}

// RecordHistory records the current minute's unfinished keys of each
// workflow by status, a key counting as stuck once idle for stuckAfter,
// and returns the rows written: none when another process recorded the
// minute first. (On a key table distributed with Citus, a statement sent
// through the coordinator counts the rows it sent, kept or not.) The
// workflows given are recorded even with no unfinished key.
func RecordHistory(ctx context.Context, q Querier, workflows []string, stuckAfter time.Duration) (int, error) {
	workflows = slices.Compact(slices.Sorted(slices.Values(workflows)))
	n, err := record(ctx, q, recordHistorySQL, recordHistoryDistributedSQL, stuckAfter, workflows)
	if err != nil {
		return 0, fmt.Errorf("store: record history: %w", err)
	}
	return n, nil
}

// record runs plain, routed, on a single Postgres and distributed on a key
// table distributed with Citus, and returns the rows it wrote.
func record(ctx context.Context, q Querier, plain, distributed string, args ...any) (int, error) {
	onCitus, err := IsDistributed(ctx, q)
	if err != nil {
		return 0, err
	}
	sql := distributed
	if !onCitus {
		if sql, err = routed(ctx, q, plain, false); err != nil {
			return 0, err
		}
	}
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// trimHistorySQL deletes the minutes past retention, a range of the
// primary key's first column.
const trimHistorySQL = `DELETE FROM atomicphase_status_history WHERE minute < now() - $1::interval`

// trimSamplesSQL deletes the samples past retention, a range of the
// primary key.
const trimSamplesSQL = `DELETE FROM atomicphase_backlog_samples WHERE slot < now() - $1::interval`

// TrimHistory deletes the status history older than HistoryRetention and
// returns how many rows it deleted.
func TrimHistory(ctx context.Context, q Querier) (int, error) {
	tag, err := q.Exec(ctx, trimHistorySQL, HistoryRetention)
	if err != nil {
		return 0, fmt.Errorf("store: trim history: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// TrimSamples deletes the backlog's samples older than SampleRetention and
// returns how many rows it deleted.
func TrimSamples(ctx context.Context, q Querier) (int, error) {
	tag, err := q.Exec(ctx, trimSamplesSQL, SampleRetention)
	if err != nil {
		return 0, fmt.Errorf("store: trim the backlog's counts: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// SampleEvery is how often the completers count their keys for the
// backlog's drain rate: each counts once in each slot of this length, by
// the process's clock, and the first count of a slot of the database's
// clock is kept (recordSampleSQL's slots are of the same five seconds).
const SampleEvery = 5 * time.Second

// SampleRetention is how long the backlog's samples are kept before the
// reaper deletes them.
const SampleRetention = time.Hour

// recordSampleSQL counts the completer's keys, the unfinished keys not on
// hold (countUnfinishedSQL's in flight, waiting and stuck, added up), into
// the current five seconds' slot with the time of the count. It reads the
// unfinished keys only, and none when another process counted the slot
// already: the uncorrelated NOT EXISTS is a one-time filter, checked before
// the scan, and a count of no key then conflicts with the slot's row. ON
// CONFLICT DO NOTHING keeps the slot's first count: the completers of
// several processes count the same keys, and the later ones change
// nothing. On a key table distributed with Citus it runs stripped of its
// mark, the samples a reference table.
const recordSampleSQL = `
INSERT INTO atomicphase_backlog_samples (slot, at, keys)
SELECT to_timestamp(floor(extract(epoch FROM now()) / 5) * 5), now(), count(*)::int
FROM idempotency_keys
WHERE finished_at IS NULL AND hold IS NULL{unfinished}
  AND NOT EXISTS (SELECT FROM atomicphase_backlog_samples WHERE slot = to_timestamp(floor(extract(epoch FROM now()) / 5) * 5))
ON CONFLICT DO NOTHING`

// RecordSample counts the unfinished keys not on hold into the current
// slot and returns the rows written: none when another process counted
// the slot first. (On a key table distributed with Citus, a statement
// sent through the coordinator counts the rows it sent, kept or not.)
func RecordSample(ctx context.Context, q Querier) (int, error) {
	n, err := record(ctx, q, recordSampleSQL, stripped(recordSampleSQL))
	if err != nil {
		return 0, fmt.Errorf("store: count the backlog: %w", err)
	}
	return n, nil
}

// Sample is the completer's keys, unfinished and not on hold, as counted
// at At.
type Sample struct {
	At   time.Time
	Keys int
}

// sampleSQL reads the newest sample taken at least $1 before now and no
// more than $2 before it, if any, the time of the newest sample of all,
// and the time now: the primary key read backwards from the newest slot,
// a few rows.
const sampleSQL = `
SELECT now(), s.at, s.keys, (SELECT at FROM atomicphase_backlog_samples ORDER BY slot DESC LIMIT 1)
FROM (SELECT) AS n
LEFT JOIN LATERAL (
    SELECT at, keys FROM atomicphase_backlog_samples
    WHERE at <= now() - $1::interval AND slot >= now() - $2::interval
    ORDER BY slot DESC
    LIMIT 1
) AS s ON true`

// Samples is what LatestSample read, by the database's clock.
type Samples struct {
	// From is the newest sample at least the span old and within the
	// window; nil when there is none.
	From *Sample
	// Newest is when the newest sample of all was taken; zero when there
	// is none.
	Newest time.Time
	Now    time.Time
}

// LatestSample returns the newest sample taken at least span before now
// and within window of it, and when the newest of all was taken.
func LatestSample(ctx context.Context, q Querier, span, window time.Duration) (Samples, error) {
	var (
		r      Samples
		at     *time.Time
		keys   *int
		newest *time.Time
	)
	if err := q.QueryRow(ctx, sampleSQL, span, window).Scan(&r.Now, &at, &keys, &newest); err != nil {
		return Samples{}, fmt.Errorf("store: read the backlog's samples: %w", err)
	}
	if at != nil {
		r.From = &Sample{At: *at, Keys: *keys}
	}
	if newest != nil {
		r.Newest = *newest
	}
	return r, nil
}

// StatusMinute is the unfinished keys of one workflow by status at one
// minute, as recorded; Finished is always zero.
type StatusMinute struct {
	At       time.Time
	Workflow string
	keyrow.Counts
}

// historySQL reads the minutes recorded since $1 ago, a range of the
// primary key.
const historySQL = `
SELECT minute, workflow, status, keys FROM atomicphase_status_history
WHERE minute >= date_trunc('minute', now()) - $1::interval
ORDER BY minute, workflow`

// History returns the minutes recorded in the last window, oldest first,
// one StatusMinute per workflow and minute recorded.
func History(ctx context.Context, q Querier, window time.Duration) ([]StatusMinute, error) {
	rows, err := q.Query(ctx, historySQL, window)
	if err != nil {
		return nil, fmt.Errorf("store: history: %w", err)
	}
	var (
		out      []StatusMinute
		at       time.Time
		workflow string
		status   keyrow.Status
		keys     int
	)
	_, err = pgx.ForEachRow(rows, []any{&at, &workflow, &status, &keys}, func() error {
		if n := len(out); n == 0 || !out[n-1].At.Equal(at) || out[n-1].Workflow != workflow {
			out = append(out, StatusMinute{At: at, Workflow: workflow})
		}
		out[len(out)-1].Counts.Set(status, keys)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: history: %w", err)
	}
	return out, nil
}

// notDueSQL counts the free runnable keys a completer does not take yet,
// by its idle threshold ($1) and backoff ($2 doubling, capped at $3), as
// claimSQL judges them, and how long until the first and the last of them
// come due. Like the counts, it reads the unfinished keys alone.
var notDueSQL = `
SELECT count(*), coalesce(min(due), interval '0'), coalesce(max(due), interval '0')
FROM (
    SELECT last_run_at + $1::interval + ` + backoffBy("$2", "$3") + ` - now() AS due
    FROM idempotency_keys
    WHERE finished_at IS NULL AND hold IS NULL
      AND (lock_expires_at IS NULL OR lock_expires_at <= now()){unfinished}
) AS free
WHERE due > interval '0'`

// NotDue is the free runnable keys a completer with the given idle
// threshold and backoff does not take yet.
type NotDue struct {
	Keys int
	// First and Last are how long until the first and the last of them
	// comes due; zero when Keys is.
	First, Last time.Duration
}

// CountNotDue returns the free runnable keys that a completer with idle
// threshold stuckAfter and the given backoff would not take yet.
func CountNotDue(ctx context.Context, q Querier, stuckAfter, backoff, maxBackoff time.Duration) (NotDue, error) {
	sql, err := routedFor(ctx, q, notDueSQL)
	if err != nil {
		return NotDue{}, fmt.Errorf("store: count the keys not due: %w", err)
	}
	var n NotDue
	if err := q.QueryRow(ctx, sql, stuckAfter, backoff, maxBackoff).Scan(&n.Keys, &n.First, &n.Last); err != nil {
		return NotDue{}, fmt.Errorf("store: count the keys not due: %w", err)
	}
	return n, nil
}
