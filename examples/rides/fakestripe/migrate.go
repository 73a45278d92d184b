package fakestripe

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// chargesTable holds the charges, listed by customer newest first.
var chargesTable = fakeapi.PaymentsTable("fakestripe_charges", `
    customer        text        NOT NULL,
    description     text        NOT NULL DEFAULT '',
    metadata        jsonb       NOT NULL DEFAULT '{}'`) + `
CREATE INDEX IF NOT EXISTS fakestripe_charges_customer_seq
    ON fakestripe_charges (customer, seq);
`

// Schema is the SQL that creates the fakestripe_charges and
// fakestripe_idempotency_keys tables. Applying it more than once is harmless.
var Schema = api.Schema()

// Migrate applies Schema in one transaction. It is safe to run twice and from
// several processes at once.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	return api.Migrate(ctx, db)
}
