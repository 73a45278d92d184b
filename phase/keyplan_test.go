package phase_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// TestAPhaseCommitReadsOnlyItsKeyRowWhateverTheTenantHolds: a client whose
// connection planned the run's statements while the key table was new (as
// every deployment's first requests do) still finds each key row by its id
// once the tenant holds thousands of keys. When the holder's statements
// named the tenant, that connection's plan found the row by the tenant
// alone, and every phase commit read every key of the tenant.
func TestAPhaseCommitReadsOnlyItsKeyRowWhateverTheTenantHolds(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "the plans of a single Postgres")
	ctx := context.Background()
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) {
		// One connection, which plans each statement once, generically, as
		// a pooled connection does after its first few runs of it.
		cfg.MaxConns = 1
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	})
	// No autovacuum ANALYZE during the test: it would make the connection
	// plan again, with statistics.
	if _, err := db.Exec(ctx, `ALTER TABLE idempotency_keys SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	e := setupPool(t, db)
	run := func(key string) {
		t.Helper()
		if _, err := e.w.Run(ctx, e.c, "acme", key, order{Item: "lamp", Amount: 2000}); err != nil {
			t.Fatal(err)
		}
	}
	run("first")
	const held = 3000
	_, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params, recovery_point, finished_at, response_status)
SELECT 'acme', 'old-' || g, 'orders', '\x00', 'null', 'finished', now(), 201 FROM generate_series(1, $1) g`, held)
	if err != nil {
		t.Fatal(err)
	}
	const runs = 10
	for i := range runs {
		run(fmt.Sprintf("key-%d", i))
	}
	// A backend reports its index reads when it exits.
	dsn := db.Config().ConnString()
	db.Close()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The backend reports them soon after the pool closed: wait until the
	// index counts the runs' own lookups, one each.
	var scans, read int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		err = conn.QueryRow(ctx, `SELECT idx_scan, idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'idempotency_keys_tenant_key'`).
			Scan(&scans, &read)
		if err != nil {
			t.Fatal(err)
		}
		if scans >= runs+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server reported %d scans of the (tenant, idempotency_key) index for %d runs", scans, runs+1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Each run looks its key up by (tenant, key) once; its phases' commits
	// find the row by id. Reading the tenant's keys would be held per commit.
	if limit := int64(2 * (runs + 1)); read > limit {
		t.Errorf("the (tenant, idempotency_key) index returned %d entries for %d runs, want at most %d", read, runs+1, limit)
	}
}
