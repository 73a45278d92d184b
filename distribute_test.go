package atomicphase_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

func keyRequest(t *testing.T, key string, distributed bool) store.Request {
	t.Helper()
	fp, err := keyrow.Fingerprint("orders", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return store.Request{Tenant: "acme", Key: key, Workflow: "orders", Fingerprint: fp, Params: []byte(`{}`),
		TTL: time.Minute, Distributed: distributed}
}

// TestDistributeKeepsKeysInFlight distributes a key table that holds keys
// mid-run, as a team moving an installed database to Citus does: a holder
// that took its key before keeps its lease and token and finishes, a key
// released mid-run resumes from its recovery point, and a finished key
// replays. Before, the primary key (id) could not be distributed at all.
func TestDistributeKeepsKeysInFlight(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusSchemaPool(t, nil)
	ctx := context.Background()
	if err := atomicphase.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	distributedNow := func() bool {
		d, err := store.IsDistributed(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if distributedNow() {
		t.Fatal("a migrated key table reads as distributed before Distribute")
	}
	acquire := func(key string, distributed bool) (store.Outcome, *store.Row) {
		t.Helper()
		out, row, err := store.Acquire(ctx, db, keyRequest(t, key, distributed))
		if err != nil {
			t.Fatalf("acquire %s: %v", key, err)
		}
		return out, row
	}
	_, holding := acquire("holding", false)
	if err := store.Advance(ctx, db, holding.Holder(), "charged", []byte(`{"charge":"ch_1"}`), time.Minute); err != nil {
		t.Fatal(err)
	}
	_, released := acquire("released", false)
	if err := store.Advance(ctx, db, released.Holder(), "charged", nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := store.Release(ctx, db, released.Holder(), "provider down", "", store.EndedIdle, false); err != nil {
		t.Fatal(err)
	}
	_, finished := acquire("finished", false)
	if err := store.Finish(ctx, db, finished.Holder(), nil, keyrow.Response{Status: 201, Body: []byte(`{"ok":true}`)}); err != nil {
		t.Fatal(err)
	}

	if err := atomicphase.Distribute(ctx, db); err != nil {
		t.Fatalf("distribute: %v", err)
	}
	if !distributedNow() {
		t.Fatal("the key table does not read as distributed after Distribute")
	}
	if err := atomicphase.Distribute(ctx, db); err != nil {
		t.Fatalf("distribute again: %v, want nothing done", err)
	}

	h := holding.Holder()
	h.Distributed, h.Point = true, "charged" // advanced above
	if _, err := store.Renew(ctx, db, h, time.Minute); err != nil {
		t.Fatalf("renew of the holder from before: %v", err)
	}
	if err := store.Finish(ctx, db, h, nil, keyrow.Response{Status: 201, Body: []byte(`{}`)}); err != nil {
		t.Fatalf("finish of the holder from before: %v", err)
	}
	if out, row := acquire("released", true); out != store.Resumed || row.RecoveryPoint != "charged" {
		t.Fatalf("released key = %v at %q, want Resumed at charged", out, row.RecoveryPoint)
	}
	if out, row := acquire("finished", true); out != store.Replay || string(row.Response.Body) != `{"ok":true}` {
		t.Fatalf("finished key = %v %+v, want its response replayed", out, row.Response)
	}
	if out, _ := acquire("new", true); out != store.New {
		t.Fatalf("new key = %v, want New", out)
	}
}

// TestDistributeRefusesWhatItCannotKeep: on plain Postgres it says Citus
// is missing; a table that refers to keys by id alone is named, and
// nothing changes.
func TestDistributeRefusesWhatItCannotKeep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if err := atomicphase.Distribute(ctx, pgtest.Pool(t)); !errors.Is(err, atomicphase.ErrNoCitus) {
		t.Fatalf("distribute on plain Postgres = %v, want ErrNoCitus", err)
	}
	db := pgtest.CitusSchemaPool(t, func(*pgxpool.Config) {})
	if err := atomicphase.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE TABLE orders (key_id uuid REFERENCES idempotency_keys (id))`); err != nil {
		t.Fatal(err)
	}
	err := atomicphase.Distribute(ctx, db)
	if err == nil || !strings.Contains(err.Error(), "orders (orders_key_id_fkey)") {
		t.Fatalf("distribute with a reference by id = %v, want it named", err)
	}
	if d, err := store.IsDistributed(ctx, db); err != nil || d {
		t.Fatalf("after the refusal distributed = %v, %v; want nothing changed", d, err)
	}
}

// TestMigratorDistributesTheTablesOfItsSchema: on Citus, a Migrator with a
// schema migrates and distributes the tables of that schema, which the
// connection's search_path does not reach, and the store's distributed
// statements find them there.
func TestMigratorDistributesTheTablesOfItsSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusSchemaPool(t, nil)
	ctx := context.Background()
	var own string
	if err := db.QueryRow(ctx, "SELECT current_schema()").Scan(&own); err != nil {
		t.Fatal(err)
	}
	m := atomicphase.Migrator{Schema: own + "_keys"}
	t.Cleanup(func() {
		if _, err := db.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{m.Schema}.Sanitize()+" CASCADE"); err != nil {
			t.Error(err)
		}
	})
	for range 2 {
		if err := m.Distribute(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	s, err := store.NewSchema(m.Schema)
	if err != nil {
		t.Fatal(err)
	}
	q := s.Querier(db)
	if d, err := store.IsDistributed(ctx, q); err != nil || !d {
		t.Fatalf("IsDistributed in the schema: %v, %v; want true", d, err)
	}
	if d, err := store.IsDistributed(ctx, db); err != nil || d {
		t.Fatalf("IsDistributed by the search_path: %v, %v; want false, its schema has no key table", d, err)
	}
	out, row, err := store.Acquire(ctx, q, keyRequest(t, "k1", true))
	if err != nil || out != store.New {
		t.Fatalf("Acquire: %v, %v", out, err)
	}
	if err := store.Finish(ctx, q, row.Holder(), nil, keyrow.Response{Status: 201, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if out, _, err := store.Acquire(ctx, q, keyRequest(t, "k1", true)); err != nil || out != store.Replay {
		t.Fatalf("Acquire again: %v, %v; want a replay", out, err)
	}
}

// TestMigrateOnACitusWorkerSaysToUseTheCoordinator: the migrations'
// version table and the tables they create live on the coordinator, and a
// worker refuses to create them; a process connected to a worker that
// migrates, or asks the version, is told to go through the coordinator
// rather than shown the worker's refusal, or version 0.
func TestMigrateOnACitusWorkerSaysToUseTheCoordinator(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	worker := pgtest.CitusWorkerPool(t, db)
	if err := atomicphase.Migrate(ctx, worker); err == nil || !strings.Contains(err.Error(), "migrate through the coordinator") {
		t.Fatalf("migrate through a worker = %v; want it told to go through the coordinator", err)
	}
	if v, err := atomicphase.MigrationVersion(ctx, worker); err == nil || !strings.Contains(err.Error(), "migrate through the coordinator") {
		t.Fatalf("the version read through a worker = %d, %v; want it told to go through the coordinator", v, err)
	}
	if v, err := atomicphase.MigrationVersion(ctx, db); err != nil || v != len(atomicphase.Migrations()) {
		t.Fatalf("the version read through the coordinator = %d, %v; want %d", v, err, len(atomicphase.Migrations()))
	}
}

// TestMigrateMakesTheHistoryOfADistributedKeyTableReferenceTables: a key
// table distributed by an earlier release left the status history a plain
// table on the coordinator, and had no table for the backlog's counts;
// migrations 014 and 015 make both reference tables, keeping the minutes,
// so that a process connected to a worker records and reads them too.
func TestMigrateMakesTheHistoryOfADistributedKeyTableReferenceTables(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusSchemaPool(t, nil)
	ctx := context.Background()
	ms := atomicphase.Migrations()
	if _, err := atomicphase.MigrateWith(ctx, db, ms[:13]); err != nil {
		t.Fatal(err)
	}
	const reference = "SELECT create_reference_table('atomicphase_status_history');\n" +
		"SELECT create_reference_table('atomicphase_backlog_samples');\n"
	before, found := strings.CutSuffix(atomicphase.DistributeSQL, reference)
	if !found {
		t.Fatalf("DistributeSQL does not end by making the history's tables reference tables:\n%s", atomicphase.DistributeSQL)
	}
	if _, err := db.Exec(ctx, before); err != nil {
		t.Fatalf("the earlier release's distribution: %v", err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO atomicphase_status_history VALUES (date_trunc('minute', now()) - interval '1 minute', 'orders', 'stuck', 7)`); err != nil {
		t.Fatal(err)
	}
	method := func(table string) string {
		var m string
		err := db.QueryRow(ctx, `SELECT coalesce((SELECT partmethod::text FROM pg_dist_partition WHERE logicalrelid = to_regclass($1)), '')`, table).Scan(&m)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := method("atomicphase_status_history"); m != "" {
		t.Fatalf("the status history's partition method before the migration = %q; want a plain table", m)
	}
	for range 2 {
		if err := atomicphase.Migrate(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range []string{"atomicphase_status_history", "atomicphase_backlog_samples"} {
		if m := method(table); m != "n" {
			t.Fatalf("the partition method of %s after the migration = %q; want n, a reference table", table, m)
		}
	}
	worker := pgtest.CitusWorkerPool(t, db)
	if _, err := store.RecordHistory(ctx, worker, []string{"orders"}, time.Minute); err != nil {
		t.Fatalf("RecordHistory through a worker: %v", err)
	}
	minutes, err := store.History(ctx, worker, time.Hour)
	if err != nil || len(minutes) != 2 || minutes[0].Stuck != 7 || minutes[1].Stuck != 0 {
		t.Fatalf("History through a worker: %+v, %v; want the minute kept from before (7 stuck) and the new one", minutes, err)
	}
	if _, err := store.RecordSample(ctx, worker); err != nil {
		t.Fatalf("RecordSample through a worker: %v", err)
	}
	if r, err := store.LatestSample(ctx, db, 0, time.Hour); err != nil || r.From == nil || r.From.Keys != 0 {
		t.Fatalf("LatestSample through the coordinator: %+v, %v; want a count of no keys", r, err)
	}
}
