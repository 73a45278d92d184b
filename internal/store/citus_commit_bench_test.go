package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// BenchmarkCitusCommitWrite times, as a client sees it, one transaction of
// a phase on a Citus cluster: a row of the application's own table, the
// advance, and COMMIT, in one round trip. The advance is either the
// function the runner calls on Citus (atomicphase_advance_from, migration 013)
// or the plain UPDATE that function runs, which cannot tell the runner
// that it matched no row before COMMIT goes. pg_stat_statements charges
// the function's call more server time than the plain UPDATE, since it
// times the UPDATE's whole run inside the call but only part of the plain
// statement's; this benchmark measures what the client waits for.
//
//	go test -run XXX -bench CitusCommitWrite ./internal/store
func BenchmarkCitusCommitWrite(b *testing.B) {
	db := pgtest.CitusPool(b, nil)
	ctx := context.Background()
	pgtest.CitusTable(b, db, "notes (tenant text NOT NULL, note text NOT NULL)")
	ttl := 30 * time.Second
	for _, form := range []struct{ name, sql string }{
		{"update", byID(advanceUpdate, 7).distributed},
		{"function", advanceSQL.distributed},
	} {
		b.Run(form.name, func(b *testing.B) {
			_, row, err := Acquire(ctx, db, Request{Tenant: "acme", Key: uuid.NewString(), Workflow: "test", Params: []byte("{}"),
				TTL: ttl, Distributed: true})
			if err != nil {
				b.Fatal(err)
			}
			// Each write below leaves the key at charged, where it finds it.
			if err := Advance(ctx, db, row.Holder(), "charged", nil, ttl); err != nil {
				b.Fatal(err)
			}
			conn, err := db.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			for b.Loop() {
				batch := &pgx.Batch{}
				batch.Queue(`BEGIN`)
				batch.Queue(`INSERT INTO notes VALUES ($1, 'charged')`, row.Tenant)
				batch.Queue(form.sql, uuidArg(row.ID), uuidArg(row.LockToken), "charged", []byte(`{"charge":"ch_1"}`),
					intervalArg(ttl), "charged", row.Tenant)
				batch.Queue(`COMMIT`)
				if err := conn.SendBatch(ctx, batch).Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
