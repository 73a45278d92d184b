package atomicphase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/testenv"
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

// emptyConn connects to a new database without the schema.
func emptyConn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), emptyDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

func version(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	v, err := atomicphase.MigrationVersion(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// nextMigration stands in for a schema change after the given migrations: it
// adds a column to a table with keys in it, and is idempotent as every
// migration must be.
func nextMigration(ms []atomicphase.Migration) atomicphase.Migration {
	return atomicphase.Migration{
		Version: len(ms) + 1,
		Name:    "add_upgrade_test",
		SQL:     `ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS upgrade_test text NOT NULL DEFAULT 'backfilled';`,
	}
}

// keysInFlight inserts a key in each state that requests, the completer and
// operators leave keys in, with only the columns of migration 001, which
// every later version keeps.
const keysInFlight = `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
    recovery_point, phase_state, hold, locked_at, lock_expires_at, lock_token, attempts, last_error,
    finished_at, response_status, response_headers, response_body)
VALUES
    ('acme', 'leased', 'rides', sha256('leased'), '{"amount": 100}', 'ride_created', '{"ride_id": 1}',
     NULL, now(), now() + interval '1 hour', gen_random_uuid(), 1, NULL, NULL, NULL, NULL, NULL),
    ('acme', 'runnable', 'rides', sha256('runnable'), '{"amount": 200}', 'charge_created', '{"ride_id": 2, "charge_id": "ch_2"}',
     NULL, NULL, NULL, NULL, 2, 'connection reset', NULL, NULL, NULL, NULL),
    ('acme', 'unknown', 'rides', sha256('unknown'), '{"amount": 300}', 'ride_created', '{"ride_id": 3}',
     'unknown', NULL, NULL, NULL, 3, 'timeout', NULL, NULL, NULL, NULL),
    ('acme', 'dead', 'rides', sha256('dead'), '{"amount": 400}', 'ride_created', '{"ride_id": 4}',
     'dead', NULL, NULL, NULL, 10, 'card declined', NULL, NULL, NULL, NULL),
    ('acme', 'finished', 'rides', sha256('finished'), '{"amount": 500}', 'finished', '{"ride_id": 5}',
     NULL, NULL, NULL, NULL, 1, NULL, now(), 201, '{"Content-Type": ["application/json"]}', '{"id": "ch_5"}')`

// keyRows returns every key row, column by column, in jsonb's canonical text.
func keyRows(t *testing.T, conn *pgx.Conn) map[string]map[string]json.RawMessage {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT idempotency_key, to_jsonb(k)::text FROM idempotency_keys k`)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]map[string]json.RawMessage{}
	for rows.Next() {
		var key, row string
		if err := rows.Scan(&key, &row); err != nil {
			t.Fatal(err)
		}
		var columns map[string]json.RawMessage
		if err := json.Unmarshal([]byte(row), &columns); err != nil {
			t.Fatal(err)
		}
		keys[key] = columns
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// assertIntact fails unless every key of before is still there with every
// column unchanged; columns added since may hold anything.
func assertIntact(t *testing.T, before, after map[string]map[string]json.RawMessage) {
	t.Helper()
	if len(after) != len(before) {
		t.Errorf("%d keys before, %d after", len(before), len(after))
	}
	for key, columns := range before {
		for column, value := range columns {
			if got := after[key][column]; string(got) != string(value) {
				t.Errorf("key %s: %s = %s, was %s", key, column, got, value)
			}
		}
	}
}

// catalogQuery describes, one line per object, what the schema in the
// connection's search path holds, without the version table: relations with
// their options, columns in order with types, defaults and comments,
// constraints, indexes, functions, triggers, types and policies.
const catalogQuery = `
WITH ns AS (SELECT current_schema()::regnamespace AS oid),
rel AS (
    SELECT c.oid, c.relname FROM pg_class c, ns
    WHERE c.relnamespace = ns.oid AND c.relname NOT IN ('atomicphase_migration', 'atomicphase_migration_pkey')
)
SELECT format('relation %s: kind %s, options %s, persistence %s, row security %s, comment %L',
              rel.relname, c.relkind, c.reloptions, c.relpersistence, c.relrowsecurity, obj_description(c.oid, 'pg_class'))
FROM pg_class c JOIN rel USING (oid)
UNION ALL
SELECT format('column %s.%s, number %s: %s, not null %s, default %s, identity %L, generated %L, collation %s, comment %L',
              rel.relname, a.attname, row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
              format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
              a.attidentity, a.attgenerated, a.attcollation::regcollation, col_description(a.attrelid, a.attnum))
FROM pg_attribute a
JOIN rel ON rel.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT format('constraint %s on %s: %s, comment %L',
              co.conname, rel.relname, pg_get_constraintdef(co.oid), obj_description(co.oid, 'pg_constraint'))
FROM pg_constraint co JOIN rel ON rel.oid = co.conrelid
UNION ALL
SELECT format('index %s', pg_get_indexdef(i.indexrelid))
FROM pg_index i JOIN rel ON rel.oid = i.indrelid
UNION ALL
SELECT format('function %s, comment %L', pg_get_functiondef(p.oid), obj_description(p.oid, 'pg_proc'))
FROM pg_proc p, ns WHERE p.pronamespace = ns.oid
UNION ALL
SELECT format('trigger %s', pg_get_triggerdef(tg.oid))
FROM pg_trigger tg JOIN rel ON rel.oid = tg.tgrelid WHERE NOT tg.tgisinternal
UNION ALL
SELECT format('type %s: %s over %s, labels %s', t.typname, t.typtype, format_type(t.typbasetype, t.typtypmod),
              (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid))
FROM pg_type t, ns
WHERE t.typnamespace = ns.oid AND t.typrelid = 0 AND NOT EXISTS (SELECT FROM pg_type a WHERE a.typarray = t.oid)
UNION ALL
SELECT format('policy %s on %s: %s, using %s, check %s', pol.polname, rel.relname, pol.polcmd,
              pg_get_expr(pol.polqual, pol.polrelid), pg_get_expr(pol.polwithcheck, pol.polrelid))
FROM pg_policy pol JOIN rel ON rel.oid = pol.polrelid
ORDER BY 1`

func catalog(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), catalogQuery)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// schemaFileCatalog is the catalog of a database set up with schema.sql.
func schemaFileCatalog(t *testing.T) []string {
	t.Helper()
	conn := emptyConn(t)
	mustExec(t, conn, atomicphase.SchemaSQL)
	return catalog(t, conn)
}

// assertCatalog fails with the lines that differ unless got equals want.
func assertCatalog(t *testing.T, got, want []string) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	var diff strings.Builder
	for _, line := range want {
		if !slices.Contains(got, line) {
			fmt.Fprintf(&diff, "- %s\n", line)
		}
	}
	for _, line := range got {
		if !slices.Contains(want, line) {
			fmt.Fprintf(&diff, "+ %s\n", line)
		}
	}
	t.Fatalf("catalog differs from schema.sql's (- schema.sql only, + migrated only):\n%s", diff.String())
}

func TestMigrateIsSafeTwiceAndFromManyConnectionsAtOnce(t *testing.T) {
	t.Parallel()
	for _, route := range []string{"direct", "pgbouncer"} {
		t.Run(route, func(t *testing.T) {
			t.Parallel()
			dsn := emptyDatabase(t)
			if route == "pgbouncer" {
				// The advisory lock that serialises Migrate is taken per
				// transaction, which a transaction pooler keeps on one
				// server session.
				cfg, err := pgconn.ParseConfig(dsn)
				if err != nil {
					t.Fatal(err)
				}
				dsn = pgtest.SharedBouncer(t).DSN(cfg.Database) + " default_query_exec_mode=cache_describe"
			}
			migrateConcurrently(t, dsn)
		})
	}
}

// migrateConcurrently migrates the empty database at dsn from eight
// connections at once, and once more, and checks that each migration was
// applied once.
func migrateConcurrently(t *testing.T, dsn string) {
	ctx := context.Background()
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

	var recorded []int
	rows, err := conn.Query(ctx, "SELECT version FROM atomicphase_migration ORDER BY version")
	if err == nil {
		recorded, err = pgx.CollectRows(rows, pgx.RowTo[int])
	}
	if err != nil {
		t.Fatal(err)
	}
	var want []int
	for _, m := range atomicphase.Migrations() {
		want = append(want, m.Version)
	}
	if !slices.Equal(recorded, want) || version(t, conn) != len(want) {
		t.Fatalf("recorded versions %v, MigrationVersion %d; want each of %v once", recorded, version(t, conn), want)
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
	// Primary key, unique (tenant, key), the walk's, the keys on hold and the
	// reaper's by workflow.
	if columns < 20 || uncommented != 0 || indexes != 5 {
		t.Fatalf("%d columns (%d without a comment), %d indexes; want every column commented and 5 indexes", columns, uncommented, indexes)
	}
}

func TestSchemaFileAppliesWithPsql(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		testenv.SkipWithout(t, "psql", fmt.Errorf("%w (Debian and Ubuntu: apt-get install postgresql-client); schema.sql is still applied in the catalog tests", err))
	}
	dsn := emptyDatabase(t)
	for range 2 {
		out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "schema.sql").CombinedOutput()
		if err != nil {
			t.Fatalf("psql: %v\n%s", err, out)
		}
	}
}

func TestMigrationsBuildExactlySchemaFile(t *testing.T) {
	t.Parallel()
	want := schemaFileCatalog(t)
	conn := emptyConn(t)
	if err := atomicphase.Migrate(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	got := catalog(t, conn)
	if len(got) < 30 {
		t.Fatalf("the catalog query found only %d objects:\n%s", len(got), strings.Join(got, "\n"))
	}
	assertCatalog(t, got, want)
}

func TestMigrateUpgradesAnInstallWithKeysInFlight(t *testing.T) {
	t.Parallel()
	// nextMigration plays the part of the next release's migration, so that
	// even the latest version is upgraded here with keys in it.
	ms := atomicphase.Migrations()
	ms = append(ms, nextMigration(ms))
	for from := 1; from < len(ms); from++ {
		t.Run(fmt.Sprintf("from version %d", from), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			conn := emptyConn(t)
			if _, err := atomicphase.MigrateWith(ctx, conn, ms[:from]); err != nil {
				t.Fatal(err)
			}
			mustExec(t, conn, keysInFlight)
			before := keyRows(t, conn)

			applied, err := atomicphase.MigrateWith(ctx, conn, ms)
			if err != nil {
				t.Fatalf("upgrade from version %d: %v", from, err)
			}
			if !slices.Equal(applied, ms[from:]) {
				t.Errorf("applied %v, want versions %d to %d", applied, from+1, len(ms))
			}
			if got := version(t, conn); got != len(ms) {
				t.Errorf("version after the upgrade = %d, want %d", got, len(ms))
			}
			after := keyRows(t, conn)
			assertIntact(t, before, after)
			for key, columns := range after {
				if got := string(columns["upgrade_test"]); got != `"backfilled"` {
					t.Errorf("key %s: the added column holds %s, want its default", key, got)
				}
			}
		})
	}
}

func TestMigrateAdoptsAnUnversionedInstall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sql  string
	}{
		// Releases before versioned migrations applied migration 001's
		// statements with no version table.
		{"release before versioned migrations", atomicphase.Migrations()[0].SQL},
		// Applying schema.sql, then Migrate, runs every migration over the
		// schema it already built: each must change nothing.
		{"schema.sql applied by hand", atomicphase.SchemaSQL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want := schemaFileCatalog(t)
			conn := emptyConn(t)
			mustExec(t, conn, tc.sql)
			mustExec(t, conn, keysInFlight)
			before := keyRows(t, conn)
			if got := version(t, conn); got != 0 {
				t.Fatalf("version before Migrate = %d, want 0", got)
			}

			if err := atomicphase.Migrate(context.Background(), conn); err != nil {
				t.Fatal(err)
			}
			if got, latest := version(t, conn), len(atomicphase.Migrations()); got != latest {
				t.Fatalf("version after Migrate = %d, want %d", got, latest)
			}
			assertIntact(t, before, keyRows(t, conn))
			assertCatalog(t, catalog(t, conn), want)
		})
	}
}

func TestMigrateRefusesADatabaseNewerThanThisRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := emptyConn(t)
	ms := atomicphase.Migrations()
	newer := append(ms, nextMigration(ms))
	if _, err := atomicphase.MigrateWith(ctx, conn, newer); err != nil {
		t.Fatal(err)
	}

	err := atomicphase.Migrate(ctx, conn)
	if !errors.Is(err, atomicphase.ErrSchemaTooNew) {
		t.Fatalf("Migrate of a newer database = %v, want ErrSchemaTooNew", err)
	}
	if want := fmt.Sprintf("the database is at version %d, this release knows versions up to %d", len(newer), len(ms)); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if got := version(t, conn); got != len(newer) {
		t.Errorf("version after the refusal = %d, want %d", got, len(newer))
	}
}

func TestMigrateKeepsTheMigrationsBeforeOneThatFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := emptyConn(t)
	ms := atomicphase.Migrations()
	broken := append(ms, atomicphase.Migration{
		Version: len(ms) + 1,
		Name:    "broken",
		SQL:     `ALTER TABLE idempotency_keys ADD COLUMN half_done text; SELECT 1/0;`,
	})

	applied, err := atomicphase.MigrateWith(ctx, conn, broken)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("apply %03d_broken", len(broken))) {
		t.Fatalf("Migrate with a broken migration = %v, want its name in the error", err)
	}
	if !slices.Equal(applied, ms) || version(t, conn) != len(ms) {
		t.Fatalf("applied %v, now at version %d; want every migration before the broken one", applied, version(t, conn))
	}
	var halfDone int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = 'idempotency_keys'::regclass AND attname = 'half_done'`).Scan(&halfDone); err != nil || halfDone != 0 {
		t.Fatalf("the broken migration left its column behind (%v)", err)
	}
	if err := atomicphase.Migrate(ctx, conn); err != nil {
		t.Fatalf("Migrate after the failure: %v", err)
	}
}

func ExampleMigrations() {
	for _, m := range atomicphase.Migrations() {
		fmt.Printf("%03d_%s\n", m.Version, m.Name)
	}
	// Output:
	// 001_create_idempotency_keys
	// 002_add_failures
	// 003_drop_row_checks
	// 004_comment_downstream_keys
	// 005_record_definitions
	// 006_operator_actions
	// 007_scrub_replayed_headers
	// 008_record_retention
	// 009_audit_refusals
	// 010_status_history
	// 011_commit_functions
	// 012_hot_finish
	// 013_commit_checks_recovery_point
	// 014_status_history_on_citus
	// 015_backlog_samples
	// 016_claims_keep_last_run
	// 017_progress_clears_last_error
}

func TestMigrateRemovesCookiesAndCredentialsFromStoredResponses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := emptyConn(t)
	ms := atomicphase.Migrations()
	if _, err := atomicphase.MigrateWith(ctx, conn, ms[:5]); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
    recovery_point, finished_at, response_status, response_headers, response_body)
VALUES
    ('acme', 'login', 'signup', sha256('login'), '{}', 'finished', now(), 201,
     '{"Content-Type": ["application/json"], "Set-Cookie": ["session=secret"], "authorization": ["Bearer x"], "Location": ["/users/1"]}', '{}'),
    ('acme', 'plain', 'signup', sha256('plain'), '{}', 'finished', now(), 201, '{"Content-Type": ["application/json"]}', '{}'),
    ('acme', 'none', 'signup', sha256('none'), '{}', 'finished', now(), 204, NULL, '')`)
	if err := atomicphase.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"login": `{"Location": ["/users/1"], "Content-Type": ["application/json"]}`,
		"plain": `{"Content-Type": ["application/json"]}`,
		"none":  "",
	}
	for key, headers := range want {
		var got *string
		if err := conn.QueryRow(ctx, `SELECT response_headers::text FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (headers == "") || (got != nil && *got != headers) {
			t.Errorf("key %s: stored headers after the migration = %v, want %q", key, got, headers)
		}
	}
}

// schemaCatalog is the catalog of schema, which the connection's
// search_path must not reach, described as catalog describes the search
// path's, with the function's qualified name written as in public.
func schemaCatalog(t *testing.T, conn *pgx.Conn, schema string) []string {
	t.Helper()
	var found *string
	if err := conn.QueryRow(context.Background(), "SELECT to_regclass('idempotency_keys')::text").Scan(&found); err != nil || found != nil {
		t.Fatalf("the search_path finds idempotency_keys (%v, %v)", found, err)
	}
	mustExec(t, conn, "SET search_path TO "+schema)
	defer mustExec(t, conn, "RESET search_path")
	lines := catalog(t, conn)
	for i, line := range lines {
		// A function's body names the library's objects in their schema,
		// quoted (see pgschema.Qualify), where schema.sql's names them
		// unqualified.
		line = strings.ReplaceAll(line, `"`+schema+`".`, "")
		lines[i] = strings.ReplaceAll(line, schema+".", "public.")
	}
	return lines
}

func TestMigratorBuildsExactlySchemaFileInASchemaOffTheSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want := schemaFileCatalog(t)
	conn := emptyConn(t)
	m := atomicphase.Migrator{Schema: "apkeys"}
	for range 2 {
		if err := m.Migrate(ctx, conn); err != nil {
			t.Fatal(err)
		}
	}
	assertCatalog(t, schemaCatalog(t, conn, "apkeys"), want)
	if v, err := m.Version(ctx, conn); err != nil || v != len(atomicphase.Migrations()) {
		t.Fatalf("Version: %d, %v; want %d", v, err, len(atomicphase.Migrations()))
	}
	if v := version(t, conn); v != 0 {
		t.Fatalf("MigrationVersion of the search_path's schema: %d, want 0", v)
	}
}

func TestMigratorPrintsMigrationsThatBuildExactlySchemaFileInTheirSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want := schemaFileCatalog(t)
	ms, err := atomicphase.Migrator{Schema: "apprinted"}.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	conn := emptyConn(t)
	// As a migration tool runs them: each in a transaction, with the
	// connection's search_path as it is.
	for _, m := range ms {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%03d_%s: %v", m.Version, m.Name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	assertCatalog(t, schemaCatalog(t, conn, "apprinted"), want)
}

func TestMigratorRefusesANameThatCannotBeASchema(t *testing.T) {
	t.Parallel()
	m := atomicphase.Migrator{Schema: "pg_keys"}
	if _, err := m.Migrations(); err == nil || !strings.Contains(err.Error(), "Migrator.Schema") {
		t.Fatalf("Migrations: %v, want an error naming Migrator.Schema", err)
	}
	conn := emptyConn(t)
	if err := m.Migrate(context.Background(), conn); err == nil {
		t.Fatal("Migrate: no error")
	}
	if v := version(t, conn); v != 0 {
		t.Fatalf("version %d after a refused Migrate, want 0", v)
	}
}

// A Migrator with a schema gives the SQL of the migrations with every
// table and function named in that schema, and the first migration
// creating it, for teams that apply SQL with their own tool.
func ExampleMigrator_Migrations() {
	ms, err := atomicphase.Migrator{Schema: "payments"}.Migrations()
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range ms {
		for line := range strings.Lines(m.SQL) {
			if strings.HasPrefix(line, "CREATE SCHEMA") || strings.HasPrefix(line, "CREATE TABLE") {
				fmt.Print(line)
			}
		}
	}
	// Output:
	// CREATE SCHEMA IF NOT EXISTS "payments";
	// CREATE TABLE IF NOT EXISTS "payments".idempotency_keys (
	// CREATE TABLE IF NOT EXISTS "payments".atomicphase_audit (
	// CREATE TABLE IF NOT EXISTS "payments".atomicphase_status_history (
	// CREATE TABLE IF NOT EXISTS "payments".atomicphase_watch (
	// CREATE TABLE IF NOT EXISTS "payments".atomicphase_walk (
	// CREATE TABLE IF NOT EXISTS "payments".atomicphase_backlog_samples (
}

// TestTheHOTFinishMigrationRefusesAnIndexLeftInvalid: a team that builds
// migration 012's indexes by hand, online, may see a concurrent build
// fail, which leaves an invalid index of the name behind. The migration
// would skip it (IF NOT EXISTS) and the index would never be used; it
// refuses instead, naming it, and changes nothing.
func TestTheHOTFinishMigrationRefusesAnIndexLeftInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := emptyConn(t)
	ms := atomicphase.Migrations()
	i := slices.IndexFunc(ms, func(m atomicphase.Migration) bool { return m.Name == "hot_finish" })
	if i < 0 {
		t.Fatal("no migration hot_finish")
	}
	if _, err := atomicphase.MigrateWith(ctx, conn, ms[:i]); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, keysInFlight)
	// A unique build over keys that share a workflow fails, as a build
	// stopped by a timeout does, and leaves the index invalid.
	if _, err := conn.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY idempotency_keys_by_workflow ON idempotency_keys (workflow)`); err == nil {
		t.Fatal("the unique build over shared workflows succeeded")
	}
	_, err := atomicphase.MigrateWith(ctx, conn, ms)
	if err == nil || !strings.Contains(err.Error(), "idempotency_keys_by_workflow") || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("migrate over an invalid index: %v; want it refused, naming the index", err)
	}
	if got := version(t, conn); got != i {
		t.Fatalf("version after the refusal = %d, want %d", got, i)
	}
}
