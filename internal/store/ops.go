package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
    request_params AS params, phase_state AS state, resolution,
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
	if unstorable(tenant, key) {
		return nil, keyrow.ErrNotFound
	}
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

// unstorable reports whether tenant or key holds a NUL byte, which a text
// column cannot: no stored key has one, so an operator asking for such a
// key is told it is not found, not the server's encoding error.
func unstorable(tenant, key string) bool { return strings.ContainsRune(tenant+key, 0) }

const existsSQL = `SELECT EXISTS (SELECT FROM idempotency_keys WHERE tenant = $1 AND idempotency_key = $2)`

// reapCandidatesSQL counts with the predicates reapSQL and expireSQL use.
// It reads a snapshot and locks nothing, so unlike a real run it also
// counts rows that a request happens to hold locked at that moment.
const reapCandidatesSQL = `
SELECT (SELECT count(*) FROM idempotency_keys WHERE ($2 = '' OR workflow = $2) AND ` + reapableWhere + `),
       (SELECT count(*) FROM idempotency_keys WHERE ` + abandonedWhere + abandonedMark + `)`

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
	sql, err := routedFor(ctx, q, reapCandidatesSQL)
	if err != nil {
		return 0, 0, fmt.Errorf("store: reap candidates: %w", err)
	}
	if err := q.QueryRow(ctx, sql, retention, workflow).Scan(&finished, &abandoned); err != nil {
		return 0, 0, fmt.Errorf("store: reap candidates: %w", err)
	}
	return finished, abandoned, nil
}
