package payoutprovider

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// payoutsTable holds the payouts. Its name is prefixed, as the table of
// keys is, so that the fake provider can share a database with the service
// that calls it.
var payoutsTable = fakeapi.PaymentsTable("payoutprovider_payouts", `
    destination     text        NOT NULL,
    -- The caller's own reference, such as its transfer id.
    reference       text        NOT NULL DEFAULT '',
    status          text        NOT NULL CHECK (status IN ('paid', 'failed')),
    failure_code    text        NOT NULL DEFAULT ''`) + `
CREATE INDEX IF NOT EXISTS payoutprovider_payouts_reference
    ON payoutprovider_payouts (reference);
`

// Schema is the SQL that creates the payoutprovider_payouts and
// payoutprovider_idempotency_keys tables. Applying it more than once is
// harmless.
var Schema = api.Schema()

// Migrate applies Schema in one transaction. It is safe to run twice and from
// several processes at once.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	return api.Migrate(ctx, db)
}
