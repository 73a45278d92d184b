package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// BenchmarkStatementsByEngine times the per-key statements one at a time
// on a single Postgres and on a Citus cluster (a coordinator and two
// workers on this machine, the key table distributed by tenant): a new
// key's acquire, a replay's, an advance on its own (the fenced write and
// its commit), and a renewal.
//
//	go test -run XXX -bench StatementsByEngine ./internal/store
func BenchmarkStatementsByEngine(b *testing.B) {
	engines := []struct {
		name        string
		pool        func(testing.TB) *pgxpool.Pool
		distributed bool
	}{
		{"postgres", pgtest.Pool, false},
		{"citus", func(t testing.TB) *pgxpool.Pool { return pgtest.CitusPool(t, nil) }, true},
	}
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) {
			db := e.pool(b)
			ctx := context.Background()
			req := func(key string) store.Request {
				r := request(b, fmt.Sprintf("tenant-%d", len(key)%13), key, `{}`)
				r.Distributed = e.distributed
				return r
			}
			b.Run("acquire-new", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if _, _, err := store.Acquire(ctx, db, req(fmt.Sprintf("new-%d", i))); err != nil {
						b.Fatal(err)
					}
				}
			})
			_, row, err := store.Acquire(ctx, db, req("held"))
			if err != nil {
				b.Fatal(err)
			}
			h := row.Holder()
			b.Run("advance", func(b *testing.B) {
				for b.Loop() {
					if err := store.Advance(ctx, db, h, "charged", []byte(`{"charge":"ch_1"}`), ttl); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("renew", func(b *testing.B) {
				for b.Loop() {
					if _, err := store.Renew(ctx, db, h, ttl); err != nil {
						b.Fatal(err)
					}
				}
			})
			if err := store.Finish(ctx, db, h, nil, keyrow.Response{Status: 201, Body: []byte(`{}`)}); err != nil {
				b.Fatal(err)
			}
			b.Run("acquire-replay", func(b *testing.B) {
				for b.Loop() {
					if out, _, err := store.Acquire(ctx, db, req("held")); err != nil || out != store.Replay {
						b.Fatal(out, err)
					}
				}
			})
		})
	}
}
