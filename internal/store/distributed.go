package store

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/atomicphase/atomicphase/keyrow"
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

// On a distributed key table Acquire sends only statements on the key
// table alone with the tenant as a parameter, which Citus plans on its fast
// path and, once prepared, does not plan again: the CTEs of acquireSQL and
// takeOverSQL it would plan in full on every call. A new key costs one
// statement, the insert, as the hand-written upsert does; a replay, a
// conflict, a mismatch or a key on hold costs the insert and a read, and
// writes nothing; a key that may be resumed costs a third, the takeover.
// One statement could serve every outcome only by writing the existing row
// (an upsert returns an existing row only when it updates it), which a
// replay or a conflict would then wait for behind a running phase's
// transaction.

// acquireDistributedSQL inserts a new key with the caller's lease (as
// acquireSQL does), and inserts nothing when the key exists. It returns no
// column: every column of a new key's row is the caller's own or its
// default, so its command tag says all (see newRow).
const acquireDistributedSQL = `
INSERT INTO idempotency_keys
    (id, tenant, idempotency_key, workflow, definition, request_fingerprint, request_params,
     locked_at, lock_expires_at, lock_token, attempts, retain_for)
VALUES ($8, $1, $2, $3, $9, $4, $5, now(), now() + $6::interval, $7, 1, $10::interval)
ON CONFLICT (tenant, idempotency_key) DO NOTHING`

// newRow is the row acquireDistributedSQL inserted for req, with id and
// the caller's token: what acquireSQL returns for a new key.
func newRow(req Request, id, token uuid.UUID) *Row {
	return &Row{ID: id, Workflow: req.Workflow, Definition: req.Definition, RecoveryPoint: keyrow.Started,
		State: []byte("null"), Attempts: 1, LockToken: token, Params: req.Params}
}

// foundDistributedSQL reads an existing key, as acquireSQL's found branch
// does. Citus refuses now() in a write's RETURNING and would run it on the
// worker's clock in a read, so column 9 is the lease's expiry, which
// Acquire turns into the time left by the caller's clock: that time only
// decides whether to try the takeover, which judges the lease again by the
// coordinator's clock, and hints when to retry.
const foundDistributedSQL = `
SELECT id, workflow, definition, recovery_point, NULL::jsonb, hold, attempts, NULL::uuid,
       lock_expires_at, false, false, request_fingerprint = $3,
       response_status, response_headers, response_body, last_error, NULL::text, NULL::jsonb
FROM idempotency_keys
WHERE tenant = $1 AND idempotency_key = $2`

// takeOverDistributedSQL takes over the lease of an existing key under the
// conditions of takeOverSQL's ON CONFLICT, judged under the row's lock on
// its newest version (READ COMMITTED re-checks them after a wait), so that
// of two takeovers, or a takeover and a phase commit that renewed the
// lease, only one wins. It returns nothing when the key cannot be taken, or
// is gone. Its columns are acquireSQL's, with the stored request last.
const takeOverDistributedSQL = `
UPDATE idempotency_keys
SET locked_at = now(), lock_expires_at = now() + $5::interval, lock_token = $6,
    last_run_at = now(), attempts = attempts + 1
WHERE tenant = $1 AND idempotency_key = $2
  AND finished_at IS NULL AND hold IS NULL
  AND request_fingerprint = $4 AND workflow = $3 AND definition = $7
  AND (lock_expires_at IS NULL OR lock_expires_at <= now())
RETURNING id, workflow, definition, recovery_point, phase_state, hold, attempts, lock_token,
       NULL::timestamptz, false, true, true,
       NULL::int, NULL::jsonb, NULL::bytea, last_error, call_pending, request_params`

// acquireDistributed is Acquire on a distributed key table (see
// acquireDistributedSQL), with the new key's token and id. A key deleted
// between two of its statements, or taken by another run between the read
// and the takeover, sends it back to the insert, at most twice: it then
// reports what it read last.
func acquireDistributed(ctx context.Context, q Querier, req Request, retention *time.Duration, token, id uuid.UUID) (Outcome, *Row, error) {
	var (
		row     *Row
		outcome Outcome
	)
	for try := 0; ; try++ {
		sent := time.Now()
		tag, err := q.Exec(ctx, acquireDistributedSQL,
			req.Tenant, req.Key, req.Workflow, req.Fingerprint[:], req.Params, intervalArg(req.TTL), uuidArg(token), uuidArg(id),
			req.Definition, retention)
		if err != nil {
			return 0, nil, fmt.Errorf("store: acquire: %w", err)
		}
		if tag.RowsAffected() == 1 {
			row = newRow(req, id, token)
			row.TakenAt = sent
			return New, row, nil
		}
		row, outcome, err = scanAcquire(q.QueryRow(ctx, foundDistributedSQL, req.Tenant, req.Key, req.Fingerprint[:]), req)
		if errors.Is(err, pgx.ErrNoRows) && try < 2 {
			continue
		}
		if err != nil {
			return 0, nil, fmt.Errorf("store: acquire: %w", err)
		}
		// The lease looked free by the caller's clock; the takeover judges
		// by the coordinator's, and after two refusals (clocks apart, or
		// other runs quicker) the key is reported held as read.
		if outcome != Held || row.LeaseLeft > 0 || try >= 2 {
			return outcome, row, nil
		}
		sent = time.Now()
		taken, takenOutcome, err := scanAcquire(q.QueryRow(ctx, takeOverDistributedSQL,
			req.Tenant, req.Key, req.Workflow, req.Fingerprint[:], intervalArg(req.TTL), uuidArg(token), req.Definition), req)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return 0, nil, fmt.Errorf("store: acquire: %w", err)
		}
		taken.TakenAt = sent
		return takenOutcome, taken, nil
	}
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
var dueCandidatesSQL = `
SELECT tenant, id FROM idempotency_keys
WHERE ` + dueCandidatesWhere + `
ORDER BY last_run_at
LIMIT $1`

// dueCandidatesWhere selects dueCandidatesSQL's keys.
var dueCandidatesWhere = dueWhere + ` AND (hold IS NOT NULL OR failures < $7)
  AND (workflow, definition) IN (SELECT * FROM unnest($5::text[], $6::text[]))`

// dueCandidatesByShardSQL is dueCandidatesSQL run on each shard, on its
// node, through run_command_on_shards, which reports a shard it could not
// reach in that shard's row instead of failing as a query over every shard
// does: so while a node is unreachable the completer still finds the keys
// of the others. Each shard returns its due keys, oldest run first, as a
// JSON array of [tenant, id, last run]. The command cannot take
// parameters: format() spells dueCandidatesSQL's into it as literals, and
// Citus puts each shard's name in place of %s.
var dueCandidatesByShardSQL = `
SELECT success, result FROM run_command_on_shards('idempotency_keys', format($cmd$
SELECT coalesce(json_agg(json_build_array(tenant, id, last_run_at) ORDER BY last_run_at), '[]') FROM (
    SELECT tenant, id, last_run_at FROM %%s
    WHERE ` + regexp.MustCompile(`\$(\d)`).ReplaceAllString(dueCandidatesWhere, `%${1}$$L`) + `
    ORDER BY last_run_at
    LIMIT %1$s) AS due$cmd$,
    $1::int, $2::interval, $3::interval, $4::interval, $5::text[], $6::text[], $7::int))`

// claimOneSQL takes the lease on one proposed key when it is still due,
// judged on the newest row version under the row's lock (READ COMMITTED
// re-checks the condition after waiting), so of two completers proposed the
// same key only one takes it, and a key that a request took or finished in
// the meantime is left alone. Its workflow and definition are not checked
// again: only a holder changes them. The token ($5) comes from the caller,
// as Citus refuses a volatile function in an UPDATE. Like claimSQL it
// leaves the key's last run as it was.
var claimOneSQL = `
UPDATE idempotency_keys k
SET locked_at = now(), lock_expires_at = now() + $1::interval, lock_token = $5,
    attempts = k.attempts + 1
WHERE tenant = $6 AND id = $7 AND ` + dueWhere + ` AND (hold IS NOT NULL OR failures < $8)
RETURNING ` + claimedColumns

// claimDistributed is Claim on a distributed key table: one unlocked scan
// for candidates, in random order so that completers scanning at once
// rarely propose each other the same keys first, then one single-shard
// claim per candidate. A scan whose candidates another completer took
// first, every one, is followed by another, at most claimRounds in all: a
// completer that claims nothing waits its Interval, and would leave the
// backlog to the other meanwhile.
func claimDistributed(ctx context.Context, q Querier, p ClaimParams) ([]*Row, error) {
	for range claimRounds {
		claimed, proposed, err := claimDistributedOnce(ctx, q, p)
		if err != nil || len(claimed) > 0 || proposed == 0 {
			return claimed, err
		}
	}
	return nil, nil
}

// claimRounds caps the scans of one claim on a distributed key table.
const claimRounds = 3

// claimDistributedOnce is one round of claimDistributed: it returns the
// keys it took and how many it proposed.
func claimDistributedOnce(ctx context.Context, q Querier, p ClaimParams) ([]*Row, int, error) {
	args := []any{p.Limit, p.StuckAfter, p.Backoff, p.MaxBackoff,
		p.Workflows, definitionsFor(p.Workflows, p.Definitions), p.attemptsLeft()}
	rows, err := q.Query(ctx, dueCandidatesSQL, args...)
	var candidates []candidate
	if err == nil {
		candidates, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
			var c candidate
			return c, r.Scan(&c.tenant, &c.id)
		})
	}
	if err != nil && ctx.Err() == nil {
		// A node may be unreachable: scan the shards one by one, and
		// claim from those that answer.
		var byShard error
		if candidates, byShard = dueCandidatesByShard(ctx, q, p.Limit, args); byShard != nil {
			err = errors.Join(err, byShard)
		} else {
			if p.Unanswered != nil {
				p.Unanswered(err)
			}
			err = nil
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("store: claim: %w", err)
	}
	rand.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	var claimed []*Row
	for _, c := range candidates {
		var got []*Row
		sent := time.Now()
		err := pgxscan.Select(ctx, q, &got, claimOneSQL, p.TTL, p.StuckAfter, p.Backoff, p.MaxBackoff,
			uuidArg(uuid.New()), c.tenant, uuidArg(c.id), p.attemptsLeft())
		if err != nil {
			return claimed, len(candidates), fmt.Errorf("store: claim: %w", err)
		}
		for _, r := range got {
			r.TakenAt, r.Distributed = sent, true
			claimed = append(claimed, r)
		}
	}
	return claimed, len(candidates), nil
}

// candidate is a key a scan proposed to claim.
type candidate struct {
	tenant string
	id     uuid.UUID
}

// dueCandidatesByShard proposes up to limit due keys, the longest idle
// first, from the shards that answer dueCandidatesByShardSQL; it fails
// only when none does.
func dueCandidatesByShard(ctx context.Context, q Querier, limit int, args []any) ([]candidate, error) {
	rows, err := q.Query(ctx, dueCandidatesByShardSQL, args...)
	if err != nil {
		return nil, err
	}
	type due struct {
		candidate
		lastRun time.Time
	}
	var (
		found    []due
		answered int
		failure  string
		success  bool
		result   string
	)
	_, err = pgx.ForEachRow(rows, []any{&success, &result}, func() error {
		if !success {
			failure = result
			return nil
		}
		answered++
		var keys [][3]string
		if err := json.Unmarshal([]byte(result), &keys); err != nil {
			return fmt.Errorf("a shard's due keys %q: %w", result, err)
		}
		for _, k := range keys {
			id, err := uuid.Parse(k[1])
			if err != nil {
				return fmt.Errorf("a shard's due key %q: %w", k, err)
			}
			lastRun, err := time.Parse(time.RFC3339Nano, k[2])
			if err != nil {
				return fmt.Errorf("a shard's due key %q: %w", k, err)
			}
			found = append(found, due{candidate{k[0], id}, lastRun})
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case answered == 0:
		return nil, fmt.Errorf("no shard answered the scan for due keys: %s", failure)
	}
	slices.SortFunc(found, func(a, b due) int { return a.lastRun.Compare(b.lastRun) })
	out := make([]candidate, 0, min(len(found), limit))
	for _, d := range found[:min(len(found), limit)] {
		out = append(out, d.candidate)
	}
	return out, nil
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
ORDER BY created_at
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
// search_path, or in the Schema q is a Querier of) is distributed with
// Citus. It returns an error when the table is distributed but its schema
// lacks the functions that commit a phase there (migration 013), which
// every run would then fail on. On a database without Citus it costs one
// statement. Its statements go through the simple protocol: they
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
	var distributed, committing bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
        WHERE logicalrelid = to_regclass('idempotency_keys')), to_regproc('atomicphase_advance_from') IS NOT NULL`, simple).Scan(&distributed, &committing)
	if err != nil {
		return false, fmt.Errorf("store: look for citus: %w", err)
	}
	if distributed && !committing {
		return false, errors.New("store: the key table is distributed with Citus, but its schema is older than this release: " +
			"it lacks the functions that commit a phase there (migration 013); migrate it (atomicphase.Migrate) before this release runs")
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
	where := placeholder.ReplaceAllStringFunc(stripped(strings.Join(x.where, " AND ")), func(p string) string {
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
		n, err := actStatement(ctx, tx, one, detail, true)
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
