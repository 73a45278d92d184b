package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/internal/testenv"
)

func TestProbePoolingTellsTransactionPoolingFromSessionPooling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A session pooler in front of the shared server, for this test alone.
	session, err := pgcluster.StartBouncer(ctx, pgcluster.BouncerConfig{Server: pgtest.Server(t).AdminDSN, SessionPooling: true})
	if errors.Is(err, pgcluster.ErrNoBouncer) {
		testenv.SkipWithout(t, "pgbouncer", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := session.Stop(); err != nil {
			t.Error(err)
		}
	})
	for _, tc := range []struct {
		name string
		pool func(t *testing.T) *pgxpool.Pool
		want store.Pooling
	}{
		{"direct", func(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) }, store.Direct},
		// PgBouncer 1.18 does not carry prepared statements.
		{"transaction pooling", func(t *testing.T) *pgxpool.Pool { return pgtest.BouncerPool(t) }, store.TransactionPooled},
		{"session pooling", func(t *testing.T) *pgxpool.Pool {
			cfg, err := pgconn.ParseConfig(pgtest.DSN(t))
			if err != nil {
				t.Fatal(err)
			}
			pool, err := pgxpool.New(ctx, session.DSN(cfg.Database))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return pool
		}, store.Proxied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := tc.pool(t)
			// Each probe starts afresh, on connections the last one used.
			for range 3 {
				got, err := store.ProbePooling(ctx, pool)
				if err != nil {
					t.Fatal(err)
				}
				if got != tc.want {
					t.Fatalf("ProbePooling = %v, want %v", got, tc.want)
				}
			}
		})
	}
}
