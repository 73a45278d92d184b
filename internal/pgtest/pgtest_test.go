package pgtest_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestParallelTestsGetTheirOwnMigratedDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	var (
		mu        sync.Mutex
		databases = map[string]string{}
	)
	t.Run("group", func(t *testing.T) {
		for _, name := range []string{"first", "second"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				conn := connect(t, pgtest.DSN(t))
				var database string
				var table *string
				if err := conn.QueryRow(ctx, "SELECT current_database(), to_regclass('idempotency_keys')::text").Scan(&database, &table); err != nil {
					t.Fatal(err)
				}
				if table == nil {
					t.Errorf("database %s has no idempotency_keys table", database)
				}
				// Fails with "already exists" if the sibling shares the database.
				if _, err := conn.Exec(ctx, "CREATE TABLE marker (test text)"); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				databases[name] = database
				mu.Unlock()
			})
		}
	})
	if t.Failed() {
		return
	}
	if databases["first"] == databases["second"] {
		t.Fatalf("both tests got database %s", databases["first"])
	}

	admin := connect(t, pgtest.Server(t).AdminDSN)
	var left int
	err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = ANY($1)",
		[]string{databases["first"], databases["second"]}).Scan(&left)
	if err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d test databases still exist after their tests finished", left)
	}
}

func TestPoolReachesAMigratedDatabase(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var keys int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys").Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != 0 {
		t.Errorf("fresh database holds %d idempotency keys, want 0", keys)
	}
}

func TestStatementCounterCountsBatchAsOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var counter pgtest.StatementCounter
	config, err := pgx.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	config.Tracer = &counter
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	batch := &pgx.Batch{}
	batch.Queue("SELECT 2")
	batch.Queue("SELECT 3")
	batch.Queue("SELECT 4")
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		t.Fatal(err)
	}

	if got := counter.Statements(); got != 4 {
		t.Errorf("Statements() = %d, want 4", got)
	}
	if got := counter.RoundTrips(); got != 2 {
		t.Errorf("RoundTrips() = %d, want 2", got)
	}
	want := []string{"SELECT 1", "SELECT 2", "SELECT 3", "SELECT 4"}
	if got := counter.SQL(); !slices.Equal(got, want) {
		t.Errorf("SQL() = %q, want %q", got, want)
	}

	counter.Reset()
	if counter.Statements() != 0 || counter.RoundTrips() != 0 || len(counter.SQL()) != 0 {
		t.Errorf("after Reset: %d statements, %d round trips, SQL %q", counter.Statements(), counter.RoundTrips(), counter.SQL())
	}
}

func TestStatementCounterCountsConcurrentQueries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var counter pgtest.StatementCounter
	config, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	config.ConnConfig.Tracer = &counter
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	const queries = 50
	var wg sync.WaitGroup
	for range queries {
		wg.Go(func() {
			if _, err := pool.Exec(ctx, "SELECT pg_sleep(0.001)"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := counter.Statements(); got != queries {
		t.Errorf("Statements() = %d, want %d", got, queries)
	}
	if got := counter.RoundTrips(); got != queries {
		t.Errorf("RoundTrips() = %d, want %d", got, queries)
	}
}

func TestEmbeddedServerIsGoneAfterStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, stop, err := pgtest.Embedded(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE demo (id int)"); err != nil {
		t.Error(err)
	}
	conn.Close(ctx)

	stop()
	if conn, err := pgx.Connect(ctx, dsn); err == nil {
		conn.Close(ctx)
		t.Error("connected to the embedded server after stop")
	}
}

func TestBouncerPoolReachesTheTestsOwnDatabaseThroughTheBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.BouncerPool(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var (
		keys     int
		database string
		pid      uint32
	)
	if err := conn.QueryRow(ctx, "SELECT count(*), current_database(), pg_backend_pid() FROM idempotency_keys").Scan(&keys, &database, &pid); err != nil {
		t.Fatal(err)
	}
	if keys != 0 || database != pool.Config().ConnConfig.Database {
		t.Errorf("reached database %s holding %d keys; want the test's own %s, empty", database, keys, pool.Config().ConnConfig.Database)
	}
	if pid == conn.Conn().PgConn().PID() {
		t.Errorf("the server session %d is the one the login announced: the pool does not go through the bouncer", pid)
	}
	if mode := pool.Config().ConnConfig.DefaultQueryExecMode; mode != pgx.QueryExecModeCacheDescribe {
		t.Errorf("query exec mode %v, want cache_describe", mode)
	}
}
