package fakeapi

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// migrateLockID is the advisory lock key that serialises concurrent Migrate
// calls of every fake (the bytes of "fakeapis" as a bigint). It lives in the
// single-key advisory lock space, which Postgres keeps apart from the
// two-key space that idempotency keys are locked in.
const migrateLockID = 0x66616b6561706973

// Migrate applies schema, the tables of the fake named name and its
// KeysSchema, in one transaction. It is safe to run twice and from several
// processes at once when every statement of schema is idempotent: a
// transaction-scoped advisory lock makes concurrent runs wait for each
// other, because CREATE ... IF NOT EXISTS alone still races on the
// catalog's unique indexes. Its errors start with name.
func Migrate(ctx context.Context, db *pgxpool.Pool, name, schema string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: migrate: %w", name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockID)); err != nil {
		return fmt.Errorf("%s: migrate: lock: %w", name, err)
	}
	if _, err := tx.Exec(ctx, schema); err != nil {
		return fmt.Errorf("%s: migrate: apply schema: %w", name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: migrate: %w", name, err)
	}
	return nil
}
