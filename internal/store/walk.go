package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// On a single Postgres no index of the key table names a column that the
// finish changes, so that storing a key's response is a HOT update. The
// completer finds the keys it may have to finish by walking the key table
// in the order of the transactions that created them (created_xid), once
// each, a little behind the newest: the keys still unfinished when the
// walk passes them go into atomicphase_watch, which its claim reads. Every
// other key is finished, or younger than the walk; so the unfinished keys
// are among those of the watch and those the walk has yet to pass
// (unfinishedIDs).
//
// The walk never passes a key whose creating transaction may still
// commit. A transaction's xid is drawn when it first writes, and it may
// commit any time later, after keys of later xids have committed and been
// walked. So the walk goes no further than the bound it recorded on its
// previous step: the oldest transaction then running in this database (or
// prepared in it), or else the first xid not yet drawn; every transaction
// before it that could write a key had ended, so a later statement sees
// its keys, whatever order they committed in. Transactions of the
// cluster's other databases write no key here and hold nothing back; a
// transaction of this one left open does: keys created after it drew its
// xid are walked once it ends.
//
// The bound is the least xid of the step's snapshot that a backend of
// this database holds (pg_stat_activity, read after the snapshot, so a
// transaction running at both times is seen) or a prepared transaction
// of it; one that ended in between is seen by the next step's snapshot.
// A transaction that drew its xid after the snapshot drew one past its
// xmax. The step must run in a transaction of its own, as Claim runs it:
// pg_stat_activity is read once per transaction.
//
// A key table distributed with Citus is not walked (see DistributeSQL):
// there the completer reads the index of unfinished keys, as before.

// walkSQL takes one step of the walk from position $3, with the bound $4
// its previous step recorded: it passes the keys created before the first
// unfinished one younger than $2, at most $1 of them (or every key of one
// transaction, however many), puts those that are unfinished into the
// watch, moves the position past them, and records the bound of the next
// step. A finished key stays finished, so the walk passes young finished
// keys at once: it waits only for keys that may still need the completer,
// and then only for those of the grace, so it keeps up with the keys that
// live requests finish, and reads each about once. Of the keys it read but did not pass, it watches those that are
// unfinished and old enough already, out of order (a key's age is when it
// was created or last run, whichever came first): the step that passes
// them finds them there. It moves the position only if it is still $3:
// of two completers that walk at once, one moves it, and the other's
// step changes nothing but to watch keys the first watched too. It
// returns how many keys it passed, how many of them it watched, and
// whether it reached the bound, or nothing when another step moved the
// position first.
//
// edge is the first transaction the step leaves for the next: that of the
// key after the first $1, or the bound. The step passes the keys before
// it, unless they are all of one transaction, which it then passes whole.
//
// Walk sends it with the position and the bound as constants (the simple
// protocol), so that the planner sees how few keys lie between them: a
// bound read from the table would be unknown to it, and a third of the
// table its guess.
const walkSQL = `
WITH nth AS (
    SELECT coalesce((SELECT k.created_xid FROM idempotency_keys k
                     WHERE k.created_xid >= $3::xid8 AND k.created_xid < $4::xid8
                     ORDER BY k.created_xid OFFSET $1 LIMIT 1), $4::xid8) AS x
), edge AS (
    SELECT CASE WHEN nth.x > $3::xid8 THEN nth.x
                ELSE coalesce((SELECT k.created_xid FROM idempotency_keys k
                               WHERE k.created_xid > $3::xid8 AND k.created_xid < $4::xid8
                               ORDER BY k.created_xid LIMIT 1), $4::xid8) END AS x
    FROM nth
), batch AS (
    SELECT k.id, k.created_xid, k.finished_at, k.last_run_at, k.created_at, k.workflow, k.definition,
           least(k.created_at, k.last_run_at) > now() - $2::interval AS young
    FROM idempotency_keys k
    WHERE k.created_xid >= $3::xid8 AND k.created_xid < $4::xid8 AND k.created_xid < (SELECT x FROM edge)
), stop AS (
    SELECT coalesce((SELECT created_xid FROM batch WHERE young AND finished_at IS NULL ORDER BY created_xid LIMIT 1),
                    (SELECT x FROM edge)) AS x
), watched AS (
    INSERT INTO atomicphase_watch (id, due_at, created_at, workflow, definition)
    SELECT b.id, b.last_run_at, b.created_at, b.workflow, b.definition
    FROM batch b
    WHERE NOT b.young AND b.finished_at IS NULL
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
), next AS (
    SELECT coalesce((
        SELECT x FROM pg_snapshot_xip(pg_current_snapshot()) AS x
        WHERE (x::text::numeric % 4294967296)::text IN (
            SELECT backend_xid::text FROM pg_stat_activity
            WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()
            UNION ALL
            SELECT transaction::text FROM pg_prepared_xacts WHERE database = current_database())
        ORDER BY x LIMIT 1
    ), pg_snapshot_xmax(pg_current_snapshot())) AS x
)
UPDATE atomicphase_walk
SET position = (SELECT x FROM stop), bound = greatest((SELECT x FROM stop), (SELECT x FROM next))
WHERE position = $3::xid8
RETURNING (SELECT count(*) FROM batch WHERE created_xid < (SELECT x FROM stop)),
          (SELECT count(*) FROM watched),
          (SELECT x FROM stop) = $4::xid8`

// walkCursorSQL reads where the walk is.
const walkCursorSQL = `SELECT position::text, bound::text FROM atomicphase_walk`

// WalkStep is what one step of the walk did.
type WalkStep struct {
	// Walked is false when another process moved the walk first.
	Walked bool
	// Passed keys were passed, Watched of them unfinished.
	Passed, Watched int
	// CaughtUp: the step reached the bound, so the next goes no further
	// than the transactions running now.
	CaughtUp bool
}

// The walk's steps: each passes at most walkBatch keys, and a claim takes
// at most walkSteps of them before it reads the watch.
const (
	walkBatch = 5000
	walkSteps = 20
)

// walkGrace is how old a key must be before the walk passes it, for a
// completer whose keys are due once idle for stuckAfter: keys finish
// within it, as a rule, and are never watched. It is stuckAfter when
// shorter, so that no key is due before it can be watched.
func walkGrace(stuckAfter time.Duration) time.Duration {
	return min(stuckAfter, 10*time.Second)
}

// walkUp moves the walk up to the keys younger than grace, or by
// walkSteps steps, whichever comes first. A step that reaches its bound
// records the next, and the step after it can go that far: so the walk
// goes on until a step passes nothing, and, when that step reached its
// bound, one more, with the bound it recorded, does too. When another
// process moved the walk first, the next step goes on from where that one
// left it: a claim that left the rest of the walk to the other would read
// a watch without the keys still ahead of the walk, and, after an outage,
// find none due while thousands are.
func walkUp(ctx context.Context, q Querier, grace time.Duration) error {
	idle := false
	for range walkSteps {
		s, err := Walk(ctx, q, walkBatch, grace)
		if err != nil {
			return err
		}
		if !s.Walked {
			idle = false
			continue
		}
		if s.Passed == 0 && (idle || !s.CaughtUp) {
			return nil
		}
		idle = s.Passed == 0
	}
	return nil
}

// Walk takes one step of the completer's walk of the key table (see
// walkSQL): it passes at most limit keys (or every key of one
// transaction) older than grace, and watches those that are unfinished. A
// step that passed limit keys and did not catch up leaves more to pass.
// It must run outside a transaction: each of its two statements reads in
// a transaction of its own.
func Walk(ctx context.Context, q Querier, limit int, grace time.Duration) (WalkStep, error) {
	var (
		s               WalkStep
		position, bound string
	)
	if err := q.QueryRow(ctx, walkCursorSQL).Scan(&position, &bound); err != nil {
		return s, fmt.Errorf("store: walk: %w", err)
	}
	err := q.QueryRow(ctx, walkSQL, pgx.QueryExecModeSimpleProtocol,
		limit, strconv.FormatFloat(grace.Seconds(), 'f', -1, 64)+" seconds", position, bound).
		Scan(&s.Passed, &s.Watched, &s.CaughtUp)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return s, nil
	case err != nil:
		return s, fmt.Errorf("store: walk: %w", err)
	}
	s.Walked = true
	return s, nil
}

// unwatchSQL drops keys from the watch. A finished key stays finished, so
// its row can go whenever it is seen finished.
const unwatchSQL = `DELETE FROM atomicphase_watch WHERE id = ANY($1::uuid[])`

// Unwatch drops from the watch the keys ids, which the completer has just
// finished: otherwise each row would stay until a claim reached it, a
// lease after the claim that took the key, and a drained backlog would
// leave as many rows as it had keys for later claims to read through
// before any key due then.
func Unwatch(ctx context.Context, q Querier, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	arg := make([][16]byte, len(ids))
	for i, id := range ids {
		arg[i] = id
	}
	if _, err := q.Exec(ctx, unwatchSQL, arg); err != nil {
		return fmt.Errorf("store: unwatch: %w", err)
	}
	return nil
}

// unfinishedIDs is, on a single Postgres, a condition on a key row's id
// that every unfinished key meets: the keys of the watch and those the
// walk has yet to pass, created at or after its position ({position}).
// A statement that reads unfinished keys adds it to read only those, and
// then tests finished_at on each: no index tells them apart.
//
// The ids are gathered first, and the key rows then read by the primary
// key (= ANY of an array), whatever the planner thinks of the table. The
// position is written into the statement, not read by it, so that the
// planner sees how few keys follow it: of an unknown bound it would
// assume a third of the table, and read it all.
const unfinishedIDs = `id = ANY (ARRAY(SELECT id FROM atomicphase_watch
        UNION ALL
        SELECT id FROM idempotency_keys WHERE created_xid >= '{position}'::xid8))`

// abandonedIDs is unfinishedIDs for keys created before now() - $1,
// which reads only that part of the watch.
const abandonedIDs = `id = ANY (ARRAY(SELECT id FROM atomicphase_watch WHERE created_at < now() - $1::interval
        UNION ALL
        SELECT id FROM idempotency_keys
        WHERE created_xid >= '{position}'::xid8 AND created_at < now() - $1::interval))`

// Statements write unfinishedMark for " AND " + unfinishedIDs, and
// abandonedMark for " AND " + abandonedIDs; routed replaces them.
const (
	unfinishedMark = `{unfinished}`
	abandonedMark  = `{unfinished before $1}`
)

// stripped returns sql without its marks: the statement for a key table
// distributed with Citus, whose index of unfinished keys the planner finds
// by the statement's own conditions.
func stripped(sql string) string {
	return strings.NewReplacer(unfinishedMark, "", abandonedMark, "").Replace(sql)
}

// walkPositionSQL reads the walk's position, as decimal text.
const walkPositionSQL = `SELECT position::text FROM atomicphase_walk`

// routed returns sql for the route of the key table q reaches: with its
// marks replaced on a single Postgres, stripped of them on Citus
// (distributed true).
func routed(ctx context.Context, q Querier, sql string, distributed bool) (string, error) {
	if distributed || !strings.Contains(sql, "{unfinished") {
		return stripped(sql), nil
	}
	var position string
	if err := q.QueryRow(ctx, walkPositionSQL).Scan(&position); err != nil {
		return "", fmt.Errorf("read the walk's position: %w", err)
	}
	if _, err := strconv.ParseUint(position, 10, 64); err != nil {
		return "", fmt.Errorf("the walk's position %q is not a transaction id", position)
	}
	at := strings.NewReplacer("{position}", position)
	return strings.NewReplacer(unfinishedMark, " AND "+at.Replace(unfinishedIDs),
		abandonedMark, " AND "+at.Replace(abandonedIDs)).Replace(sql), nil
}

// routedFor is routed for the route q's key table is on.
func routedFor(ctx context.Context, q Querier, sql string) (string, error) {
	distributed, err := IsDistributed(ctx, q)
	if err != nil {
		return "", err
	}
	return routed(ctx, q, sql, distributed)
}
