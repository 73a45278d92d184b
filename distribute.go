package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgschema"
)

// ErrNoCitus is wrapped by the error of [Distribute] on a database where
// the Citus extension is not installed.
var ErrNoCitus = errors.New("the citus extension is not installed in this database (CREATE EXTENSION citus)")

// DistributeSQL is the script [Distribute] runs, after the migrations, on a
// Citus coordinator: it re-keys the key table and the operator audit by
// tenant and distributes both by tenant, co-located, and makes the status
// history a reference table, on every node. Teams that apply SQL
// with their own tools run it once, after every migration and in one
// transaction; for tables in a schema of their own ([Migrator.Schema]),
// with that schema first on the search_path (SET LOCAL search_path).
//
// The completer does not walk a distributed key table: Citus would draw
// each key's created_xid on the coordinator, in a transaction that writes
// nothing there. Its keys have none, and the completer reads the index of
// unfinished keys this script creates instead, which keeps a finish there
// from being a HOT update.
//
// The primary key of idempotency_keys becomes (tenant, id), because Citus
// requires every unique constraint to include the distribution column; id
// stays unique on its own (a UUIDv7 the library draws). An application
// table that refers to a key must be distributed by the same tenant,
// co-located with idempotency_keys, and refer to (tenant, key_id).
const DistributeSQL = `
ALTER TABLE idempotency_keys ALTER COLUMN created_xid DROP DEFAULT;
CREATE INDEX IF NOT EXISTS idempotency_keys_unfinished
    ON idempotency_keys (last_run_at)
    WHERE finished_at IS NULL AND hold IS NULL;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey, ADD PRIMARY KEY (tenant, id);
SELECT create_distributed_table('idempotency_keys', 'tenant');
ALTER TABLE atomicphase_audit DROP CONSTRAINT atomicphase_audit_pkey, ADD PRIMARY KEY (tenant, id);
SELECT create_distributed_table('atomicphase_audit', 'tenant', colocate_with => 'idempotency_keys');
SELECT create_reference_table('atomicphase_status_history');
SELECT create_reference_table('atomicphase_backlog_samples');
`

// Distribute migrates the database (see [Migrate]) and then distributes the
// key table by tenant across the nodes of a Citus cluster, so that every
// statement about one key runs on the one node that holds it. db must
// reach the Citus coordinator with the extension created. It does nothing
// on a key table already distributed, and changes nothing when it fails.
//
// Keys in flight survive it: their rows, leases and tokens are copied as
// they are, and their holders' next writes find them on their shards. The
// key table is locked against writes while its rows are copied to the
// shards, so a large table is best distributed in a quiet hour, or before
// it fills.
//
// On plain Postgres it returns an error wrapping [ErrNoCitus]. A phase.Client
// finds out by itself, on its first run, that the key table is distributed,
// and then sends the statements written for Citus.
func Distribute(ctx context.Context, db Beginner) error {
	return Migrator{}.Distribute(ctx, db)
}

// Distribute is [Distribute] in m's schema: it migrates it (see
// [Migrator.Migrate]), then distributes its key table and audit.
func (m Migrator) Distribute(ctx context.Context, db Beginner) error {
	if err := m.Migrate(ctx, db); err != nil {
		return err
	}
	tx, err := beginReadCommitted(ctx, db)
	if err != nil {
		return fmt.Errorf("atomicphase: distribute: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockID)); err != nil {
		return fmt.Errorf("atomicphase: distribute: lock: %w", err)
	}
	var citus bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citus); err != nil {
		return fmt.Errorf("atomicphase: distribute: %w", err)
	}
	if !citus {
		return fmt.Errorf("atomicphase: distribute: %w", ErrNoCitus)
	}
	var done bool
	err = tx.QueryRow(ctx, pgschema.Qualify(m.Schema, `SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
        WHERE logicalrelid = to_regclass('idempotency_keys'))`)).Scan(&done)
	if err != nil || done {
		return err
	}
	if err := refusingReferences(ctx, tx, m.Schema); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, pgschema.Qualify(m.Schema, DistributeSQL)); err != nil {
		return fmt.Errorf("atomicphase: distribute: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("atomicphase: distribute: %w", err)
	}
	return nil
}

// refusingReferences fails when a table refers to idempotency_keys by its
// id alone: the constraint cannot survive the new primary key, and Citus
// could not keep it across shards.
func refusingReferences(ctx context.Context, tx pgx.Tx, schema string) error {
	rows, err := tx.Query(ctx, pgschema.Qualify(schema, `
SELECT conrelid::regclass::text || ' (' || conname || ')' FROM pg_catalog.pg_constraint
WHERE confrelid = to_regclass('idempotency_keys') AND contype = 'f' ORDER BY 1`))
	if err != nil {
		return fmt.Errorf("atomicphase: distribute: %w", err)
	}
	refs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("atomicphase: distribute: %w", err)
	}
	if len(refs) > 0 {
		return fmt.Errorf("atomicphase: distribute: foreign keys refer to idempotency_keys by id: %s; "+
			"drop them, distribute, then distribute those tables by tenant (colocate_with => 'idempotency_keys') "+
			"and refer to (tenant, key_id)", strings.Join(refs, ", "))
	}
	return nil
}
