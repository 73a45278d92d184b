package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/testenv"
)

// citusShards is the shard count of the test cluster's distributed tables:
// enough that tenants spread over both workers, few enough that
// distributing a table per test stays quick.
const citusShards = 8

// citusShared is the Citus cluster the tests of a binary share, started
// by the first test that asks for it.
var citusShared struct {
	mu      sync.Mutex
	cluster *pgcluster.Citus
	err     error
	started bool
}

// Citus returns the Citus cluster (a coordinator and two workers) that the
// tests of this binary share, starting it if no test has yet. Without the
// citus extension for the local server binaries, t is skipped in one line,
// unless ATOMICPHASE_TEST_REQUIRE lists citus: then it fails.
func Citus(t testing.TB) *pgcluster.Citus {
	t.Helper()
	citusShared.mu.Lock()
	defer citusShared.mu.Unlock()
	if !citusShared.started {
		citusShared.started = true
		if err := pgcluster.CitusInstalled(); err != nil {
			citusShared.err = err
		} else {
			// Three servers to initialise, on a machine that may be busy.
			ctx, cancel := context.WithTimeout(context.Background(), 3*startTimeout)
			defer cancel()
			citusShared.cluster, citusShared.err = pgcluster.StartCitus(ctx, 2,
				fmt.Sprintf("citus.shard_count=%d", citusShards))
			if citusShared.err != nil {
				t.Fatalf("pgtest: %v", citusShared.err)
			}
		}
	}
	if citusShared.cluster == nil {
		testenv.SkipWithout(t, "citus", citusShared.err)
	}
	return citusShared.cluster
}

// stopCitus stops the shared Citus cluster, if a test started it.
func stopCitus() error {
	citusShared.mu.Lock()
	defer citusShared.mu.Unlock()
	c := citusShared.cluster
	citusShared.cluster, citusShared.err = nil, errors.New("pgtest: citus cluster used after Main stopped it")
	if c == nil {
		return nil
	}
	return c.Stop()
}

// CitusPool returns a pool on the shared Citus cluster's coordinator (see
// Citus) whose statements run in a schema of t's own, where the
// atomicphase schema is migrated and distributed by tenant
// (atomicphase.Distribute): Citus cannot clone a database per test, so
// tests there are kept apart by schema. The schema is dropped, with its
// shards, when t finishes. configure, when not nil, is applied to the
// pool's config first.
func CitusPool(t testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	pool := CitusSchemaPool(t, configure)
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := atomicphase.Distribute(ctx, pool); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return pool
}

// CitusTable creates, through db (a pool of CitusPool), the table that
// definition describes ("notes (tenant text NOT NULL, ...)") and
// distributes it by its tenant column, co-located with idempotency_keys,
// as an application's tables on Citus are (see atomicphase.Distribute).
func CitusTable(t testing.TB, db *pgxpool.Pool, definition string) {
	t.Helper()
	name, _, _ := strings.Cut(definition, " ")
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if _, err := db.Exec(ctx, "CREATE TABLE "+definition); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	_, err := db.Exec(ctx, `SELECT create_distributed_table($1::text::regclass, 'tenant', colocate_with => 'idempotency_keys')`, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// EnvCitus names the environment variable that, when set, gives every test
// of DSN, Pool and PoolWith a schema of its own on the shared Citus cluster,
// with the atomicphase schema distributed, instead of a database of its own
// on a single Postgres: the way to run a package's whole suite on Citus.
const EnvCitus = "ATOMICPHASE_TEST_CITUS"

// OnCitus reports whether EnvCitus puts the tests of DSN, Pool and
// PoolWith on the Citus cluster, for tests that call the store's
// statements themselves and must choose the distributed ones.
func OnCitus() bool { return os.Getenv(EnvCitus) != "" }

// SkipOnCitus skips t under EnvCitus, for a test of something a Citus
// cluster does differently or refuses by design; why says what.
func SkipOnCitus(t testing.TB, why string) {
	t.Helper()
	if OnCitus() {
		t.Skipf("skipped on Citus (%s is set): %s", EnvCitus, why)
	}
}

// citusDSN is DSN under EnvCitus: the coordinator's DSN with the search
// path set to a new schema for t, migrated and distributed.
func citusDSN(t testing.TB) string {
	t.Helper()
	c := Citus(t)
	schema := citusSchema(t, c)
	dsn := c.Coordinator.DSN("postgres") + " options='-c search_path=" + schema + "'"
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer pool.Close()
	if err := atomicphase.Distribute(ctx, pool); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// citusSchema creates a schema for t on c's coordinator, dropped with its
// shards when t finishes, and returns its name.
func citusSchema(t testing.TB, c *pgcluster.Citus) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	admin := c.Coordinator.DSN("postgres")
	schema := schemaName(t.Name())
	if err := pgcluster.Exec(ctx, admin, "CREATE SCHEMA "+ident(schema)); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		err := RetryDeadlocks(func() error { return pgcluster.Exec(ctx, admin, "DROP SCHEMA "+ident(schema)+" CASCADE") })
		if err != nil {
			t.Error(err)
		}
	})
	return schema
}

// RetryDeadlocks runs f until it returns anything but a deadlock error,
// five times at most: DDL of tests that share the Citus cluster (a schema
// dropped with its shards, a role's grants) takes locks on every node,
// and Postgres breaks a deadlock between two such statements by failing
// one of them, to be run again.
func RetryDeadlocks(f func() error) error {
	var err error
	for range 5 {
		var pgErr *pgconn.PgError
		if err = f(); !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.DeadlockDetected {
			return err
		}
	}
	return err
}

// CitusSchemaPool is CitusPool without the atomicphase schema: the
// schema of t's own is empty, for tests of migrating and distributing.
func CitusSchemaPool(t testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	c := Citus(t)
	schema := citusSchema(t, c)
	return poolOn(t, c.Coordinator.DSN("postgres"), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		if configure != nil {
			configure(cfg)
		}
	})
}

// schemaMaxLen leaves room after a test schema's name for the names that
// applications derive from it: River's notification channels
// ("<schema>.river_leadership") must fit in Postgres's 63 bytes too.
const schemaMaxLen = 40

// schemaName is databaseName for a test's schema, at most schemaMaxLen
// bytes long; its random part comes before the test's name, so cutting
// the name keeps it unique.
func schemaName(label string) string {
	name := databaseName(label)
	return strings.TrimRight(name[:min(len(name), schemaMaxLen)], "_")
}

// CitusWorkerPool returns a pool on the first worker of the Citus cluster,
// in the schema db's connections use: an application that reaches a worker
// rather than the coordinator. It is closed when t finishes.
func CitusWorkerPool(t testing.TB, db *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	var schema string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return poolOn(t, Citus(t).Workers[0].DSN("postgres")+" options='-c search_path="+schema+"'", nil)
}
