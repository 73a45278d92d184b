package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// BenchmarkPgBouncer measures the library's three-phase workflow and replay
// directly, in pgx's default query exec mode (cache_statement) and in
// cache_describe, and through PgBouncer in transaction pooling mode, which
// needs cache_describe, at concurrencies 1 and 8. The bouncer opens at most
// eight server sessions for the database, against the pool's 32
// connections.
func BenchmarkPgBouncer(b *testing.B) {
	routes := []struct {
		name string
		dsn  func(testing.TB) string
		mode pgx.QueryExecMode
	}{
		{"direct/cache_statement", pgtest.DSN, pgx.QueryExecModeCacheStatement},
		{"direct/cache_describe", pgtest.DSN, pgx.QueryExecModeCacheDescribe},
		{"pgbouncer/cache_describe", pgtest.BouncerDSN, pgx.QueryExecModeCacheDescribe},
	}
	envs := make([]*Env, len(routes))
	for i, r := range routes {
		cfg, err := pgxpool.ParseConfig(r.dsn(b))
		if err != nil {
			b.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = r.mode
		if envs[i], err = Open(context.Background(), cfg); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(envs[i].Close)
	}
	for _, k := range []Kind{LibraryRun, LibraryReplay} {
		for _, c := range []int{1, 8} {
			for i, r := range routes {
				b.Run(fmt.Sprintf("%s/c=%d/%s", name(k), c, r.name), func(b *testing.B) {
					measure(b, envs[i], k, c)
				})
			}
		}
	}
}
