package ledger

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/atomicphase/atomicphase"
)

// Schema is the SQL that creates the ledger's tables. Applying it more than
// once is harmless. It does not include atomicphase.SchemaSQL, which the ledger
// also needs (see Migrate).
//
//go:embed schema.sql
var Schema string

// migrateLockID is the advisory lock key that serialises concurrent Migrate
// calls (the bytes of "ledgerdb" as a bigint).
const migrateLockID = 0x6c65646765726462

// Migrate applies the atomicphase schema (with atomicphase.Migrate), then Schema
// in one transaction. It is safe to run twice and from several processes at
// once: a transaction-scoped advisory lock makes concurrent runs wait for
// each other.
func Migrate(ctx context.Context, db atomicphase.Beginner) error {
	if err := atomicphase.Migrate(ctx, db); err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("ledger: migrate: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockID)); err != nil {
		return fmt.Errorf("ledger: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("ledger: migrate: apply schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("ledger: migrate: %w", err)
	}
	return nil
}
