package pgtest

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewPool is Pool for runnable examples: a pool on a new migrated database
// of the shared server, named after label, and a function that closes the
// pool and drops the database. It stands in for an application's own pool.
func NewPool(ctx context.Context, label string) (*pgxpool.Pool, func(), error) {
	dsn, drop, err := NewDatabase(ctx, label)
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		_ = drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); _ = drop() }, nil
}
