package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// On a key table distributed with Citus (atomicphase.Distribute), every
// statement about one key names its tenant, the distribution column, so
// that Citus sends it to the one shard that holds the key, in one round
// trip from the coordinator to that shard's node. Citus evaluates now() in
// a write on the coordinator before it sends the statement: every lease
// time written, and every comparison with the lease in a write (a takeover,
// a claim, an expiry), is thus by the coordinator's clock, whichever node
// holds the key. Reads pushed to the nodes (the completer's and the
// reaper's scans for candidates) compare with the nodes' clocks; they only
// propose keys, and the write that takes or changes each key checks again
// by the coordinator's.

// takeable is the condition under which the distributed acquire takes an
// existing row: the one takeOverSQL's ON CONFLICT checks, with the
// statement's clock read from excluded.locked_at, because Citus refuses
// now() in ON CONFLICT.
const takeable = `(k.finished_at IS NULL AND k.hold IS NULL
          AND k.request_fingerprint = excluded.request_fingerprint
          AND k.workflow = excluded.workflow
          AND k.definition = excluded.definition
          AND (k.lock_expires_at IS NULL OR k.lock_expires_at <= excluded.locked_at))`

// acquireDistributedSQL is acquireSQL and takeOverSQL in one, for a
// distributed key table, in the one form Citus sends to a single shard: an
// INSERT ... VALUES whose ON CONFLICT clause uses no function. ON CONFLICT
// DO UPDATE ... WHERE would return nothing for a key it did not take, so the
// update instead always happens and leaves the row as it was unless the key
// is takeable; RETURNING then reports the row either way, and whether the
// caller's token ($7) is now the row's. A replay or a conflict therefore
// writes a row version (HOT: no indexed column changes) where acquireSQL
// only reads, and waits for a phase transaction holding the row's lock. The
// takeover sets the same columns as takeOverSQL's.
//
// Citus refuses now() in RETURNING too, so a key held by another run
// reports the lease's expiry (column 9), and Acquire turns it into the
// time left by the caller's clock: that time is only a hint of when to
// retry, never a decision.
var acquireDistributedSQL = `
INSERT INTO idempotency_keys AS k
    (id, tenant, idempotency_key, workflow, definition, request_fingerprint, request_params,
     locked_at, lock_expires_at, lock_token, attempts, retain_for)
VALUES ($8, $1, $2, $3, $9, $4, $5, now(), now() + $6::interval, $7, 1, $10::interval)
ON CONFLICT (tenant, idempotency_key) DO UPDATE
    SET locked_at = ` + ifTakeable("excluded.locked_at", "k.locked_at") + `,
        lock_expires_at = ` + ifTakeable("excluded.lock_expires_at", "k.lock_expires_at") + `,
        lock_token = ` + ifTakeable("excluded.lock_token", "k.lock_token") + `,
        last_run_at = ` + ifTakeable("excluded.locked_at", "k.last_run_at") + `,
        attempts = ` + ifTakeable("k.attempts + 1", "k.attempts") + `
RETURNING k.id, k.workflow, k.definition, k.recovery_point,
       CASE WHEN k.lock_token = $7 THEN k.phase_state END, k.hold, k.attempts,
       CASE WHEN k.lock_token = $7 THEN k.lock_token END,
       CASE WHEN k.lock_token = $7 THEN NULL ELSE k.lock_expires_at END,
       k.xmax = 0, coalesce(k.lock_token = $7, false), k.request_fingerprint = $4,
       k.response_status, k.response_headers, k.response_body, k.last_error,
       CASE WHEN k.lock_token = $7 THEN k.call_pending END,
       CASE WHEN k.lock_token = $7 AND k.xmax <> 0 THEN k.request_params END`

func ifTakeable(then, otherwise string) string {
	return "CASE WHEN " + strings.TrimSpace(takeable) + " THEN " + then + " ELSE " + otherwise + " END"
}

// leaseLeftAt is the time a lease that expires at expires has left at now,
// by the caller's clock; zero for none.
func leaseLeftAt(expires pgtype.Timestamptz, now time.Time) time.Duration {
	if !expires.Valid {
		return 0
	}
	return max(expires.Time.Sub(now), 0)
}

// dueCandidatesSQL lists keys due for the completer (dueWhere) without
// locking them: Citus refuses row locks in a query over many shards. The
// list only proposes keys; claimOneSQL takes each one only if it is still
// due.
const dueCandidatesSQL = `
SELECT tenant, id FROM idempotency_keys
WHERE ` + dueWhere + `
  AND (workflow, definition) IN (SELECT * FROM unnest($5::text[], $6::text[]))
ORDER BY last_run_at
LIMIT $1`

// claimOneSQL takes the lease on one proposed key when it is still due,
// judged on the newest row version under the row's lock (READ COMMITTED
// re-checks the condition after waiting), so of two completers proposed the
// same key only one takes it, and a key that a request took or finished in
// the meantime is left alone. Its workflow and definition are not checked
// again: only a holder changes them. The token ($5) comes from the caller,
// as Citus refuses a volatile function in an UPDATE.
const claimOneSQL = `
UPDATE idempotency_keys k
SET locked_at = now(), lock_expires_at = now() + $1::interval, lock_token = $5,
    last_run_at = now(), attempts = k.attempts + 1
WHERE tenant = $6 AND id = $7 AND ` + dueWhere + `
RETURNING ` + claimedColumns

// claimDistributed is Claim on a distributed key table: one unlocked scan
// for candidates, in random order so that completers scanning at once
// rarely propose each other the same keys first, then one single-shard
// claim per candidate.
func claimDistributed(ctx context.Context, q Querier, p ClaimParams) ([]*Row, error) {
	rows, err := q.Query(ctx, dueCandidatesSQL, p.Limit, p.StuckAfter, p.Backoff, p.MaxBackoff,
		p.Workflows, definitionsFor(p.Workflows, p.Definitions))
	if err != nil {
		return nil, fmt.Errorf("store: claim: %w", err)
	}
	type candidate struct {
		tenant string
		id     uuid.UUID
	}
	candidates, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		return c, r.Scan(&c.tenant, &c.id)
	})
	if err != nil {
		return nil, fmt.Errorf("store: claim: %w", err)
	}
	rand.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	var claimed []*Row
	for _, c := range candidates {
		var got []*Row
		sent := time.Now()
		err := pgxscan.Select(ctx, q, &got, claimOneSQL, p.TTL, p.StuckAfter, p.Backoff, p.MaxBackoff,
			uuidArg(uuid.New()), c.tenant, uuidArg(c.id))
		if err != nil {
			return claimed, fmt.Errorf("store: claim: %w", err)
		}
		for _, r := range got {
			r.TakenAt, r.Distributed = sent, true
			claimed = append(claimed, r)
		}
	}
	return claimed, nil
}

// The reaper's and expiry's statements for a distributed key table, where
// FOR UPDATE SKIP LOCKED over many shards is refused: a scan proposes keys
// ($1 retention, $2 workflow, $3 limit), and one statement changes those of
// them ($3 tenants, $4 ids) that still qualify, judged again by the
// coordinator's clock. A key a request is replaying may be deleted under
// it, which a replay survives: it read the row already.
const (
	reapCandidatesDistributedSQL = `
SELECT tenant, id FROM idempotency_keys
WHERE workflow = $2 AND ` + reapableWhere + `
ORDER BY finished_at
LIMIT $3`
	reapDistributedSQL = `
DELETE FROM idempotency_keys
WHERE (tenant, id) IN (SELECT * FROM unnest($3::text[], $4::uuid[]))
  AND workflow = $2 AND ` + reapableWhere
	expireCandidatesDistributedSQL = `
SELECT tenant, id FROM idempotency_keys
WHERE ` + abandonedWhere + `
LIMIT $3`
	expireDistributedSQL = `
UPDATE idempotency_keys
SET ` + expireSet + `
WHERE (tenant, id) IN (SELECT * FROM unnest($3::text[], $4::uuid[]))
  AND ` + abandonedWhere
)

// changeProposed runs a scan for candidates (retention, workflow, limit)
// and then change on those it proposed, and reports how many rows change
// touched.
func changeProposed(ctx context.Context, q Querier, what, scan, change string, retention time.Duration, workflow string, limit int) (int, error) {
	rows, err := q.Query(ctx, scan, retention, workflow, limit)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", what, err)
	}
	var tenants []string
	var ids [][16]byte
	var tenant string
	var id [16]byte
	_, err = pgx.ForEachRow(rows, []any{&tenant, &id}, func() error {
		tenants, ids = append(tenants, tenant), append(ids, id)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", what, err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	tag, err := q.Exec(ctx, change, retention, workflow, tenants, ids)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", what, err)
	}
	return int(tag.RowsAffected()), nil
}

// IsDistributed reports whether the key table that q reaches (by its
// search_path) is distributed with Citus. On a database without Citus it
// costs one statement. Its statements go through the simple protocol: they
// prepare nothing, so they run behind any pooler, before the client has
// found out whether one is there.
func IsDistributed(ctx context.Context, q Querier) (bool, error) {
	var citus bool
	simple := pgx.QueryExecModeSimpleProtocol
	if err := q.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`, simple).Scan(&citus); err != nil {
		return false, fmt.Errorf("store: look for citus: %w", err)
	}
	if !citus {
		return false, nil
	}
	var distributed bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
        WHERE logicalrelid = to_regclass('idempotency_keys'))`, simple).Scan(&distributed)
	if err != nil {
		return false, fmt.Errorf("store: look for citus: %w", err)
	}
	return distributed, nil
}

// placeholder matches a statement's parameter placeholders.
var placeholder = regexp.MustCompile(`\$[0-9]+`)

// actDistributed is act on a distributed key table, where Citus refuses a
// row lock over many shards: in one transaction, an unlocked scan proposes
// the keys, and act's statement then runs for each one on its shard alone,
// which locks it, checks its conditions again, changes it and audits it.
// It costs a round trip per key, which an operator's action can afford.
func actDistributed(ctx context.Context, q Querier, x action, detail []byte) (int, error) {
	b, ok := q.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return 0, fmt.Errorf("store: %s: a distributed key table needs a pool or a transaction", x.name)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", x.name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	// The scan takes only the arguments its conditions use: those of the
	// action's assignments would reach Postgres with no type.
	var scan args
	where := placeholder.ReplaceAllStringFunc(strings.Join(x.where, " AND "), func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		return scan.add(x.a[n-1])
	})
	rows, err := tx.Query(ctx, `SELECT tenant, idempotency_key FROM idempotency_keys t WHERE `+where+
		` ORDER BY id LIMIT `+scan.add(x.limit), scan...)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", x.name, err)
	}
	var tenant, key string
	type target struct{ tenant, key string }
	var targets []target
	_, err = pgx.ForEachRow(rows, []any{&tenant, &key}, func() error {
		targets = append(targets, target{tenant, key})
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", x.name, err)
	}
	changed := 0
	for _, t := range targets {
		one := x
		one.a = slices.Clone(x.a)
		one.where = append(slices.Clone(x.where), `tenant = `+one.a.add(t.tenant), `idempotency_key = `+one.a.add(t.key))
		one.limit = 1
		n, err := actStatement(ctx, tx, one, detail)
		if err != nil {
			return 0, err
		}
		changed += n
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("store: %s: %w", x.name, err)
	}
	return changed, nil
}
