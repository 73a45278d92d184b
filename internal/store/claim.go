package store

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5"
)

// ClaimParams selects the unfinished keys the completer may take.
type ClaimParams struct {
	// Workflows and Definitions, pairwise, are the workflow definitions the
	// claiming process can run; keys of any other workflow or definition
	// are left alone, for a process that knows them. Nil Definitions means
	// the empty definition, of keys stored before definitions were
	// recorded, for every workflow.
	Workflows   []string
	Definitions []string
	// Limit caps how many keys one claim takes.
	Limit int
	// StuckAfter: a key is due only when its last run is at least this old, so
	// the completer leaves alone requests whose client is likely to retry.
	StuckAfter time.Duration
	// Backoff is added per earlier failure of the completer on the key,
	// doubling (capped at MaxBackoff), so a key that keeps failing is
	// retried less and less often.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// TTL is the lease each claimed key gets.
	TTL time.Duration
	// MaxAttempts: a runnable key the completer failed this many times
	// is not claimed but left for Bury, which the completer runs less
	// often than it claims. Zero means no limit.
	MaxAttempts int
	// Distributed: the key table is distributed with Citus (see
	// Request.Distributed).
	Distributed bool
	// Unanswered, when set, is told the error of a scan for due keys over
	// every shard of a distributed key table that a node did not answer:
	// the claim goes on with the keys of the shards that did.
	Unanswered func(error)
}

// claimSQL takes the lease on due keys in one statement. FOR NO KEY UPDATE
// SKIP LOCKED lets any number of completers in any number of processes scan
// at once: each row is locked by at most one of them, the others skip it
// rather than wait, and the lease set here then keeps requests and other
// completers off it for the TTL. The lease condition is re-checked on the
// locked row, so a key a request took between the scan and the lock is not
// stolen.
//
// NO KEY UPDATE is the lock the UPDATE takes anyway (it changes no key
// column). FOR UPDATE would also conflict with the KEY SHARE lock that a
// foreign key to the row takes: a holder stalled inside a phase that
// inserted a row referencing its key would hide the key from every
// completer, even after its lease ran out, for as long as its transaction
// stays open.
//
// The keys come from the watch (see walkSQL), in order of when each is
// next due: a claim reads the first $9 whose due time has come (cand),
// locked SKIP LOCKED so that two completers read different ones, and
// judges each by its key row. A key that finished, or is gone, leaves the
// watch (dropped). Of the due keys it takes the longest idle first, at
// most $1, keys on hold for an unknown outcome (claimed for
// reconciliation) and runnable ones alike, but not runnable keys out of
// attempts, which are left for Bury: so a key handed back (one that waits
// for an operator) has its last run set to now, and goes behind every
// other due key. Each key it read and did not take because it is not due
// moves in the watch to when it is next due by its lease, its last run
// and its backoff (moved), or, dead or out of attempts, to a later look;
// each key it takes, to when its lease ends. A due key it did not take
// (beyond $1, or locked) stays where it is, for the next claim. So a claim
// reads about as many keys as it takes, however long the backlog, and
// never a finished key but once.
//
// A claim leaves the key's last run as it was: it is no sign of a client
// that may retry, which StuckAfter waits for. So a key whose claimed run
// died with its process is due again when its lease runs out, not
// StuckAfter later; a run that ends unfinished sets the last run as it
// frees the lease (releaseSQL). Each candidate's key row is read by the
// primary key: OFFSET 0 keeps the planner from joining the few candidates
// to a scan of the whole key table, which it may find cheaper while the
// table is small and its statistics old.
var claimSQL = `
WITH cand AS (
    SELECT w.id FROM atomicphase_watch w
    WHERE w.due_at <= now()
      AND (w.workflow, w.definition) IN (SELECT * FROM unnest($6::text[], $7::text[]))
    ORDER BY w.due_at
    LIMIT $9
    FOR UPDATE SKIP LOCKED
), seen AS (
    SELECT c.id, k.id IS NULL OR k.finished_at IS NOT NULL AS gone,
           CASE WHEN k.hold = 'dead' OR (k.hold IS NULL AND k.failures >= $8) THEN now() + $10::interval
                ELSE greatest(k.lock_expires_at, k.last_run_at + $2::interval + ` + backoff + `) END AS next_due
    FROM cand c LEFT JOIN LATERAL (
        SELECT id, finished_at, hold, failures, lock_expires_at, last_run_at FROM idempotency_keys
        WHERE id = c.id
        OFFSET 0
    ) AS k ON true
), dropped AS (
    DELETE FROM atomicphase_watch w USING seen s WHERE w.id = s.id AND s.gone
), due AS (
    SELECT k.id, k.last_run_at FROM idempotency_keys k JOIN seen s ON s.id = k.id
    WHERE NOT s.gone AND ` + dueWhere + `
      AND (k.hold = 'unknown' OR (k.hold IS NULL AND k.failures < $8))
    ORDER BY k.last_run_at
    LIMIT $1
    FOR NO KEY UPDATE OF k SKIP LOCKED
), moved AS (
    UPDATE atomicphase_watch w
    SET due_at = CASE WHEN d.id IS NOT NULL THEN now() + $5::interval ELSE s.next_due END
    FROM seen s LEFT JOIN due d ON d.id = s.id
    WHERE w.id = s.id AND NOT s.gone AND (d.id IS NOT NULL OR s.next_due > now())
)
UPDATE idempotency_keys k
SET locked_at = now(), lock_expires_at = now() + $5::interval, lock_token = gen_random_uuid(),
    attempts = k.attempts + 1
FROM due
WHERE k.id = due.id
RETURNING ` + claimedColumns

// backoff is the completer's backoff of a key in claimSQL and dueWhere.
var backoff = backoffBy("$3", "$4")

// backoffBy is the completer's backoff of a key, by its failures: none
// before its first, then first doubling with each further one, capped at
// most (the parameters that hold them).
func backoffBy(first, most string) string {
	return `CASE WHEN failures = 0 THEN interval '0'
          ELSE least(` + first + `::interval * (2 ^ least(failures - 1, 30)), ` + most + `::interval) END`
}

// laterLook is how long a claim leaves a key that is dead, or out of
// attempts and waiting for Bury, before it looks at it again: it is not
// due until an operator revives it, and a revival moves it in the watch.
const laterLook = 10 * time.Minute

// candidates is how many keys of the watch one claim statement reads for
// limit: twice as many, so that keys not due or finished among them leave
// room for the due ones.
func candidates(limit int) int {
	return 2*limit + 8
}

// claimedColumns are the columns a claim returns, named after Row's fields.
const claimedColumns = `k.id, k.tenant, k.idempotency_key AS key, k.workflow, k.recovery_point,
          k.phase_state AS state, k.request_params AS params, k.request_fingerprint AS fingerprint,
          coalesce(k.hold, '') AS hold, k.definition, coalesce(k.call_pending, '') AS call_pending,
          k.attempts, k.lock_token, coalesce(k.last_error, '') AS last_error`

// dueWhere selects the keys due for the completer, with $2 its idle
// threshold, $3 and $4 its backoff and the backoff's cap. The first bound on
// last_run_at alone is what the index can range-scan on; the second adds the
// per-key backoff: none before the completer's first failure, then Backoff
// doubling with each further one, capped.
var dueWhere = `finished_at IS NULL
      AND (hold IS NULL OR hold = 'unknown')
      AND last_run_at <= now() - $2::interval
      AND last_run_at <= now() - $2::interval - ` + backoff + `
      AND (lock_expires_at IS NULL OR lock_expires_at <= now())`

// Claim takes the lease on up to p.Limit due keys of p.Workflows and returns
// them with their stored request and state, ready to resume.
func Claim(ctx context.Context, q Querier, p ClaimParams) ([]*Row, error) {
	if len(p.Workflows) == 0 {
		return nil, nil
	}
	if p.Distributed {
		return claimDistributed(ctx, q, p)
	}
	if err := walkUp(ctx, q, walkGrace(p.StuckAfter)); err != nil {
		return nil, fmt.Errorf("store: claim: %w", err)
	}
	// A statement that takes fewer keys than the limit may have spent its
	// candidates on keys that finished meanwhile, or are not due: it moved
	// them out of the way, and the next statement reads the keys behind
	// them. Claim goes on while the due part of the watch shrinks.
	definitions := definitionsFor(p.Workflows, p.Definitions)
	var (
		claimed []*Row
		left    = -1
	)
	for range claimStatements {
		// The statement's column names match Row's fields; the fields it
		// does not return (LeaseLeft, Response, TakenAt) stay zero.
		var rows []*Row
		sent := time.Now()
		limit := p.Limit - len(claimed)
		err := pgxscan.Select(ctx, q, &rows, claimSQL,
			limit, p.StuckAfter, p.Backoff, p.MaxBackoff, p.TTL, p.Workflows, definitions,
			p.attemptsLeft(), candidates(limit), laterLook)
		if err != nil {
			return nil, fmt.Errorf("store: claim: %w", err)
		}
		for _, r := range rows {
			r.TakenAt = sent
		}
		claimed = append(claimed, rows...)
		if len(claimed) >= p.Limit {
			break
		}
		var now int
		if err := q.QueryRow(ctx, dueLeftSQL, p.Workflows, definitions, candidates(p.Limit)).Scan(&now); err != nil {
			return nil, fmt.Errorf("store: claim: %w", err)
		}
		if now == 0 || (left >= 0 && now >= left && len(rows) == 0) {
			break
		}
		left = now
	}
	return claimed, nil
}

// claimStatements caps the statements of one Claim.
const claimStatements = 8

// dueLeftSQL counts the keys of the watch due for the workflows ($1, $2),
// up to $3.
const dueLeftSQL = `
SELECT count(*) FROM (
    SELECT FROM atomicphase_watch
    WHERE due_at <= now() AND (workflow, definition) IN (SELECT * FROM unnest($1::text[], $2::text[]))
    LIMIT $3
) AS due`

// attemptsLeft is the failures below which a runnable key is claimed.
func (p ClaimParams) attemptsLeft() int {
	if p.MaxAttempts <= 0 {
		return math.MaxInt32
	}
	return p.MaxAttempts
}

// definitionsFor returns definitions, or the empty definition for each of
// workflows when definitions is nil.
func definitionsFor(workflows, definitions []string) []string {
	if definitions == nil {
		return make([]string, len(workflows))
	}
	return definitions
}

// burySQL parks keys the completer gave up on as dead. A key is buried only
// when it is abandoned: free, runnable, idle for at least the completer's
// idle threshold ($3), so no client is retrying it, and failed by the
// completer itself maxFailures times since it last made progress. A client
// that keeps retrying a key while a provider is down never gets it buried.
// Only keys of workflow definitions the process knows ($2, $4) are judged.
const burySQL = `
UPDATE idempotency_keys
SET hold = 'dead'
WHERE finished_at IS NULL AND hold IS NULL AND failures >= $1
  AND (workflow, definition) IN (SELECT * FROM unnest($2::text[], $4::text[]))
  AND last_run_at <= now() - $3::interval
  AND (lock_expires_at IS NULL OR lock_expires_at <= now()){unfinished}`

// Bury moves every abandoned key of workflows that the completer failed
// maxFailures times to the dead hold, and reports how many it moved.
// Workflows and definitions are paired as in ClaimParams.
func Bury(ctx context.Context, q Querier, workflows, definitions []string, maxFailures int, minIdle time.Duration) (int, error) {
	if len(workflows) == 0 {
		return 0, nil
	}
	sql, err := routedFor(ctx, q, burySQL)
	if err != nil {
		return 0, fmt.Errorf("store: bury: %w", err)
	}
	tag, err := q.Exec(ctx, sql, maxFailures, workflows, minIdle, definitionsFor(workflows, definitions))
	if err != nil {
		return 0, fmt.Errorf("store: bury: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// reapableWhere selects the finished keys whose retention is over: both the retention the key recorded when it was created (keys
// written before retentions were recorded have none) and the reaper's own
// ($1). A key is thus never deleted before the retention it was created
// with, whichever process reaps it. reapSQL deletes them and ReapCandidates
// counts them, so a dry run reports what a run deletes.
const reapableWhere = `created_at < now() - $1::interval
      AND finished_at < now() - $1::interval
      AND finished_at < now() - coalesce(retain_for, $1::interval)`

// reapSQL deletes one batch of finished keys of one workflow past their
// retention. The index idempotency_keys_by_workflow serves it in order,
// from the workflow's oldest key up to the reaper's retention (a key
// finishes after it is created), so a batch reads only that workflow's
// keys, never those of workflows kept longer. Keys in that range that are
// not yet reapable (unfinished, finished late, or kept longer by the
// retention they recorded) are read again by each batch: few, as most
// keys finish within seconds of being created. SKIP LOCKED keeps it from waiting on, or blocking, a request that
// is replaying one of them; a small LIMIT keeps each transaction short.
const reapSQL = `
DELETE FROM idempotency_keys
WHERE id IN (
    SELECT id FROM idempotency_keys
    WHERE workflow = $2 AND ` + reapableWhere + `
    ORDER BY created_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)`

// Reap deletes up to limit finished keys of workflow whose response was
// stored more than retention ago, and more than the retention the key
// recorded, and reports how many it deleted. Unfinished keys, in flight or
// on hold, are never deleted.
//
// On a distributed key table (distributed true) it proposes keys with an
// unlocked scan and deletes those still past their retention.
func Reap(ctx context.Context, q Querier, workflow string, retention time.Duration, limit int, distributed bool) (int, error) {
	if distributed {
		return changeProposed(ctx, q, "reap", reapCandidatesDistributedSQL, reapDistributedSQL, retention, workflow, limit)
	}
	tag, err := q.Exec(ctx, reapSQL, retention, workflow, limit)
	if err != nil {
		return 0, fmt.Errorf("store: reap: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// finishedWorkflowsSQL lists the workflows that have keys, reading one
// index entry per workflow (a loose index scan over
// idempotency_keys_by_workflow) however many keys each has. A workflow
// whose keys are all unfinished is listed too; the reaper finds nothing to
// delete there.
const finishedWorkflowsSQL = `
WITH RECURSIVE w AS (
    (SELECT workflow FROM idempotency_keys ORDER BY workflow LIMIT 1)
    UNION ALL
    SELECT (SELECT k.workflow FROM idempotency_keys k
            WHERE k.workflow > w.workflow
            ORDER BY k.workflow LIMIT 1)
    FROM w WHERE w.workflow IS NOT NULL
)
SELECT workflow FROM w WHERE workflow IS NOT NULL`

// FinishedWorkflows returns the names of the workflows that have keys, for
// a reaper that judges every workflow's keys.
func FinishedWorkflows(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, finishedWorkflowsSQL)
	if err != nil {
		return nil, fmt.Errorf("store: finished workflows: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: finished workflows: %w", err)
	}
	return names, nil
}

// abandonedWhere selects the keys of workflow $2 (every workflow when $2
// is empty) abandoned before finishing: dead, or runnable and idle for the
// whole retention, the reaper's ($1) and the one the key recorded, with no
// live lease. expireSQL closes them and ReapCandidates counts them.
const abandonedWhere = `finished_at IS NULL
      AND ($2 = '' OR workflow = $2)
      AND (hold = 'dead' OR hold IS NULL)
      AND last_run_at < now() - $1::interval
      AND last_run_at < now() - coalesce(retain_for, $1::interval)
      AND (lock_expires_at IS NULL OR lock_expires_at <= now())`

// expireSQL gives abandoned keys (dead, or runnable but untouched for the
// whole retention) a terminal response, so a client retrying after the
// retention gets an answer instead of a fresh run, and the reaper then
// removes them like any finished key. Keys awaiting reconciliation are left
// alone: their outcome is not known. It clears the expired lease with the
// rest, so that no holder's token matches a finished key. Rows are locked
// FOR NO KEY UPDATE, as claimSQL locks them, so a transaction referencing a
// key does not hide it.
const expireSQL = `
UPDATE idempotency_keys
SET ` + expireSet + `
WHERE id IN (
    SELECT id FROM idempotency_keys
    WHERE ` + abandonedWhere + abandonedMark + `
    LIMIT $3
    FOR NO KEY UPDATE SKIP LOCKED
)`

// expireSet closes an abandoned key with its terminal response.
const expireSet = `recovery_point = 'finished', finished_at = now(), hold = NULL,
    locked_at = NULL, lock_expires_at = NULL, lock_token = NULL,
    response_status = 500, response_headers = '{"Content-Type":["application/problem+json"]}',
    response_body = convert_to(json_build_object(
        'type', 'urn:atomicphase:problem:request-abandoned',
        'title', 'Request abandoned',
        'status', 500,
        'detail', 'processing of this request stopped before it finished and will not be retried; send a new request with a new Idempotency-Key'
    )::text || E'\n', 'UTF8')`

// Expire stores a terminal "abandoned" response on up to limit keys of
// workflow (of every workflow when it is empty) that were abandoned before
// finishing (dead, or never touched for retention, and for the retention
// the key recorded) and reports how many it changed.
//
// On a distributed key table (distributed true) it proposes keys with an
// unlocked scan and closes those still abandoned.
func Expire(ctx context.Context, q Querier, workflow string, retention time.Duration, limit int, distributed bool) (int, error) {
	if distributed {
		return changeProposed(ctx, q, "expire", expireCandidatesDistributedSQL, expireDistributedSQL, retention, workflow, limit)
	}
	sql, err := routed(ctx, q, expireSQL, false)
	if err != nil {
		return 0, fmt.Errorf("store: expire: %w", err)
	}
	tag, err := q.Exec(ctx, sql, retention, workflow, limit)
	if err != nil {
		return 0, fmt.Errorf("store: expire: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
