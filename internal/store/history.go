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
	distributed, err := IsDistributed(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("store: record history: %w", err)
	}
	sql := recordHistoryDistributedSQL
	if !distributed {
		sql, err = routed(ctx, q, recordHistorySQL, false)
	}
	if err != nil {
		return 0, fmt.Errorf("store: record history: %w", err)
	}
	tag, err := q.Exec(ctx, sql, stuckAfter, workflows)
	if err != nil {
		return 0, fmt.Errorf("store: record history: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// trimHistorySQL deletes the minutes past retention, a range of the
// primary key's first column.
const trimHistorySQL = `DELETE FROM atomicphase_status_history WHERE minute < now() - $1::interval`

// TrimHistory deletes the status history older than HistoryRetention and
// returns how many rows it deleted.
func TrimHistory(ctx context.Context, q Querier) (int, error) {
	tag, err := q.Exec(ctx, trimHistorySQL, HistoryRetention)
	if err != nil {
		return 0, fmt.Errorf("store: trim history: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// StatusMinute is the unfinished keys of one workflow by status at one
// minute, as recorded; Finished is always zero.
type StatusMinute struct {
	At       time.Time
	Workflow string
	keyrow.Counts
}

// historySQL reads the minutes recorded since $1 ago, a range of the
// primary key, each row with the time now, by the database's clock that
// recorded them.
const historySQL = `
SELECT minute, workflow, status, keys, now() FROM atomicphase_status_history
WHERE minute >= date_trunc('minute', now()) - $1::interval
ORDER BY minute, workflow`

// History returns the minutes recorded in the last window, oldest first,
// one StatusMinute per workflow and minute recorded, and the database's
// time now (zero when none was recorded).
func History(ctx context.Context, q Querier, window time.Duration) ([]StatusMinute, time.Time, error) {
	rows, err := q.Query(ctx, historySQL, window)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("store: history: %w", err)
	}
	var (
		out      []StatusMinute
		at, now  time.Time
		workflow string
		status   keyrow.Status
		keys     int
	)
	_, err = pgx.ForEachRow(rows, []any{&at, &workflow, &status, &keys, &now}, func() error {
		if n := len(out); n == 0 || !out[n-1].At.Equal(at) || out[n-1].Workflow != workflow {
			out = append(out, StatusMinute{At: at, Workflow: workflow})
		}
		out[len(out)-1].Counts.Set(status, keys)
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("store: history: %w", err)
	}
	return out, now, nil
}
