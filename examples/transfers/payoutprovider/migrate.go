package payoutprovider

import (
	"context"
	_ "embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

//go:embed schema.sql
var payoutsSchema string

// Schema is the SQL that creates the payoutprovider_payouts and
// payoutprovider_idempotency_keys tables. Applying it more than once is
// harmless.
var Schema = payoutsSchema + fakeapi.KeysSchema(apiName)

// Migrate applies Schema in one transaction. It is safe to run twice and from
// several processes at once.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	return fakeapi.Migrate(ctx, db, apiName, Schema)
}
