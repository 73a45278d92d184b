package payoutprovider

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema is the SQL that creates the payoutprovider_payouts and
// payoutprovider_idempotency_keys tables. Applying it more than once is
// harmless.
//
//go:embed schema.sql
var Schema string

// migrateLockID is the advisory lock key that serialises concurrent Migrate
// calls (the bytes of "payoutpr" as a bigint).
const migrateLockID = 0x7061796f75747072

// Migrate applies Schema in one transaction. It is safe to run twice and from
// several processes at once: a transaction-scoped advisory lock makes
// concurrent runs wait for each other, because CREATE ... IF NOT EXISTS alone
// still races on the catalog's unique indexes.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("payoutprovider: migrate: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockID)); err != nil {
		return fmt.Errorf("payoutprovider: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("payoutprovider: migrate: apply schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("payoutprovider: migrate: %w", err)
	}
	return nil
}
