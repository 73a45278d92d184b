package atomicphase_test

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var emptyDatabases atomic.Int64

// emptyDatabase creates a database without the schema and returns its DSN.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.Server(t).AdminDSN
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("migrate_test_%d", emptyDatabases.Add(1))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	if u, err := url.Parse(admin); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	// A later key=value setting overrides an earlier one.
	return admin + " dbname=" + name
}

func TestMigrateIsSafeTwiceAndFromManyConnectionsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := emptyDatabase(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			errs[i] = atomicphase.Migrate(ctx, conn)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate %d: %v", i, err)
		}
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := atomicphase.Migrate(ctx, conn); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}

	var columns, uncommented, indexes int
	err = conn.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE col_description('idempotency_keys'::regclass, attnum) IS NULL),
		       (SELECT count(*) FROM pg_indexes WHERE tablename = 'idempotency_keys')
		FROM pg_attribute WHERE attrelid = 'idempotency_keys'::regclass AND attnum > 0 AND NOT attisdropped`).
		Scan(&columns, &uncommented, &indexes)
	if err != nil {
		t.Fatal(err)
	}
	// Primary key, unique (tenant, key) and the three partial indexes.
	if columns < 20 || uncommented != 0 || indexes != 5 {
		t.Fatalf("%d columns (%d without a comment), %d indexes; want every column commented and 5 indexes", columns, uncommented, indexes)
	}
}

func TestSchemaFileAppliesWithPsql(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql is not installed; schema.sql is still applied by Migrate in every other test")
	}
	dsn := emptyDatabase(t)
	for range 2 {
		out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "schema.sql").CombinedOutput()
		if err != nil {
			t.Fatalf("psql: %v\n%s", err, out)
		}
	}
}
