package fakeapi

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrateLockID is the advisory lock key that serialises concurrent Migrate
// calls of every fake (the bytes of "fakeapis" as a bigint). It lives in the
// single-key advisory lock space, which Postgres keeps apart from the
// two-key space that idempotency keys are locked in.
const migrateLockID = 0x66616b6561706973

// Schema returns the SQL that creates the fake's tables: c.Tables, then the
// table of its idempotency keys (KeysSchema). Applying it more than once is
// harmless when every statement of c.Tables is idempotent.
func (c Config) Schema() string {
	return c.Tables + KeysSchema(c.Name)
}

// Migrate applies c.Schema() in one transaction. It is safe to run twice
// and from several processes at once when every statement of c.Tables is
// idempotent: a transaction-scoped advisory lock makes concurrent runs wait
// for each other, because CREATE ... IF NOT EXISTS alone still races on the
// catalog's unique indexes. Its errors start with c.Name.
func (c Config) Migrate(ctx context.Context, db *pgxpool.Pool) error {
	name := c.Name
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: migrate: %w", name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockID)); err != nil {
		return fmt.Errorf("%s: migrate: lock: %w", name, err)
	}
	if _, err := tx.Exec(ctx, c.Schema()); err != nil {
		return fmt.Errorf("%s: migrate: apply schema: %w", name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: migrate: %w", name, err)
	}
	return nil
}

// PaymentsTable returns the SQL that creates table, where a fake keeps the
// payments its requests make (charges, payouts), with the columns every
// fake's payments have around columns, the fake's own column definitions:
//
//   - seq orders payments as they were made: created_at has the resolution
//     of a clock, and lists newest first need a total order that cursors
//     can rely on;
//   - id, unique, from NewID;
//   - amount, in minor units, and currency;
//   - idempotency_key, the Idempotency-Key of the request that made the
//     payment, or empty when it carried none;
//   - created_at.
//
// Applying it more than once is harmless.
func PaymentsTable(table, columns string) string {
	return fmt.Sprintf(paymentsTableSQL, pgx.Identifier{table}.Sanitize(), strings.TrimSpace(columns))
}

const paymentsTableSQL = `
CREATE TABLE IF NOT EXISTS %s (
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              text        NOT NULL UNIQUE,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    %s,
    idempotency_key text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now()
);
`
