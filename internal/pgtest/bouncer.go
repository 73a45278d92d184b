package pgtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/testenv"
)

// Bouncer is a PgBouncer in transaction pooling mode, as described by
// [pgcluster.Bouncer].
type Bouncer = pgcluster.Bouncer

// BouncerDSN returns the DSN of a new database for t alone, as DSN does, but
// reached through the PgBouncer that the tests of this binary share, in
// transaction pooling mode in front of the shared server: each transaction
// runs on whichever of the database's few server sessions is free. The
// first call starts the bouncer. Without the pgbouncer program t is skipped
// in one line saying how to install it, or fails when the environment
// requires pgbouncer ([testenv.RequireEnv]); other failures to start it
// fail t.
//
// The DSN sets no query exec mode: pgx's default, cache_statement, fails
// behind the bouncer, which is what a test of that failure wants.
// BouncerPool sets the mode a pool needs.
func BouncerDSN(t testing.TB) string {
	t.Helper()
	if OnCitus() {
		t.Skipf("skipped: the PgBouncer of the tests fronts a single Postgres, not the Citus cluster (%s is set)", EnvCitus)
	}
	b := SharedBouncer(t)
	cfg, err := pgconn.ParseConfig(DSN(t))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return b.DSN(cfg.Database)
}

// BouncerPool returns a pool on BouncerDSN(t) whose query exec mode is
// cache_describe, which prepares nothing a server session keeps, as behind
// any transaction pooler; it closes the pool when t finishes.
func BouncerPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return BouncerPoolWith(t, nil)
}

// BouncerPoolWith is BouncerPool with configure applied to the pool's config
// after the query exec mode is set, so it may set another one.
func BouncerPoolWith(t testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return poolOn(t, BouncerDSN(t), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		if configure != nil {
			configure(cfg)
		}
	})
}

// SharedBouncer returns the bouncer that BouncerDSN's databases are reached
// through, starting it if no test has yet, for a test that reads its admin
// console or builds DSNs of its own; without the pgbouncer program it skips
// or fails t as BouncerDSN does.
func SharedBouncer(t testing.TB) *Bouncer {
	t.Helper()
	b, err := sharedBouncer()
	if errors.Is(err, pgcluster.ErrNoBouncer) {
		testenv.SkipWithout(t, "pgbouncer", pgcluster.ErrNoBouncer)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Route is a way for a test to reach a database of its own.
type Route struct {
	// Name names the route in subtest names.
	Name string
	// PoolWith returns a pool on a new migrated database for t alone, and
	// closes it when t finishes; configure, when not nil, adjusts the
	// pool's config first.
	PoolWith func(t testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool
}

// Routes returns the ways tests of convergence reach their databases:
// directly (PoolWith), through PgBouncer in transaction pooling mode
// (BouncerPoolWith, which skips the test's pgbouncer subtest on a machine
// without the pgbouncer program), and on a Citus cluster with the key table
// distributed by tenant (CitusPool, which skips without Citus). On the Citus
// route a test's database is a schema of the coordinator's postgres
// database, which other tests share.
func Routes() []Route {
	return []Route{{Name: "direct", PoolWith: PoolWith}, {Name: "pgbouncer", PoolWith: BouncerPoolWith},
		{Name: "citus", PoolWith: CitusPool}}
}

// bouncer is the one PgBouncer of this test binary, started by the first
// test that asks for it, in front of the shared server.
var bouncer struct {
	mu  sync.Mutex
	b   *Bouncer
	err error
}

func sharedBouncer() (*Bouncer, error) {
	srv, err := sharedServer()
	if err != nil {
		return nil, err
	}
	bouncer.mu.Lock()
	defer bouncer.mu.Unlock()
	if bouncer.b == nil && bouncer.err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		bouncer.b, bouncer.err = pgcluster.StartBouncer(ctx, pgcluster.BouncerConfig{Server: srv.admin})
		if bouncer.err != nil {
			bouncer.err = fmt.Errorf("pgtest: no PgBouncer in front of the test server: %w", bouncer.err)
		}
	}
	return bouncer.b, bouncer.err
}

// stopBouncer stops the shared bouncer, if one was started.
func stopBouncer() error {
	bouncer.mu.Lock()
	defer bouncer.mu.Unlock()
	b := bouncer.b
	bouncer.b, bouncer.err = nil, errors.New("pgtest: shared bouncer used after Main stopped it")
	if b == nil {
		return nil
	}
	return b.Stop()
}
