package keyrow

import (
	"context"
	"fmt"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
)

// ClaimParams selects the unfinished keys the completer may take.
type ClaimParams struct {
	// Limit caps how many keys one claim takes.
	Limit int
	// MinIdle: a key is due only when its last run is at least this old, so
	// the completer leaves alone requests whose client is likely to retry.
	MinIdle time.Duration
	// Backoff is added per earlier attempt, doubling (capped at MaxBackoff),
	// so a key that keeps failing is retried less and less often.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Unknown includes keys on hold for an unknown outcome, for
	// reconciliation, besides runnable ones.
	Unknown bool
	// TTL is the lease each claimed key gets.
	TTL time.Duration
}

// claimSQL takes the lease on due keys in one statement. FOR UPDATE SKIP
// LOCKED lets any number of completers in any number of processes scan at
// once: each row is locked by at most one of them, the others skip it rather
// than wait, and the lease set here then keeps requests and other completers
// off it for the TTL. The lease condition is re-checked on the locked row, so
// a key a request took between the scan and the lock is not stolen.
//
// The scan is served by idempotency_keys_unfinished (and _held for unknown
// keys), which contain no finished rows.
const claimSQL = `
WITH due AS (
    SELECT id FROM idempotency_keys
    WHERE finished_at IS NULL
      AND (hold IS NULL OR (hold = 'unknown' AND $6))
      -- The first bound alone is what the index can range-scan on; the
      -- second adds the per-key backoff: none after the first run, then
      -- Backoff doubling with each further attempt, capped.
      AND last_run_at <= now() - $2::interval
      AND last_run_at <= now() - $2::interval - CASE WHEN attempts <= 1 THEN interval '0'
          ELSE least($3::interval * (2 ^ least(attempts - 2, 30)), $4::interval) END
      AND (lock_expires_at IS NULL OR lock_expires_at <= now())
    ORDER BY last_run_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE idempotency_keys k
SET locked_at = now(), lock_expires_at = now() + $5::interval, lock_token = gen_random_uuid(),
    last_run_at = now(), attempts = k.attempts + 1
FROM due
WHERE k.id = due.id
RETURNING k.id, k.tenant, k.idempotency_key AS key, k.workflow, k.recovery_point,
          k.phase_state AS state, k.request_params AS params, coalesce(k.hold, '') AS hold,
          k.attempts, k.lock_token, coalesce(k.last_error, '') AS last_error`

// Claim takes the lease on up to p.Limit due keys and returns them with
// their stored request and state, ready to resume.
func Claim(ctx context.Context, q Querier, p ClaimParams) ([]*Row, error) {
	// The statement's column names match Row's fields; the fields it does
	// not return (LeaseLeft, Response) stay zero.
	var rows []*Row
	err := pgxscan.Select(ctx, q, &rows, claimSQL,
		p.Limit, p.MinIdle, p.Backoff, p.MaxBackoff, p.TTL, p.Unknown)
	if err != nil {
		return nil, fmt.Errorf("keyrow: claim: %w", err)
	}
	return rows, nil
}

// burySQL parks runnable keys that used up their attempts as dead, so the
// completer stops spending work on them and operators can see them.
const burySQL = `
UPDATE idempotency_keys
SET hold = 'dead'
WHERE finished_at IS NULL AND hold IS NULL AND attempts >= $1
  AND (lock_expires_at IS NULL OR lock_expires_at <= now())`

// Bury moves every free, runnable key with at least maxAttempts attempts to
// the dead hold and reports how many it moved.
func Bury(ctx context.Context, q Querier, maxAttempts int) (int, error) {
	tag, err := q.Exec(ctx, burySQL, maxAttempts)
	if err != nil {
		return 0, fmt.Errorf("keyrow: bury: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// reapableWhere selects the finished keys whose retention ($1) is over.
// reapSQL deletes them and ReapCandidates counts them, so a dry run reports
// what a run deletes.
const reapableWhere = `finished_at < now() - $1::interval`

// reapSQL deletes one batch of finished keys older than the retention.
// SKIP LOCKED keeps it from waiting on, or blocking, a request that is
// replaying one of them; a small LIMIT keeps each transaction short.
const reapSQL = `
DELETE FROM idempotency_keys
WHERE id IN (
    SELECT id FROM idempotency_keys
    WHERE ` + reapableWhere + `
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)`

// Reap deletes up to limit finished keys whose response was stored more than
// retention ago and reports how many it deleted. Unfinished keys, in flight
// or on hold, are never deleted.
func Reap(ctx context.Context, q Querier, retention time.Duration, limit int) (int, error) {
	tag, err := q.Exec(ctx, reapSQL, retention, limit)
	if err != nil {
		return 0, fmt.Errorf("keyrow: reap: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// abandonedWhere selects the keys abandoned before finishing: dead, or
// runnable and idle for the whole retention ($1), with no live lease.
// expireSQL closes them and ReapCandidates counts them.
const abandonedWhere = `finished_at IS NULL
      AND (hold = 'dead' OR hold IS NULL)
      AND last_run_at < now() - $1::interval
      AND (lock_expires_at IS NULL OR lock_expires_at <= now())`

// expireSQL gives abandoned keys (dead, or runnable but untouched for the
// whole retention) a terminal response, so a client retrying after the
// retention gets an answer instead of a fresh run, and the reaper then
// removes them like any finished key. Keys awaiting reconciliation are left
// alone: their outcome is not known.
const expireSQL = `
UPDATE idempotency_keys
SET recovery_point = 'finished', finished_at = now(), hold = NULL,
    response_status = 500, response_headers = '{"Content-Type":["application/problem+json"]}',
    response_body = convert_to(json_build_object(
        'type', 'urn:atomicphase:problem:request-abandoned',
        'title', 'Request abandoned',
        'status', 500,
        'detail', 'processing of this request stopped before it finished and will not be retried; send a new request with a new Idempotency-Key'
    )::text || E'\n', 'UTF8')
WHERE id IN (
    SELECT id FROM idempotency_keys
    WHERE ` + abandonedWhere + `
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)`

// Expire stores a terminal "abandoned" response on up to limit keys that
// were abandoned before finishing (dead, or never touched for retention)
// and reports how many it changed.
func Expire(ctx context.Context, q Querier, retention time.Duration, limit int) (int, error) {
	tag, err := q.Exec(ctx, expireSQL, retention, limit)
	if err != nil {
		return 0, fmt.Errorf("keyrow: expire: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Counts summarises the keys table for gauges and operators.
type Counts struct {
	// Finished keys hold a stored response.
	Finished int `json:"finished"`
	// InFlight keys are unfinished and held by a live lease.
	InFlight int `json:"in_flight"`
	// Stuck keys are unfinished, runnable, unleased and idle for longer
	// than the threshold given to Count: the completer's backlog.
	Stuck int `json:"stuck"`
	// Unknown keys await reconciliation of a foreign call.
	Unknown int `json:"unknown"`
	// Dead keys were given up on and wait for an operator.
	Dead int `json:"dead"`
}

// stuckWhere selects the completer's backlog: unfinished, runnable keys
// with no live lease, idle for longer than $1. Count counts them and List
// lists them, so the two agree; it implies the predicate of the partial
// index idempotency_keys_unfinished.
const stuckWhere = `finished_at IS NULL AND hold IS NULL
    AND (lock_expires_at IS NULL OR lock_expires_at <= now())
    AND last_run_at < now() - $1::interval`

const countSQL = `
SELECT count(*) FILTER (WHERE finished_at IS NOT NULL),
       count(*) FILTER (WHERE finished_at IS NULL AND lock_expires_at > now()),
       count(*) FILTER (WHERE ` + stuckWhere + `),
       count(*) FILTER (WHERE hold = 'unknown'),
       count(*) FILTER (WHERE hold = 'dead')
FROM idempotency_keys`

// Count returns the Counts of the keys table; a key counts as stuck once
// idle for stuckAfter.
func Count(ctx context.Context, q Querier, stuckAfter time.Duration) (Counts, error) {
	var c Counts
	err := q.QueryRow(ctx, countSQL, stuckAfter).Scan(&c.Finished, &c.InFlight, &c.Stuck, &c.Unknown, &c.Dead)
	if err != nil {
		return c, fmt.Errorf("keyrow: count: %w", err)
	}
	return c, nil
}
