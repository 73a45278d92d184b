package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/atomicphase/atomicphase/keyrow"
)

// Querier is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// leaseLostCode is the SQLSTATE raised by atomicphase_lease_lost() in schema.sql.
const leaseLostCode = "AP001"

// Row is the part of an idempotency key row that a run needs.
type Row struct {
	ID            uuid.UUID
	Tenant        string
	Key           string
	Workflow      string
	RecoveryPoint string
	// State is the workflow's JSON-encoded typed state as last committed.
	State []byte
	// Params is the JSON-encoded request as first received.
	Params []byte
	// Fingerprint is the request's fingerprint (keyrow.Fingerprint).
	Fingerprint []byte
	Hold        keyrow.Hold
	Attempts    int
	// LockToken is the caller's fencing token when it holds the lease.
	LockToken uuid.UUID
	// LeaseLeft is how long the current lease has to run, by the database
	// clock, when the row was read. Zero when the lease is free.
	LeaseLeft time.Duration
	// TakenAt is when, by the caller's clock, Acquire sent the statement
	// that gave the caller the lease (see Lease.Proven); zero when the row
	// came from elsewhere.
	TakenAt time.Time
	// Response is the stored response of a finished key, nil otherwise.
	Response *keyrow.Response
	// LastError is the error that ended the last unsuccessful run.
	LastError string
	// Definition is the workflow definition the key started under; empty
	// for keys stored before definitions were recorded.
	Definition string
	// CallPending names the phase whose foreign call, not safe to repeat,
	// may have been sent by a run that then stopped; empty otherwise.
	CallPending string
	// Distributed is true when the row was read from a key table
	// distributed with Citus (see Request.Distributed); the lease taken on
	// it then renews in the form Citus accepts.
	Distributed bool
}

// Holder identifies a lease: the key's tenant and row id, and the fencing
// token that the lease's holder was given. On a distributed key table
// every write of a holder names the tenant, so that it reaches one shard;
// on a single Postgres it finds the row by its id alone (see keySQL).
type Holder struct {
	Tenant string
	ID     uuid.UUID
	Token  uuid.UUID
	// Point is the recovery point the holder found the key at. The writes
	// that commit a phase, and the mark before a foreign call, match it as
	// well as the token (see Lease.Advance).
	Point string
	// Distributed: see Row.Distributed.
	Distributed bool
}

// Holder returns the holder of the lease that the caller took with r.
func (r *Row) Holder() Holder {
	return Holder{Tenant: r.Tenant, ID: r.ID, Token: r.LockToken, Point: r.RecoveryPoint, Distributed: r.Distributed}
}

// Outcome tells what Acquire found.
type Outcome int

// The outcomes of Acquire.
const (
	// New: the key was inserted and the caller holds its lease.
	New Outcome = iota + 1
	// Resumed: the key existed unfinished with a free or stale lease; the
	// caller took the lease over and continues from Row.RecoveryPoint.
	Resumed
	// Replay: the key is finished; Row.Response is the stored response.
	Replay
	// Held: another run holds a live lease; Row.LeaseLeft says for how long.
	Held
	// Mismatch: the key was first used with another request fingerprint.
	Mismatch
	// Parked: the key is unfinished but on hold (Row.Hold says why).
	Parked
	// Elsewhere: the key belongs to another workflow (Row.Workflow), or is
	// unfinished under another definition of this one (Row.Definition);
	// nothing was taken. Only a run of that workflow and definition may
	// take it.
	Elsewhere
)

func (o Outcome) String() string {
	switch o {
	case New:
		return "new"
	case Resumed:
		return "resumed"
	case Replay:
		return "replay"
	case Held:
		return "held"
	case Mismatch:
		return "mismatch"
	case Parked:
		return "parked"
	case Elsewhere:
		return "elsewhere"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Acquiring reports whether the outcome gave the caller the lease.
func (o Outcome) Acquiring() bool { return o == New || o == Resumed }

// Request identifies a key and carries what Acquire stores with a new one.
type Request struct {
	Tenant   string
	Key      string
	Workflow string
	// Definition is the workflow definition a new key starts under; an
	// existing key is taken only when it has this workflow and definition.
	Definition  string
	Fingerprint [32]byte
	// Params is the JSON-encoded request, stored so the completer can
	// rebuild it.
	Params []byte
	// TTL is the lease length. It must be positive.
	TTL time.Duration
	// Retention is how long the key is kept once finished, recorded on a
	// new key so that no reaper deletes it sooner; zero records none, and
	// the reaper of the key's workflow applies its own.
	Retention time.Duration
	// Distributed selects the statement for a key table distributed with
	// Citus (see atomicphase.Distribute), which refuses the one for a
	// single Postgres.
	Distributed bool
}

// acquireSQL inserts a new key, or reads the existing one, in one
// statement, and reports which case happened.
//
// It reads the key first (found), and inserts it only when found is empty,
// so a replay, a conflict or a mismatch is a plain read: no row lock, no
// transaction id, no WAL, and no wait on a transaction writing the row. The
// INSERT does nothing on a conflict: a concurrent request that inserted the
// same key after this statement's snapshot was taken wins, and the
// statement returns no row (see Acquire). Its plan has no ON CONFLICT DO
// UPDATE to build, which makes a new key, a replay and a 409 cheaper for
// the server than takeOverSQL.
//
// A key found unfinished, not on hold, with the same fingerprint, workflow
// and definition and a free or expired lease comes back as it is, with no
// lease time left and no token: the caller takes it over with takeOverSQL,
// which judges all of that again on the newest row version.
//
// A new key's id ($8) is a UUIDv7, ordered by time, so that new rows go to
// the right edge of the primary key's index instead of a random page; it
// records its retention ($10).
//
// The statement's transaction commits without waiting for the WAL flush
// (synchronous_commit off for it alone). The lease is the library's own
// bookkeeping, and nothing depends on it surviving a crash before the run's
// first phase commits: that commit waits for the flush, which covers all WAL
// before it, this statement's included. A lease lost in a crash before then
// is a run that never started; its holder is fenced (its token matches no
// row), and a retry takes the key anew, with the same downstream keys.
const acquireSQL = `
WITH found AS (
    SELECT id, workflow, definition, recovery_point, hold, attempts, lock_expires_at, request_fingerprint,
           response_status, response_headers, response_body, last_error
    FROM idempotency_keys
    WHERE tenant = $1 AND idempotency_key = $2
), inserted AS (
    INSERT INTO idempotency_keys
        (id, tenant, idempotency_key, workflow, definition, request_fingerprint, request_params,
         locked_at, lock_expires_at, lock_token, attempts, retain_for)
    SELECT $8, $1, $2, $3, $9, $4, $5, now(), now() + $6::interval, $7, 1, $10::interval
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lease_only
    WHERE NOT EXISTS (SELECT FROM found)
    ON CONFLICT (tenant, idempotency_key) DO NOTHING
    RETURNING id, workflow, definition, recovery_point, phase_state, hold, attempts, lock_token, last_error, call_pending
)
SELECT id, workflow, definition, recovery_point, phase_state, hold, attempts, lock_token,
       interval '0', true, true, true,
       NULL::int, NULL::jsonb, NULL::bytea, last_error, call_pending, NULL::jsonb
FROM inserted
UNION ALL
SELECT id, workflow, definition, recovery_point, NULL, hold, attempts, NULL,
       greatest(lock_expires_at - now(), interval '0'), false, false, request_fingerprint = $4,
       response_status, response_headers, response_body, last_error, NULL, NULL
FROM found`

// takeOverSQL takes over the lease of an existing key, or inserts the key
// when it is gone, in one statement, and reports which case happened.
// Acquire sends it when acquireSQL found the key and it may be taken.
//
// It reads the key first (found). When the key cannot be taken (finished,
// on hold, another fingerprint, workflow or definition, or a live lease),
// the INSERT's SELECT yields no row and the statement is a plain read.
//
// Otherwise the upsert takes the existing row only when it is still
// unfinished, not on hold, has the same fingerprint, workflow and
// definition, and its lease is free or expired by the database clock, or
// inserts the key when it was deleted meanwhile. ON CONFLICT judges the
// newest row version, so a takeover racing with another one, or with a
// phase commit that renewed the lease, loses instead of stealing the key;
// the found branch then reports the row as the statement's snapshot saw
// it.
//
// xmax = 0 on the returned row means it was inserted, otherwise updated. A
// taken row's stored request comes back only when the row was not inserted:
// a new key's request is the caller's own. A takeover leaves the key's
// retention as it was: the key is kept as long as the run that created it
// promised. Like acquireSQL, it commits without waiting for the WAL flush.
const takeOverSQL = `
WITH found AS (
    SELECT id, workflow, definition, recovery_point, hold, attempts, lock_expires_at, request_fingerprint,
           finished_at, response_status, response_headers, response_body, last_error
    FROM idempotency_keys
    WHERE tenant = $1 AND idempotency_key = $2
), taken AS (
    INSERT INTO idempotency_keys AS k
        (id, tenant, idempotency_key, workflow, definition, request_fingerprint, request_params,
         locked_at, lock_expires_at, lock_token, attempts, retain_for)
    SELECT $8, $1, $2, $3, $9, $4, $5, now(), now() + $6::interval, $7, 1, $10::interval
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lease_only
    WHERE NOT EXISTS (
        SELECT FROM found
        WHERE finished_at IS NOT NULL OR hold IS NOT NULL
           OR request_fingerprint <> $4 OR workflow <> $3 OR definition <> $9
           OR lock_expires_at > now())
    ON CONFLICT (tenant, idempotency_key) DO UPDATE
        SET locked_at = now(),
            lock_expires_at = excluded.lock_expires_at,
            lock_token = excluded.lock_token,
            last_run_at = now(),
            attempts = k.attempts + 1
        WHERE k.finished_at IS NULL
          AND k.hold IS NULL
          AND k.request_fingerprint = excluded.request_fingerprint
          AND k.workflow = excluded.workflow
          AND k.definition = excluded.definition
          AND (k.lock_expires_at IS NULL OR k.lock_expires_at <= now())
    RETURNING k.*, k.xmax = 0 AS inserted
)
SELECT id, workflow, definition, recovery_point, phase_state, hold, attempts, lock_token,
       interval '0', inserted, true, true,
       NULL::int, NULL::jsonb, NULL::bytea, last_error, call_pending,
       CASE WHEN inserted THEN NULL ELSE request_params END
FROM taken
UNION ALL
SELECT id, workflow, definition, recovery_point, NULL, hold, attempts, NULL,
       greatest(lock_expires_at - now(), interval '0'), false, false, request_fingerprint = $4,
       response_status, response_headers, response_body, last_error, NULL, NULL
FROM found
WHERE NOT EXISTS (SELECT FROM taken)`

// Acquire inserts the key or takes over its lease, and says which case it
// met. When the outcome is New or Resumed, the caller holds the lease and
// Row.LockToken is its fencing token. Either is taken by one statement: a
// new key, a replay, a conflict, a mismatch or a key on hold costs one
// (acquireSQL), and a key that may be resumed a second, the takeover
// (takeOverSQL). On a distributed key table a new key costs one statement
// and the other cases two or three (see acquireDistributed).
//
// Lease expiry is judged by the database clock, never the caller's. The
// tenant, key and workflow name are checked before anything is sent: the
// table has no CHECK constraints, so this is what keeps a malformed key row
// out of it.
//
// Acquire commits without waiting for the WAL flush (see acquireSQL), so q
// should not be a transaction: that transaction's commit would not wait
// either.
func Acquire(ctx context.Context, q Querier, req Request) (Outcome, *Row, error) {
	if req.TTL <= 0 {
		return 0, nil, errors.New("store: acquire: lease TTL must be positive")
	}
	var retention *time.Duration
	if r := req.Retention; r > 0 {
		retention = &r
	}
	if err := keyrow.CheckTenant(req.Tenant); err != nil {
		return 0, nil, fmt.Errorf("store: acquire: %w", err)
	}
	if err := keyrow.CheckKey(req.Key); err != nil {
		return 0, nil, fmt.Errorf("store: acquire: %w", err)
	}
	if err := keyrow.CheckName(req.Workflow); err != nil {
		return 0, nil, fmt.Errorf("store: acquire: workflow name %w", err)
	}
	if len(req.Params) == 0 {
		req.Params = []byte("null")
	}
	token := uuid.New()
	id, err := uuid.NewV7()
	if err != nil {
		return 0, nil, fmt.Errorf("store: acquire: %w", err)
	}
	if req.Distributed {
		outcome, row, err := acquireDistributed(ctx, q, req, retention, token, id)
		if err != nil {
			return 0, nil, err
		}
		row.Tenant, row.Key, row.Fingerprint, row.Distributed = req.Tenant, req.Key, req.Fingerprint[:], true
		return outcome, row, nil
	}
	sql := acquireSQL
	for raced := false; ; {
		sent := time.Now()
		row, outcome, err := scanAcquire(q.QueryRow(ctx, sql,
			req.Tenant, req.Key, req.Workflow, req.Fingerprint[:], req.Params, intervalArg(req.TTL), uuidArg(token), uuidArg(id),
			req.Definition, retention), req)
		if errors.Is(err, pgx.ErrNoRows) && !raced {
			// The statement met a row committed by a concurrent transaction
			// after its snapshot was taken: ON CONFLICT sees the latest
			// version (and inserted or took nothing), but found reads the
			// snapshot, in which the row does not exist yet. Running the
			// statement again takes a fresh snapshot in which the row is
			// visible. This costs a second statement only in that race.
			raced = true
			continue
		}
		if err != nil {
			return 0, nil, fmt.Errorf("store: acquire: %w", err)
		}
		if sql == acquireSQL && outcome == Held && row.LeaseLeft == 0 {
			// Found with a free or expired lease: take it over.
			sql, raced = takeOverSQL, false
			continue
		}
		row.Tenant, row.Key, row.Fingerprint, row.Distributed = req.Tenant, req.Key, req.Fingerprint[:], req.Distributed
		if outcome == New {
			row.Params = req.Params
		}
		if outcome.Acquiring() {
			row.TakenAt = sent
		}
		return outcome, row, nil
	}
}

func scanAcquire(r pgx.Row, req Request) (*Row, Outcome, error) {
	// One struct holds every scan target, so that they cost one allocation
	// between them rather than one each. The targets are pgtype values, for
	// which pgx has scan plans that allocate nothing (a uuid.UUID it would
	// scan through its text form, a pointer to a pointer or a [16]byte with
	// a plan made for the row).
	var v struct {
		row                         Row
		hold, lastError, pending    pgtype.Text
		id, token                   pgtype.UUID
		expires                     pgtype.Timestamptz
		inserted, acquired, sameReq bool
		status                      pgtype.Int4
		headers                     []byte
		body                        []byte
	}
	row := &v.row
	// Column 9 is the lease's time left, or on a distributed table its
	// expiry (see acquireDistributedSQL).
	var left any = &row.LeaseLeft
	if req.Distributed {
		left = &v.expires
	}
	err := r.Scan(&v.id, &row.Workflow, &row.Definition, &row.RecoveryPoint, &row.State, &v.hold, &row.Attempts, &v.token,
		left, &v.inserted, &v.acquired, &v.sameReq, &v.status, &v.headers, &v.body, &v.lastError,
		&v.pending, &row.Params)
	if err != nil {
		return nil, 0, err
	}
	if req.Distributed {
		row.LeaseLeft = leaseLeftAt(v.expires, time.Now())
	}
	row.ID = v.id.Bytes
	row.CallPending, row.Hold, row.LastError = v.pending.String, keyrow.Hold(v.hold.String), v.lastError.String
	if v.token.Valid {
		row.LockToken = v.token.Bytes
	}
	switch {
	case v.acquired && v.inserted:
		return row, New, nil
	case v.acquired:
		return row, Resumed, nil
	case !v.sameReq:
		return row, Mismatch, nil
	case row.Workflow != req.Workflow:
		return row, Elsewhere, nil
	case row.RecoveryPoint == keyrow.Finished:
		resp, err := decodeResponse(v.status, v.headers, v.body)
		if err != nil {
			return nil, 0, err
		}
		row.Response = resp
		return row, Replay, nil
	case row.Hold != "":
		return row, Parked, nil
	case row.Definition != req.Definition:
		return row, Elsewhere, nil
	default:
		return row, Held, nil
	}
}

func decodeResponse(status pgtype.Int4, headers, body []byte) (*keyrow.Response, error) {
	if !status.Valid {
		return nil, errors.New("finished key has no stored response")
	}
	resp := &keyrow.Response{Status: int(status.Int32), Body: body}
	switch {
	case bytes.Equal(headers, storedJSONContentType):
		resp.Header = http.Header{"Content-Type": {"application/json"}}
	case len(headers) > 0:
		if err := json.Unmarshal(headers, &resp.Header); err != nil {
			return nil, fmt.Errorf("decode stored headers: %w", err)
		}
	}
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	return resp, nil
}

// fenced wraps a data-modifying statement (which must end in RETURNING 1) so
// that it raises SQLSTATE AP001 when it matched no row. Raising, rather than
// reporting zero rows, matters when the statement is pipelined with COMMIT:
// the error aborts the transaction, so the COMMIT cannot persist the phase's
// other work after the lease was lost.
//
// Every fenced statement matches only an unfinished row (finished_at IS
// NULL) holding the caller's token, so a holder never writes to a finished
// key, even one that an earlier release closed as abandoned without
// clearing its lease.
func fenced(modify string) string {
	return "WITH fenced AS (" + modify + ") SELECT atomicphase_lease_lost() WHERE NOT EXISTS (SELECT FROM fenced)"
}

// fencedByID returns the two forms of a holder's fenced write, modify, a
// statement for byID that ends in RETURNING 1. On a single Postgres it is
// fenced: it raises when it matches no row. On Citus it is the plain
// UPDATE, which reports a lost lease by matching no row (see Write.Exec):
// a statement the holder sends on its own, never with COMMIT. Citus plans
// a statement on one table with the distribution column as a parameter on
// its fast path, and keeps the plan of a prepared one, but plans the
// fenced form's CTE in full on every call.
//
// The Citus form returns no row: its command tag tells whether it matched,
// and a row would be one more result for the coordinator to relay.
func fencedByID(modify string, n int) keySQL {
	s := byID(modify, n)
	s.plain = fenced(s.plain)
	s.distributed = strings.TrimSuffix(s.distributed, "\nRETURNING 1")
	s.counted = true
	return s
}

// committingByID returns the two forms of a holder's write that commits a
// phase, update, a statement for byID with n parameters that ends in its
// WHERE. Both raise when the lease is lost, so that the write may travel
// with COMMIT: on a single Postgres the fenced statement; on Citus a call
// of function, which runs update's distributed form, planned on Citus's
// fast path and kept, and raises when it matched no row
// (migrations/011_commit_functions.up.sql, whose bodies
// TestCitusCommitFunctionsRunTheStatementsOfTheStore compares with update).
//
// The call is an operand of IS NULL, not the whole select list: Citus
// creates the function on every node, and gives a prepared statement that
// is a bare call of such a function, with parameters, a generic plan it
// will never choose (it would delegate the call to a node by the
// arguments' values), so the coordinator would plan the call again on
// every commit. A select list that is more than the call keeps it out of
// that path, and the coordinator plans the statement once.
func committingByID(update string, n int, function string) keySQL {
	params := make([]string, n)
	for i := range params {
		params[i] = "$" + strconv.Itoa(i+1)
	}
	return keySQL{
		plain:       fenced(byID(update+"\nRETURNING 1", n).plain),
		distributed: "SELECT " + function + "(" + strings.Join(params, ", ") + ") IS NULL",
	}
}

// keySQL is a statement about the one key row a holder names by its id, in
// the two forms the key table needs.
//
// On a key table distributed with Citus the statement names the tenant too,
// so that it is planned as one task on the tenant's shard. On a single
// Postgres it must not: a prepared statement's generic plan, made while the
// table is new and has no statistics, finds the row through the unique
// index on (tenant, idempotency_key) by the tenant alone, and then reads
// every key of the tenant on every phase commit until an ANALYZE of the
// table makes the connection plan again. By the id alone the only index
// that fits is the primary key, which finds one row whatever the
// statistics say.
type keySQL struct {
	plain, distributed string
	// counted is set when the distributed form reports a lost lease by
	// matching no row rather than by raising (see fencedByID).
	counted bool
}

// tenantMark is where a statement given to byID names the tenant.
const tenantMark = "{tenant}"

// byID returns the two forms of sql, whose WHERE clauses find the row by
// its id and end at tenantMark: the distributed form adds the tenant as
// parameter n, the statement's last; the plain form takes no tenant (see
// keyArgs).
func byID(sql string, n int) keySQL {
	return keySQL{
		plain:       strings.ReplaceAll(sql, tenantMark, ""),
		distributed: strings.ReplaceAll(sql, tenantMark, " AND tenant = $"+strconv.Itoa(n)),
	}
}

// form returns the statement for a key table distributed or not.
func (s keySQL) form(distributed bool) string {
	if distributed {
		return s.distributed
	}
	return s.plain
}

// keyArgs returns the arguments of a keySQL statement, whose last is the
// tenant, for the form that distributed selects.
func keyArgs(distributed bool, args []any) []any {
	if distributed {
		return args
	}
	return args[:len(args)-1]
}

// advanceSQL moves the recovery point and state forward and renews the lease.
// The key has made progress: the failures of earlier runs, and the error
// the last of them ended with, no longer describe it.
// It waits on the row lock of a concurrent takeover and then re-checks the
// token against the newest row version (READ COMMITTED), so it never advances
// a row someone else now holds.
//
// It changes no indexed column and no column of an index predicate (which
// is why it leaves last_run_at alone, and why Citus's index of unfinished
// keys tests finished_at rather than recovery_point), so Postgres can
// update the row in place as a HOT update, without new index entries.
//
// It keeps the row's rules by construction: the lease it renews has a token
// (the one it matched), and the recovery point it sets is a phase name,
// never keyrow.Finished (checked by AdvanceArgs).
var advanceSQL = committingByID(advanceUpdate, 7, "atomicphase_advance_from")

// advanceUpdate is advanceSQL's UPDATE, which atomicphase_advance_from runs
// on Citus.
const advanceUpdate = `
UPDATE idempotency_keys
SET recovery_point = $3, phase_state = $4, hold = NULL, failures = 0, last_error = NULL, call_pending = NULL,
    lock_expires_at = now() + $5::interval
WHERE id = $1 AND lock_token = $2 AND recovery_point = $6 AND finished_at IS NULL{tenant}`

// finishSQL stores the response, marks the key finished and frees the lease.
// It sets the recovery point, the finish time and the response status (never
// NULL: checked by finishArgs) together, and clears the token and its expiry
// together.
var finishSQL = committingByID(finishUpdate, 8, "atomicphase_finish_from")

// finishUpdate is finishSQL's UPDATE, which atomicphase_finish_from runs on
// Citus.
const finishUpdate = `
UPDATE idempotency_keys
SET recovery_point = 'finished', phase_state = $3, finished_at = now(),
    response_status = $4, response_headers = $5, response_body = $6,
    locked_at = NULL, lock_expires_at = NULL, lock_token = NULL, last_error = NULL, hold = NULL,
    failures = 0, call_pending = NULL
WHERE id = $1 AND lock_token = $2 AND recovery_point = $7 AND finished_at IS NULL{tenant}`

// releaseSQL frees the lease and keeps the recovery point, so the next run
// resumes after the last committed phase. A non-empty hold parks the key.
// $5 is 1 when the run that failed was the completer's, so that only the
// completer's own failures count towards giving up on a key. $6 clears the
// pending call, when the run learnt that it did not happen. The key is
// idle from now; releaseCutSQL keeps its last run instead (see EndedCut).
//
// On a single Postgres it also makes the key due at once in the
// completer's watch, when it is there: a run that made progress reset the
// key's failures, so the key may be due sooner than the watch said, by
// the backoff of failures it no longer counts. The completer's next claim
// looks at the key and moves it to when it is due.
var releaseSQL = releaseSetting("now()")

// releaseCutSQL is releaseSQL for a run that ended as EndedCut. (Citus
// refuses now() in a CASE of an UPDATE, so the two are statements of
// their own.)
var releaseCutSQL = releaseSetting("last_run_at")

// releaseSetting returns releaseSQL with the key's last run set to lastRun.
func releaseSetting(lastRun string) keySQL {
	return watchingRelease(fencedByID(`
UPDATE idempotency_keys
SET locked_at = NULL, lock_expires_at = NULL, lock_token = NULL, last_run_at = `+lastRun+`,
    last_error = nullif($3, ''), hold = nullif($4, ''), failures = failures + $5::int,
    call_pending = CASE WHEN $6 THEN NULL ELSE call_pending END
WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL{tenant}
RETURNING 1`, 7))
}

// watchingRelease adds to s's single-Postgres form the update of the
// watch that releaseSQL describes.
func watchingRelease(s keySQL) keySQL {
	s.plain = strings.Replace(s.plain, "WITH fenced AS (",
		"WITH watched AS (UPDATE atomicphase_watch SET due_at = now() WHERE id = $1 AND due_at > now()), fenced AS (", 1)
	return s
}

// adoptSQL moves a key the caller holds to the definition of the workflow
// that adopted it, at the recovery point it resumes from. It is fenced like
// every other write of a holder.
var adoptSQL = fencedByID(`
UPDATE idempotency_keys
SET definition = $3, recovery_point = $4
WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL{tenant}
RETURNING 1`, 5)

// Adopt records that the key the holder identified by token holds now runs
// under definition, from recovery point point. It returns
// keyrow.ErrLeaseLost, and changes nothing, when the token no longer
// matches.
func Adopt(ctx context.Context, q Querier, h Holder, definition, point string) error {
	if err := keyrow.CheckName(point); err != nil || point == keyrow.Finished {
		return fmt.Errorf("store: adopt: invalid recovery point %q", point)
	}
	return holderWrite(adoptSQL, h.Distributed,
		[]any{uuidArg(h.ID), uuidArg(h.Token), definition, point, h.Tenant}).Exec(ctx, q)
}

// markCallSQL records, before a foreign call that is not safe to repeat,
// that the call may be under way, and renews the lease as renewSQL does.
// Unlike a renewal it waits for the WAL flush: the mark must outlive a crash
// of the server as surely as the call's effect outlives one of the caller.
var markCallSQL = byID(`
UPDATE idempotency_keys
SET lock_expires_at = now() + $3::interval, call_pending = $4
WHERE id = $1 AND lock_token = $2 AND recovery_point = $5 AND finished_at IS NULL{tenant}
RETURNING 1`, 6)

// renewSQL extends a live lease by ttl from now. It is fenced like every
// other write. It returns a row when it matched, not the time left: that is
// ttl, as now() is the same all through a statement, and a distributed
// table refuses now() in RETURNING.
//
// Like acquireSQL, it commits without waiting for the WAL flush. A crash can
// lose only the renewals of its last moments (the WAL writer flushes
// asynchronous commits within three wal_writer_delay), which leaves the
// lease as the holder's previous write set it, under the same token; the
// proof a renewal gave, that the holder still held the key when it ran,
// stands.
const renewSQL = `
UPDATE idempotency_keys
SET lock_expires_at = now() + $3::interval
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lease_only
WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL
RETURNING 1`

// renewDistributedSQL is renewSQL for a key table distributed with Citus,
// which refuses a volatile function (set_config) in an UPDATE's FROM, and
// would apply the setting on the coordinator only: the renewal waits for
// the WAL flush on the key's shard.
const renewDistributedSQL = `
UPDATE idempotency_keys
SET lock_expires_at = now() + $3::interval
WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL AND tenant = $4
RETURNING 1`

// Write is one fenced write of a holder, ready to be sent on its own (Exec)
// or queued in a batch with COMMIT (QueuedQuery). When the holder's token
// no longer matches it changes nothing, and Exec returns
// keyrow.ErrLeaseLost.
type Write struct {
	sql  string
	args []any
	// confirmed is set for the form that reports a lost lease by matching
	// no row, rather than by raising (see fencedByID).
	confirmed bool
}

// holderWrite is the Write of s, a fencedByID or committingByID statement,
// in the form for a key table distributed or not, with args, whose last is
// the tenant.
func holderWrite(s keySQL, distributed bool, args []any) Write {
	return Write{sql: s.form(distributed), args: keyArgs(distributed, args), confirmed: distributed && s.counted}
}

// Exec sends w and returns keyrow.ErrLeaseLost when it found the lease
// lost.
func (w Write) Exec(ctx context.Context, q Querier) error {
	tag, err := q.Exec(ctx, w.sql, w.args...)
	if err != nil {
		return AsLeaseLost(err)
	}
	if w.confirmed && tag.RowsAffected() == 0 {
		return keyrow.ErrLeaseLost
	}
	return nil
}

// QueuedQuery returns w as a query to put in a batch, in front of COMMIT:
// when the lease is lost it raises, the error aborts the transaction, and
// the COMMIT persists nothing. Only the writes that commit a phase
// (AdvanceWrite, FinishWrite) are made for it.
func (w Write) QueuedQuery() pgx.QueuedQuery { return pgx.QueuedQuery{SQL: w.sql, Arguments: w.args} }

// AdvanceWrite is the write that commits the recovery point and state of the
// holder identified by token, and renews its lease for ttl, when the key is
// still at h.Point. point must be a phase name: neither keyrow.Started nor
// keyrow.Finished.
func AdvanceWrite(h Holder, point string, state []byte, ttl time.Duration) (Write, error) {
	return advanceWrite(h.Distributed, uuidArg(h.ID), uuidArg(h.Token), h.Tenant, h.Point, point, state, ttl, intervalArg(ttl))
}

// id and token are uuidArg values, tenant a string and ttlArg ttl's intervalArg, passed
// as they are to pgx; distributed selects the statement's form (keySQL).
// from is the recovery point the write leaves, which the key must be at.
func advanceWrite(distributed bool, id, token, tenant any, from, point string, state []byte, ttl time.Duration, ttlArg any) (Write, error) {
	if err := keyrow.CheckName(point); err != nil {
		return Write{}, fmt.Errorf("store: advance: recovery point %w", err)
	}
	if point == keyrow.Started || point == keyrow.Finished {
		return Write{}, fmt.Errorf("store: advance: %q is not a phase's recovery point", point)
	}
	if ttl <= 0 {
		return Write{}, errors.New("store: advance: lease TTL must be positive")
	}
	return holderWrite(advanceSQL, distributed, []any{id, token, point, jsonOrNull(state), ttlArg, from, tenant}), nil
}

// Advance sends AdvanceWrite on its own. It returns ErrLeaseLost, and
// changes nothing, when the token no longer matches.
func Advance(ctx context.Context, q Querier, h Holder, point string, state []byte, ttl time.Duration) error {
	w, err := AdvanceWrite(h, point, state, ttl)
	if err != nil {
		return err
	}
	return w.Exec(ctx, q)
}

// FinishWrite is the write that stores resp as the key's final response,
// marks the key finished and frees the lease of the holder identified by
// token, when the key is still at h.Point. resp.Status must be a valid HTTP
// status (100 to 599).
func FinishWrite(h Holder, state []byte, resp keyrow.Response) (Write, error) {
	return finishWrite(h.Distributed, uuidArg(h.ID), uuidArg(h.Token), h.Tenant, h.Point, state, resp)
}

func finishWrite(distributed bool, id, token, tenant any, from string, state []byte, resp keyrow.Response) (Write, error) {
	if resp.Status < 100 || resp.Status > 599 {
		return Write{}, fmt.Errorf("store: finish: invalid status %d", resp.Status)
	}
	headers, err := encodeHeader(resp.Header)
	if err != nil {
		return Write{}, err
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	return holderWrite(finishSQL, distributed, []any{id, token, jsonOrNull(state), resp.Status, headers, body, from, tenant}), nil
}

// Finish sends FinishWrite on its own. It returns ErrLeaseLost, and changes
// nothing, when the token no longer matches.
func Finish(ctx context.Context, q Querier, h Holder, state []byte, resp keyrow.Response) error {
	w, err := FinishWrite(h, state, resp)
	if err != nil {
		return err
	}
	return w.Exec(ctx, q)
}

// jsonContentType is the encoding of the header most responses carry alone,
// kept encoded once, and storedJSONContentType the same as jsonb gives it
// back, so that a replay need not decode it.
var (
	jsonContentType       = []byte(`{"Content-Type":["application/json"]}`)
	storedJSONContentType = []byte(`{"Content-Type": ["application/json"]}`)
)

// encodeHeader returns the JSON stored for a response header, nil for none.
func encodeHeader(h http.Header) ([]byte, error) {
	switch {
	case len(h) == 0:
		return nil, nil
	case len(h) == 1 && len(h["Content-Type"]) == 1 && h["Content-Type"][0] == "application/json":
		return jsonContentType, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("store: finish: encode headers: %w", err)
	}
	return b, nil
}

// Ending is how a run that frees its lease unfinished ended, as the
// completer judges the key by it.
type Ending int

const (
	// EndedIdle: the key is idle from now, and counts no failure of the
	// completer's: a client's run, or a key handed back.
	EndedIdle Ending = iota
	// EndedFailed: the completer's run failed: the failure counts towards
	// giving up on the key, and its backoff runs from now.
	EndedFailed
	// EndedCut: the completer's run was cut short by its process stopping:
	// no failure counts, and the key keeps its last run (which the claim
	// left as it was), so that it is due at once for another completer.
	EndedCut
)

// Release frees the lease and keeps the recovery point, recording lastErr
// for operators, with a NUL and bytes that are not UTF-8 escaped (see
// storableText). A non-empty hold parks the key so that neither clients nor
// the completer run it until someone acts. end says how the run ended for
// the completer. It returns keyrow.ErrLeaseLost, and changes nothing, when
// the token no longer matches.
//
// callFailed clears the key's pending call: the run knows that the call did
// not happen (its provider refused it), so the next run may send it again.
func Release(ctx context.Context, q Querier, h Holder, lastErr string, hold keyrow.Hold, end Ending, callFailed bool) error {
	switch hold {
	case "", keyrow.HoldUnknown, keyrow.HoldDead:
	default:
		return fmt.Errorf("store: release: unknown hold %q", hold)
	}
	failed, sql := 0, releaseSQL
	switch end {
	case EndedFailed:
		failed = 1
	case EndedCut:
		sql = releaseCutSQL
	}
	return holderWrite(sql, h.Distributed,
		[]any{uuidArg(h.ID), uuidArg(h.Token), storableText(lastErr), string(hold), failed, callFailed, h.Tenant}).Exec(ctx, q)
}

// releaseTimeout bounds ReleaseDetached.
const releaseTimeout = 5 * time.Second

// ReleaseDetached is Release for a run that is ending, whatever ended it: it
// runs even when ctx is cancelled (a client hung up, a deadline passed,
// shutdown), bounded by its own short timeout. A lease it fails to free is
// not lost work: it expires by itself and the key resumes then. Like
// Release, it returns keyrow.ErrLeaseLost, having changed nothing, when
// another run took the key over.
func ReleaseDetached(ctx context.Context, q Querier, h Holder, lastErr string, hold keyrow.Hold, end Ending, callFailed bool) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return Release(rctx, q, h, lastErr, hold, end, callFailed)
}

// Renew extends the holder's lease to ttl from now, by the database clock,
// and returns the time left. It returns ErrLeaseLost when the token no
// longer matches.
func Renew(ctx context.Context, q Querier, h Holder, ttl time.Duration) (time.Duration, error) {
	return renew(ctx, q, h, ttl, "")
}

// renew is Renew, which also records, with markCallSQL, that the foreign
// call of phase may be under way when phase is not empty.
func renew(ctx context.Context, q Querier, h Holder, ttl time.Duration, phase string) (time.Duration, error) {
	if ttl <= 0 {
		return 0, errors.New("store: renew: lease TTL must be positive")
	}
	var one int
	var err error
	switch {
	case phase != "":
		err = q.QueryRow(ctx, markCallSQL.form(h.Distributed),
			keyArgs(h.Distributed, []any{uuidArg(h.ID), uuidArg(h.Token), intervalArg(ttl), phase, h.Point, h.Tenant})...).Scan(&one)
	case h.Distributed:
		err = q.QueryRow(ctx, renewDistributedSQL, uuidArg(h.ID), uuidArg(h.Token), intervalArg(ttl), h.Tenant).Scan(&one)
	default:
		err = q.QueryRow(ctx, renewSQL, uuidArg(h.ID), uuidArg(h.Token), intervalArg(ttl)).Scan(&one)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, keyrow.ErrLeaseLost
	}
	if err != nil {
		return 0, fmt.Errorf("store: renew: %w", err)
	}
	return ttl, nil
}

// AsLeaseLost maps the error a fenced statement raises when its token no
// longer matches to ErrLeaseLost, and returns other errors unchanged.
func AsLeaseLost(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == leaseLostCode {
		return keyrow.ErrLeaseLost
	}
	return err
}

func jsonOrNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

// uuidArg returns u as a statement argument. pgx encodes a pgtype.UUID as
// it is; a [16]byte it first wraps in a value of its own, which costs an
// allocation on every statement, and a uuid.UUID it would send as text.
func uuidArg(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// intervalArg returns d as an interval argument, in microseconds as pgx
// encodes a time.Duration, which it too would first wrap in a value of its
// own.
func intervalArg(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}
