package store_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// TestAKeyWhoseTransactionCommitsLateIsStillFound: a key's creating
// transaction draws its xid when it first writes and may commit long after
// keys of later xids have committed. The walk must not pass it while it
// may still commit, or the completer would never see the key: it stays
// behind the oldest running transaction, and finds the key once it has
// committed, with the keys committed after it.
func TestAKeyWhoseTransactionCommitsLateIsStillFound(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "a distributed key table is not walked; the completer reads its index of unfinished keys")
	ctx := context.Background()
	db := pgtest.Pool(t)
	const abandoned = `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
    created_at, last_run_at)
VALUES ('acme', $1, 'test', '\x00', '{}', now() - interval '1 hour', now() - interval '1 hour')`
	late, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var lateXid uint64
	if _, err := late.Exec(ctx, abandoned, "late"); err != nil {
		t.Fatal(err)
	}
	if err := late.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&lateXid); err != nil {
		t.Fatal(err)
	}
	// Keys of later transactions commit first, and are due.
	for _, key := range []string{"early-1", "early-2"} {
		if _, err := db.Exec(ctx, abandoned, key); err != nil {
			t.Fatal(err)
		}
	}
	claim := store.ClaimParams{Workflows: []string{"test"}, Limit: 10, StuckAfter: time.Minute, TTL: ttl}
	for range 3 {
		rows, err := store.Claim(ctx, db, claim)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 0 {
			t.Fatalf("claimed %d keys behind a running transaction that created a key; the walk passed it", len(rows))
		}
		var position uint64
		if err := db.QueryRow(ctx, `SELECT position::text::bigint FROM atomicphase_walk`).Scan(&position); err != nil {
			t.Fatal(err)
		}
		if position > lateXid {
			t.Fatalf("the walk is at %d, past %d, a transaction still running", position, lateXid)
		}
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := store.Claim(ctx, db, claim)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rows {
		got[r.Key] = true
	}
	if len(rows) != 3 || !got["late"] || !got["early-1"] || !got["early-2"] {
		t.Fatalf("claimed %v once the late transaction committed; want late, early-1 and early-2", got)
	}
}

// TestTheWalkWatchesOnlyKeysUnfinishedAfterTheGrace: keys that finish
// within the grace never enter the watch, and a watched key leaves it once
// a claim finds it finished.
func TestTheWalkWatchesOnlyKeysUnfinishedAfterTheGrace(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "a distributed key table is not walked")
	ctx := context.Background()
	db := pgtest.Pool(t)
	for _, key := range []string{"done-1", "done-2", "done-3"} {
		_, row := acquire(t, db, request(t, "acme", key, `{"amount":100}`))
		if err := store.Finish(ctx, db, row.Holder(), []byte(`{}`), keyrow.Response{Status: http.StatusCreated, Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	_, crashed := acquire(t, db, request(t, "acme", "crashed", `{"amount":100}`))
	// With an hour's grace the walk passes the finished keys, which stay
	// finished, and waits at the crashed one, a second old.
	walk := func(grace time.Duration) (passed, watched int) {
		t.Helper()
		for range 3 {
			s, err := store.Walk(ctx, db, 100, grace)
			if err != nil {
				t.Fatal(err)
			}
			passed, watched = passed+s.Passed, watched+s.Watched
		}
		return passed, watched
	}
	if passed, watched := walk(time.Hour); passed != 3 || watched != 0 {
		t.Fatalf("a walk with an hour's grace passed %d keys and watched %d; want the 3 finished ones passed, none watched", passed, watched)
	}
	if passed, watched := walk(0); passed != 1 || watched != 1 {
		t.Fatalf("the walk without grace passed %d more keys and watched %d; want the crashed one passed and watched", passed, watched)
	}
	var watchedID string
	if err := db.QueryRow(ctx, `SELECT id::text FROM atomicphase_watch`).Scan(&watchedID); err != nil {
		t.Fatal(err)
	}
	if watchedID != crashed.ID.String() {
		t.Fatalf("the watch holds %s, want the crashed key %s", watchedID, crashed.ID)
	}
	// The crashed key's client comes back and finishes it: the next claim
	// drops it from the watch.
	expire(t, db, "acme", "crashed")
	out, resumed := acquire(t, db, request(t, "acme", "crashed", `{"amount":100}`))
	if out != store.Resumed {
		t.Fatalf("acquire of the crashed key = %v, want resumed", out)
	}
	if err := store.Finish(ctx, db, resumed.Holder(), []byte(`{}`), keyrow.Response{Status: http.StatusCreated, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	timePassed(t, db)
	if _, err := store.Claim(ctx, db, store.ClaimParams{Workflows: []string{"test"}, Limit: 10, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM atomicphase_watch`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d keys left in the watch after a claim found the only one finished", left)
	}
}

// TestAFinishIsAHOTUpdate: no index of the key table names a column the
// finish changes, so storing a key's response rewrites its row in the same
// page and adds no index entry; so does a phase commit. Counted in the
// transaction's own statistics, which are exact.
func TestAFinishIsAHOTUpdate(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "on a distributed key table the index of unfinished keys names finished_at")
	ctx := context.Background()
	db := pgtest.Pool(t)
	_, row := acquire(t, db, request(t, "acme", "k1", `{"amount":100}`))
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := store.Advance(ctx, tx, row.Holder(), "charged", []byte(`{"charge":"ch_1"}`), ttl); err != nil {
		t.Fatal(err)
	}
	h := row.Holder()
	h.Point = "charged"
	if err := store.Finish(ctx, tx, h, []byte(`{"charge":"ch_1"}`), keyrow.Response{Status: http.StatusCreated, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	var updates, hot int
	if err := tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
        WHERE relid = 'idempotency_keys'::regclass`).Scan(&updates, &hot); err != nil {
		t.Fatal(err)
	}
	if updates != 2 || hot != 2 {
		t.Fatalf("a phase commit and a finish made %d updates, %d of them HOT; want both HOT", updates, hot)
	}
}

// TestAnOpenTransactionInAnotherDatabaseHoldsNothingBack: a write
// transaction of another database of the cluster cannot create a key
// here, so the walk passes it, and a key that crashed meanwhile is found.
func TestAnOpenTransactionInAnotherDatabaseHoldsNothingBack(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "a distributed key table is not walked")
	ctx := context.Background()
	db := pgtest.Pool(t)
	otherDSN, drop, err := pgtest.NewDatabase(ctx, "elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drop() })
	other, err := pgx.Connect(ctx, otherDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close(context.Background()) })
	open, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx) //nolint:errcheck // the transaction stays open until the test ends
	if _, err := open.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params, created_at, last_run_at)
VALUES ('acme', 'crashed', 'test', '\x00', '{}', now() - interval '1 hour', now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	rows, err := store.Claim(ctx, db, store.ClaimParams{Workflows: []string{"test"}, Limit: 10, StuckAfter: time.Minute, TTL: ttl})
	if err != nil || len(rows) != 1 || rows[0].Key != "crashed" {
		t.Fatalf("claim = %+v, %v, while another database holds a transaction open; want the crashed key", rows, err)
	}
}

// TestAClaimWalksOnWhenAnotherProcessMovedTheWalk: after an outage the
// backlog lies ahead of the walk, and two completers claim at once. The
// step of one waits for the other's step, whose position it then finds
// moved: the claim must walk on from there, not read a watch still
// without the backlog, find nothing due and leave its completer idle for
// an Interval while thousands of keys are.
func TestAClaimWalksOnWhenAnotherProcessMovedTheWalk(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "a distributed key table is not walked")
	ctx := context.Background()
	db := pgtest.Pool(t)
	// More finished keys than a step of the claim's walk reads, of one
	// transaction, then, in a later one, the backlog.
	var finishedXid uint64
	err := db.QueryRow(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
    created_at, last_run_at, finished_at)
SELECT 'acme', 'done-' || i, 'test', '\x00', '{}', now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(1, $1::int) AS i
RETURNING pg_current_xact_id()::text::bigint`, store.WalkBatch+1).Scan(&finishedXid)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
    created_at, last_run_at)
SELECT 'acme', 'abandoned-' || i, 'test', '\x00', '{}', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(1, 10) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	// Steps of one key each record a bound past both transactions and
	// bring the walk up to the finished keys' transaction.
	position := func() uint64 {
		t.Helper()
		var p uint64
		if err := db.QueryRow(ctx, `SELECT position::text::bigint FROM atomicphase_walk`).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for range 2 {
		if _, err := store.Walk(ctx, db, 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	if p := position(); p != finishedXid {
		t.Fatalf("the walk is at %d, want the finished keys' transaction %d", p, finishedXid)
	}
	// Another process's step passes the finished keys, and has not
	// committed when the claim's step reads the walk.
	other, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if s, err := store.Walk(ctx, other, 1, 0); err != nil || s.Passed != store.WalkBatch+1 || s.Watched != 0 {
		t.Fatalf("the other process's step = %+v, %v; want the %d finished keys passed, none watched", s, err, store.WalkBatch+1)
	}
	done := make(chan error, 1)
	var rows []*store.Row
	go func() {
		var err error
		rows, err = store.Claim(ctx, db, store.ClaimParams{Workflows: []string{"test"}, Limit: 4, StuckAfter: time.Minute, TTL: ttl})
		done <- err
	}()
	// pg_stat_activity keeps the statement's first kilobyte: its start.
	waitForLock(t, db, "WITH nth AS", done)
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("the claim took %d keys of a backlog of 10 behind the other process's step, want 4", len(rows))
	}
	if p := position(); p <= finishedXid {
		t.Fatalf("the walk stayed at %d after the claim", p)
	}
}
