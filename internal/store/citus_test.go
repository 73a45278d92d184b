package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// distributed is request for a key table distributed with Citus.
func distributed(t testing.TB, tenant, key, body string) store.Request {
	req := request(t, tenant, key, body)
	req.Distributed = true
	return req
}

// TestCitusAcquireMeetsEveryOutcome runs the one-statement acquire on a key
// table distributed by tenant: Citus refuses the single Postgres's takeover
// (now() in ON CONFLICT), and the distributed form must tell every case
// apart as the plain one does.
func TestCitusAcquireMeetsEveryOutcome(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()

	out, row := acquire(t, db, distributed(t, "acme", "k1", `{"amount":1}`))
	if out != store.New || row.LockToken == uuid.Nil || !row.Distributed {
		t.Fatalf("first acquire = %v, token %v, distributed %v; want New with a token", out, row.LockToken, row.Distributed)
	}
	held, hrow := acquire(t, db, distributed(t, "acme", "k1", `{"amount":1}`))
	if held != store.Held || hrow.LeaseLeft <= 0 || hrow.LeaseLeft > ttl || hrow.LockToken != uuid.Nil {
		t.Fatalf("duplicate = %v, lease left %v, token %v; want Held with at most %v left and no token", held, hrow.LeaseLeft, hrow.LockToken, ttl)
	}
	if mis, _ := acquire(t, db, distributed(t, "acme", "k1", `{"amount":2}`)); mis != store.Mismatch {
		t.Fatalf("other payload = %v, want Mismatch", mis)
	}
	if err := store.Advance(ctx, db, row.Holder(), "charged", []byte(`{"charge":"ch_1"}`), ttl); err != nil {
		t.Fatalf("advance: %v", err)
	}
	if err := store.Release(ctx, db, row.Holder(), "provider down", "", store.EndedIdle, false); err != nil {
		t.Fatalf("release: %v", err)
	}
	plain := distributed(t, "acme", "k1", `{"amount":1}`)
	plain.Distributed = false
	if _, _, err := store.Acquire(ctx, db, plain); err == nil {
		t.Fatal("the plain takeover ran on a distributed table; want Citus to refuse it")
	}
	res, rrow := acquire(t, db, distributed(t, "acme", "k1", `{"amount":1}`))
	if res != store.Resumed || rrow.RecoveryPoint != "charged" || string(rrow.State) != `{"charge": "ch_1"}` ||
		rrow.Attempts != 2 || rrow.LastError != "provider down" || string(rrow.Params) != `{"amount": 1}` {
		t.Fatalf("after release = %v %+v; want Resumed at charged with the state, params and last error", res, rrow)
	}
	if _, err := store.Renew(ctx, db, rrow.Holder(), ttl); err != nil {
		t.Fatalf("renew: %v", err)
	}
	resp := keyrow.Response{Status: 201, Body: []byte(`{"id":"r1"}`)}
	if err := store.Finish(ctx, db, rrow.Holder(), nil, resp); err != nil {
		t.Fatalf("finish: %v", err)
	}
	rep, prow := acquire(t, db, distributed(t, "acme", "k1", `{"amount":1}`))
	if rep != store.Replay || prow.Response == nil || prow.Response.Status != 201 || string(prow.Response.Body) != `{"id":"r1"}` {
		t.Fatalf("after finish = %v %+v; want the stored 201 replayed", rep, prow.Response)
	}
	// The old holder is fenced out on every write.
	if err := store.Advance(ctx, db, row.Holder(), "shipped", nil, ttl); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("stale advance = %v, want ErrLeaseLost", err)
	}
	if _, err := store.Renew(ctx, db, row.Holder(), ttl); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("stale renew = %v, want ErrLeaseLost", err)
	}
	// Another tenant's key of the same name is another key.
	if other, _ := acquire(t, db, distributed(t, "globex", "k1", `{"amount":2}`)); other != store.New {
		t.Fatalf("same key, other tenant = %v, want New", other)
	}
}

// TestCitusLostLeaseRollsBackTheBusinessRow: a phase's business row, in a
// table co-located with the keys, commits only with the fenced advance.
func TestCitusLostLeaseRollsBackTheBusinessRow(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE TABLE orders (tenant text NOT NULL, key_id uuid NOT NULL, note text, PRIMARY KEY (tenant, key_id))`,
		`SELECT create_distributed_table('orders', 'tenant', colocate_with => 'idempotency_keys')`,
		`ALTER TABLE orders ADD FOREIGN KEY (tenant, key_id) REFERENCES idempotency_keys (tenant, id) ON DELETE CASCADE`,
	} {
		if _, err := db.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	_, old := acquire(t, db, distributed(t, "acme", "k1", `{}`))
	expireLease(t, db, "acme", "k1")
	if out, _ := acquire(t, db, distributed(t, "acme", "k1", `{}`)); out != store.Resumed {
		t.Fatalf("takeover = %v, want Resumed", out)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2, 'late')`, "acme", old.ID); err != nil {
		t.Fatalf("business insert: %v", err)
	}
	if err := store.Advance(ctx, tx, old.Holder(), "ordered", nil, ttl); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("advance of the old holder = %v, want ErrLeaseLost", err)
	}
	_ = tx.Rollback(ctx)
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("orders after the fenced rollback = %d, %v; want 0", n, err)
	}
}

// TestCitusASchemaWithoutTheCommitFunctionsIsRefusedBeforeAnyRun: on a
// distributed key table whose schema predates migration 013, every phase's
// commit would fail; the client's first check says to migrate instead.
func TestCitusASchemaWithoutTheCommitFunctionsIsRefusedBeforeAnyRun(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	if ok, err := store.IsDistributed(ctx, db); !ok || err != nil {
		t.Fatalf("IsDistributed = %v, %v; want true, nil", ok, err)
	}
	if _, err := db.Exec(ctx, `DROP FUNCTION atomicphase_advance_from`); err != nil {
		t.Fatal(err)
	}
	_, err := store.IsDistributed(ctx, db)
	if err == nil || !strings.Contains(err.Error(), "atomicphase.Migrate") {
		t.Fatalf("IsDistributed without atomicphase_advance_from = %v, want an error that says to migrate", err)
	}
}

// expireLease ends the lease on the key by moving its expiry into the past.
func expireLease(t testing.TB, db *pgxpool.Pool, tenant, key string) {
	t.Helper()
	_, err := db.Exec(context.Background(), `UPDATE idempotency_keys
        SET lock_expires_at = now() - interval '1 second', last_run_at = now() - interval '1 hour'
        WHERE tenant = $1 AND idempotency_key = $2`, tenant, key)
	if err != nil {
		t.Fatal(err)
	}
	timePassed(t, db)
}

// TestCitusTwoCompletersClaimEveryKeyOnce: Citus refuses the claim's
// FOR UPDATE SKIP LOCKED over many shards; two completers claiming at once
// over thousands of abandoned keys of many tenants must take each key
// exactly once, and leave none.
func TestCitusTwoCompletersClaimEveryKeyOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 8 })
	ctx := context.Background()
	const keys = 2000
	_, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (id, tenant, idempotency_key, workflow, request_fingerprint, request_params, last_run_at)
SELECT gen_random_uuid(), 'tenant-' || (i % 50), 'k' || i, 'test', '\x00', '{}', now() - interval '1 hour'
FROM generate_series(1, $1) AS i`, keys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, db, store.ClaimParams{Workflows: []string{"test"}, Limit: 10, TTL: ttl}); err == nil {
		t.Fatal("the single-Postgres claim ran on a distributed table; want Citus to refuse it")
	}
	var mu sync.Mutex
	claimedBy := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for c := range 2 {
		wg.Go(func() {
			for {
				rows, err := store.Claim(ctx, db, store.ClaimParams{Workflows: []string{"test"}, Limit: 100,
					StuckAfter: time.Minute, TTL: time.Hour, Distributed: true})
				if err != nil {
					errs <- err
					return
				}
				if len(rows) == 0 {
					return
				}
				mu.Lock()
				for _, r := range rows {
					if prev, ok := claimedBy[r.ID]; ok {
						errs <- fmt.Errorf("key %s claimed by completer %d and %d", r.Key, prev, c)
					}
					if !r.Distributed || r.LockToken == uuid.Nil {
						errs <- fmt.Errorf("claimed row %+v has no token or is not marked distributed", r)
					}
					claimedBy[r.ID] = c
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	per := [2]int{}
	for _, c := range claimedBy {
		per[c]++
	}
	if len(claimedBy) != keys {
		t.Fatalf("claimed %d keys (%d and %d), want all %d", len(claimedBy), per[0], per[1], keys)
	}
	t.Logf("completer 0 claimed %d keys, completer 1 %d", per[0], per[1])
	var free int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE lock_token IS NULL`).Scan(&free); err != nil || free != 0 {
		t.Fatalf("%d keys left unclaimed (%v)", free, err)
	}
}

// TestCitusReaperAndExpiryWork: the reaper's delete and the expiry's update
// lock rows with SKIP LOCKED on a single Postgres, which Citus refuses over
// many shards; their distributed forms close abandoned keys and delete
// finished ones past retention, and leave the rest alone.
func TestCitusReaperAndExpiryWork(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	_, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (id, tenant, idempotency_key, workflow, request_fingerprint, request_params,
    created_at, last_run_at, finished_at, recovery_point, response_status)
SELECT gen_random_uuid(), 'tenant-' || (i % 7), 'k' || i, 'test', '\x00', '{}', now() - interval '3 days', now() - interval '3 days',
       CASE WHEN i % 3 = 0 THEN now() - interval '3 days' WHEN i % 3 = 1 THEN now() END,
       CASE WHEN i % 3 = 2 THEN 'started' ELSE 'finished' END,
       CASE WHEN i % 3 = 2 THEN NULL ELSE 201 END
FROM generate_series(1, 300) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	// 100 old finished (i%3=0), 100 fresh finished (1), 100 abandoned (2).
	if _, err := store.Reap(ctx, db, "test", 24*time.Hour, 1000, false); err == nil {
		t.Fatal("the single-Postgres reap ran on a distributed table; want Citus to refuse it")
	}
	expired, err := store.Expire(ctx, db, "", 24*time.Hour, 1000, true)
	if err != nil || expired != 100 {
		t.Fatalf("expire = %d, %v; want the 100 abandoned keys", expired, err)
	}
	total := 0
	for {
		n, err := store.Reap(ctx, db, "test", 24*time.Hour, 64, true)
		if err != nil {
			t.Fatalf("reap: %v", err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	// The expired keys finished now: their retention starts now.
	if total != 100 {
		t.Fatalf("reaped %d keys, want the 100 finished over a day ago", total)
	}
	var left int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&left); err != nil || left != 200 {
		t.Fatalf("%d keys left (%v), want 200", left, err)
	}
}

// TestCitusCountAddsUpWhileKeysFinish: on Citus each shard is read in one
// snapshot of its own, and a count must still see every key once while
// keys finish.
func TestCitusCountAddsUpWhileKeysFinish(t *testing.T) {
	t.Parallel()
	countAddsUpWhileKeysFinish(t, pgtest.CitusPool(t, nil))
}

// TestCitusUnfinishedKeysAddUpWhileKeysGoOnHold: on Citus too, a key
// that goes on hold during a count of the unfinished keys, or of each
// definition's, is counted once.
func TestCitusUnfinishedKeysAddUpWhileKeysGoOnHold(t *testing.T) {
	t.Parallel()
	unfinishedAddsUpWhileKeysGoOnHold(t, pgtest.CitusPool(t, nil))
}

// TestCitusTheStatusHistoryIsRecordedOnEveryNode: on Citus the status
// history and the backlog's counts are reference tables, so the completer
// of a process connected to a worker records a minute, one connected to
// the coordinator then finds it recorded and adds nothing, and both read
// and trim the same minutes and counts.
func TestCitusTheStatusHistoryIsRecordedOnEveryNode(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	worker := pgtest.CitusWorkerPool(t, db)
	ctx := context.Background()
	var method string
	err := db.QueryRow(ctx, `SELECT partmethod FROM pg_dist_partition WHERE logicalrelid = 'atomicphase_status_history'::regclass`).Scan(&method)
	if err != nil || method != "n" {
		t.Fatalf("the status history's partition method = %q, %v; want n, a reference table", method, err)
	}
	const stuck = 40
	_, err = db.Exec(ctx, `
INSERT INTO idempotency_keys (id, tenant, idempotency_key, workflow, request_fingerprint, request_params, last_run_at)
SELECT gen_random_uuid(), 'tenant-' || (i % 8), 'k' || i, 'orders', '\x00', '{}', now() - interval '1 hour'
FROM generate_series(1, $1) AS i`, stuck)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := store.RecordHistory(ctx, worker, []string{"orders", "refunds"}, time.Minute); err != nil || n != 10 {
		t.Fatalf("RecordHistory through the worker: %d rows, %v; want 5 statuses of 2 workflows", n, err)
	}
	// Citus reports the rows it sent, conflicting or not: the table says
	// what was kept.
	if _, err := store.RecordHistory(ctx, db, []string{"orders", "refunds"}, time.Minute); err != nil {
		t.Fatalf("RecordHistory through the coordinator in the same minute: %v", err)
	}
	var rows int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM atomicphase_status_history`).Scan(&rows); err != nil || rows != 10 {
		t.Fatalf("the status history holds %d rows (%v); want the worker's 10 alone", rows, err)
	}
	for name, q := range map[string]*pgxpool.Pool{"coordinator": db, "worker": worker} {
		minutes, err := store.History(ctx, q, time.Hour)
		if err != nil || len(minutes) != 2 {
			t.Fatalf("History through the %s: %+v, %v; want a minute of orders and one of refunds", name, minutes, err)
		}
		if m := minutes[0]; m.Workflow != "orders" || m.Stuck != stuck || m.Unfinished() != stuck {
			t.Fatalf("the minute of orders through the %s: %+v; want %d stuck", name, m, stuck)
		}
		if m := minutes[1]; m.Workflow != "refunds" || m.Unfinished() != 0 {
			t.Fatalf("the minute of refunds through the %s: %+v; want none", name, m)
		}
	}
	// The backlog's counts too: each process's count of the keys of every
	// shard lands in the same table (two slots if the five seconds ended
	// between them).
	for name, q := range map[string]*pgxpool.Pool{"worker": worker, "coordinator": db} {
		if _, err := store.RecordSample(ctx, q); err != nil {
			t.Fatalf("RecordSample through the %s: %v", name, err)
		}
	}
	var slots int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM atomicphase_backlog_samples WHERE keys = $1`, stuck).Scan(&slots); err != nil || slots < 1 || slots > 2 {
		t.Fatalf("the backlog's counts hold %d slots of %d keys (%v); want one or two", slots, stuck, err)
	}
	for name, q := range map[string]*pgxpool.Pool{"coordinator": db, "worker": worker} {
		if r, err := store.LatestSample(ctx, q, 0, time.Hour); err != nil || r.From == nil || r.From.Keys != stuck || r.Newest.IsZero() {
			t.Fatalf("LatestSample through the %s: %+v, %v; want %d keys", name, r, err, stuck)
		}
	}
	if _, err := db.Exec(ctx, `UPDATE atomicphase_status_history SET minute = '2000-01-01 00:00+00'`); err != nil {
		t.Fatal(err)
	}
	// Citus refuses an UPDATE of a reference table that computes with
	// now(): each slot is moved to a day of 2000 by its own value.
	slotRows, err := db.Query(ctx, `SELECT slot FROM atomicphase_backlog_samples`)
	if err != nil {
		t.Fatal(err)
	}
	taken, err := pgx.CollectRows(slotRows, pgx.RowTo[time.Time])
	if err != nil {
		t.Fatal(err)
	}
	for i, slot := range taken {
		old := time.Date(2000, 1, 1, 0, 0, i, 0, time.UTC)
		if _, err := db.Exec(ctx, `UPDATE atomicphase_backlog_samples SET slot = $1 WHERE slot = $2`, old, slot); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := store.TrimHistory(ctx, worker); err != nil || n != 10 {
		t.Fatalf("TrimHistory through the worker: %d, %v; want the 10 rows past retention", n, err)
	}
	if n, err := store.TrimSamples(ctx, worker); err != nil || n != slots {
		t.Fatalf("TrimSamples through the worker: %d, %v; want the %d rows past retention", n, err, slots)
	}
}

// TestCitusCountEstimatesTheFinishedKeysOfALargeTable: a coordinator holds
// neither the rows of a distributed key table nor its statistics; past
// exactCountPages a shard, the estimate reads each shard's on its node,
// through the coordinator and through a worker, rather than count every
// key of every shard. Two shards keep the table that is large enough small.
func TestCitusCountEstimatesTheFinishedKeysOfALargeTable(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["citus.shard_count"] = "2" })
	countEstimatesTheFinishedKeysOfALargeTable(t, 60_000, db, db, pgtest.CitusWorkerPool(t, db))

	// A role that may not read the shards' statistics (an administrator
	// revoked run_command_on_shards from PUBLIC) has its keys counted,
	// each once, rather than an error. The tests of this package that
	// share the cluster run as a superuser, whom the revoke leaves alone.
	ctx := context.Background()
	var schema string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	role := "app_" + schema
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys, atomicphase_audit, atomicphase_status_history,
             atomicphase_watch, atomicphase_walk TO ` + role,
		`REVOKE EXECUTE ON FUNCTION run_command_on_shards(regclass, text, boolean) FROM PUBLIC`,
	} {
		if err := pgtest.RetryDeadlocks(func() error { _, err := db.Exec(ctx, stmt); return err }); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, stmt := range []string{
			`GRANT EXECUTE ON FUNCTION run_command_on_shards(regclass, text, boolean) TO PUBLIC`,
			`DROP OWNED BY ` + role,
			`DROP ROLE ` + role,
		} {
			if err := pgtest.RetryDeadlocks(func() error { _, err := db.Exec(ctx, stmt); return err }); err != nil {
				t.Error(err)
			}
		}
	})
	cfg := db.Config().Copy()
	cfg.ConnConfig.User = role
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := app.Exec(ctx, `SELECT run_command_on_shards('idempotency_keys', 'SELECT 1')`); err == nil {
		t.Fatal("the role may still call run_command_on_shards")
	}
	counts, err := store.CountByWorkflow(ctx, app, time.Minute)
	if c := counts["orders"]; err != nil || c.Finished != 45_000 || c.FinishedEstimated {
		t.Fatalf("orders counted by a role that may not read the shards' statistics: %+v, %v; want 45,000 finished, counted", c, err)
	}
}

// TestCitusCountCountsEveryKeyOfATableOfAFewPagesAShard: up to
// exactCountPages a shard, the shards' keys are counted, each on its node,
// and no shard's statistics are read.
func TestCitusCountCountsEveryKeyOfATableOfAFewPagesAShard(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	_, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
                              recovery_point, finished_at, response_status, response_body)
SELECT 'acme' || i % 8, 'k' || i, 'orders', '\x00', '{}', 'finished', now(), 201, convert_to(repeat('x', 1000), 'UTF8')
FROM generate_series(1, 30000) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `ANALYZE idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	counts, err := store.CountByWorkflow(ctx, db, time.Minute)
	if c := counts["orders"]; err != nil || c.Finished != 30000 || c.FinishedEstimated {
		t.Fatalf("counts of 30,000 keys over 8 shards: %+v, %v; want each key counted", c, err)
	}
}
