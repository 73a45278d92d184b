package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"

	"github.com/atomicphase/atomicphase/keyrow"
)

// keyInfoColumns selects a keyrow.Row, with each column named as pgxscan maps
// the field (snake case) and NULL text turned into the empty string.
const keyInfoColumns = `
    id, tenant, idempotency_key AS key, workflow, definition, recovery_point, coalesce(hold, '') AS hold,
    coalesce(call_pending, '') AS call_pending,
    created_at, last_run_at, finished_at, locked_at, lock_expires_at, attempts, failures,
    coalesce(last_error, '') AS last_error,
    response_status, response_headers AS response_header, response_body,
    request_params AS params, phase_state AS state,
    greatest(lock_expires_at - now(), interval '0') AS lease_left`

// inspectSQL reads one key. Like every statement in this file except
// retrySQL, it is a plain read: it takes no row lock, so it never waits for
// a run and never delays one, and sees the key as last committed.
const inspectSQL = `SELECT ` + keyInfoColumns + `
FROM idempotency_keys
WHERE tenant = $1 AND idempotency_key = $2`

// Inspect returns everything stored about the tenant's key, or
// keyrow.ErrNotFound.
func Inspect(ctx context.Context, q Querier, tenant, key string) (*keyrow.Row, error) {
	var info keyrow.Row
	err := pgxscan.Get(ctx, q, &info, inspectSQL, tenant, key)
	if pgxscan.NotFound(err) {
		return nil, keyrow.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: inspect: %w", err)
	}
	return &info, nil
}

// listStuckSQL is served by the partial index idempotency_keys_unfinished,
// whose predicate stuckWhere implies, in index order, so it reads only the
// oldest runnable keys however many finished keys the table holds.
const listStuckSQL = `SELECT ` + keyInfoColumns + `
FROM idempotency_keys
WHERE ` + stuckWhere + `
ORDER BY last_run_at
LIMIT $2`

// listHeldSQL is served by the partial index idempotency_keys_held on
// (hold, last_run_at), in index order.
const listHeldSQL = `SELECT ` + keyInfoColumns + `
FROM idempotency_keys
WHERE hold = $1
ORDER BY last_run_at
LIMIT $2`

// List returns the keys f selects, those idle longest first.
func List(ctx context.Context, q Querier, f keyrow.ListFilter) ([]keyrow.Row, error) {
	limit := cmp.Or(f.Limit, keyrow.DefaultListLimit)
	if limit < 0 || f.StuckAfter < 0 {
		return nil, errors.New("store: list: Limit and StuckAfter must not be negative")
	}
	var (
		sql  string
		args []any
	)
	switch f.State {
	case keyrow.StateStuck:
		sql, args = listStuckSQL, []any{f.StuckAfter, limit}
	case keyrow.StateUnknown:
		sql, args = listHeldSQL, []any{string(keyrow.HoldUnknown), limit}
	case keyrow.StateDead:
		sql, args = listHeldSQL, []any{string(keyrow.HoldDead), limit}
	default:
		return nil, fmt.Errorf("store: list: state %q cannot be listed; use stuck, unknown or dead", f.State)
	}
	keys := []keyrow.Row{}
	if err := pgxscan.Select(ctx, q, &keys, sql, args...); err != nil {
		return nil, fmt.Errorf("store: list: %w", err)
	}
	return keys, nil
}

// retrySQL clears the hold and the attempt count, so the key is runnable
// with a fresh attempt budget. It waits for the row lock of a concurrent
// writer (a run releasing the key, Bury) and re-checks the hold on the row
// version that writer committed, so it reports ErrNotHeld rather than
// touching a key that stopped being held meanwhile.
//
// last_run_at moves to now because the reaper closes runnable keys idle for
// the whole retention as abandoned: a key that sat dead for days would
// otherwise race the completer to the reaper's next run.
const retrySQL = `
UPDATE idempotency_keys
SET hold = NULL, failures = 0, call_pending = NULL, last_run_at = now()
WHERE tenant = $1 AND idempotency_key = $2 AND hold IS NOT NULL`

const existsSQL = `SELECT EXISTS (SELECT FROM idempotency_keys WHERE tenant = $1 AND idempotency_key = $2)`

// Retry makes a key on hold runnable again, keeping its recovery point,
// state and last error: the next client request resumes it at once, and the
// completer once the key has been idle for its MinIdle. The completer then
// allows the key its full MaxAttempts of failures again.
//
// Retrying a dead key is always safe. Retrying an unknown key is the
// operator's word that the uncertain foreign call did not happen, or may
// happen twice: the resumed run repeats it instead of reconciling it.
//
// Retry leaves a lease alone. It returns ErrNotFound when there is no such
// key and ErrNotHeld when the key is not on hold.
func Retry(ctx context.Context, q Querier, tenant, key string) error {
	tag, err := q.Exec(ctx, retrySQL, tenant, key)
	if err != nil {
		return fmt.Errorf("store: retry: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	// Nothing changed, so this read only chooses the error to report.
	var exists bool
	if err := q.QueryRow(ctx, existsSQL, tenant, key).Scan(&exists); err != nil {
		return fmt.Errorf("store: retry: %w", err)
	}
	if !exists {
		return keyrow.ErrNotFound
	}
	return keyrow.ErrNotHeld
}

// reapCandidatesSQL counts with the predicates reapSQL and expireSQL use.
// It reads a snapshot and locks nothing, so unlike a real run it also
// counts rows that a request happens to hold locked at that moment.
const reapCandidatesSQL = `
SELECT (SELECT count(*) FROM idempotency_keys WHERE ($2 = '' OR workflow = $2) AND ` + reapableWhere + `),
       (SELECT count(*) FROM idempotency_keys WHERE ` + abandonedWhere + `)`

// ReapCandidates reports what a reaper run over workflow's keys (every
// workflow's when it is empty) with this retention would do if it started
// now, changing nothing: how many finished keys it would delete
// (Reap) and how many abandoned keys it would close with a terminal response
// (Expire). A run closes abandoned keys before deleting, and a key it closes
// is deleted only a retention later, so the two numbers do not overlap.
// Retention must be positive, as the reaper's is.
func ReapCandidates(ctx context.Context, q Querier, workflow string, retention time.Duration) (finished, abandoned int, err error) {
	if retention <= 0 {
		return 0, 0, errors.New("store: reap candidates: retention must be positive")
	}
	if err := q.QueryRow(ctx, reapCandidatesSQL, retention, workflow).Scan(&finished, &abandoned); err != nil {
		return 0, 0, fmt.Errorf("store: reap candidates: %w", err)
	}
	return finished, abandoned, nil
}
