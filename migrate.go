package atomicphase

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgschema"
)

// SchemaSQL is the whole current schema as one idempotent script: the
// idempotency_keys table, its indexes and the fencing function, exactly as
// applying every migration in [Migrations] leaves them, without the version
// table. It is for reading and for teams that apply SQL with their own tools;
// [Migrate] applies the migrations instead and records their versions.
//
//go:embed schema.sql
var SchemaSQL string

// migrationFiles holds the migrations, named NNN_name.up.sql. Each one must
// be idempotent (IF NOT EXISTS, CREATE OR REPLACE, ADD COLUMN IF NOT EXISTS)
// so that Migrate can adopt a database that has no version table yet by
// applying them all again, and additive, so that the release before it still
// runs against its schema while a deploy rolls out.
//
//go:embed migrations/*.up.sql
var migrationFiles embed.FS

// migrations are the embedded migrations in order; a malformed file name
// fails every test of this package at init.
var migrations = mustParseMigrations(migrationFiles, "migrations")

// Migration is one numbered step of the schema.
type Migration struct {
	// Version numbers the migrations from 1, without gaps, in the order
	// they apply. The database records the versions applied to it.
	Version int
	// Name says what the migration does, as its file name does:
	// create_idempotency_keys for migrations/001_create_idempotency_keys.up.sql.
	Name string
	// SQL is the migration's statements, one script to run in one
	// transaction. Running it again is harmless.
	SQL string
}

// Migrations returns every migration this release knows, oldest first.
// Migrations only go up: undoing one could lose what the keys record about
// side effects that already happened, and a retry would then repeat them.
//
// Teams that manage their schema with their own tool (goose, atlas, sqitch)
// can ship the SQL of each new version as their own migration; 'atomicphase
// migrate -print' writes it out.
func Migrations() []Migration { return slices.Clone(migrations) }

// ErrSchemaTooNew is wrapped by the error of [Migrate] when the database
// records a migration version newer than this release knows, as when a
// release is rolled back after a newer one migrated the database. Migrate
// then changes nothing; a caller that expects it (an older instance starting
// during a rolling deploy) can tell it apart with errors.Is.
var ErrSchemaTooNew = errors.New("the database schema is newer than this release of atomicphase")

// migrateLockID is the advisory lock key that serialises concurrent Migrate
// calls (the bytes of "atomicph" as a bigint).
const migrateLockID = 0x61746f6d69637068

// versionTable records the migrations applied to the database.
const versionTable = "atomicphase_migration"

// createVersionTable runs under the migrate lock, and only when the table is
// missing: CREATE TABLE IF NOT EXISTS alone still races on the catalog's
// unique indexes when two sessions run it at once.
const createVersionTable = `
CREATE TABLE atomicphase_migration (
    version    integer     PRIMARY KEY CHECK (version > 0),
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE atomicphase_migration IS
    'The atomicphase migrations applied to this database, one row each, written by Migrate in the transaction that applied the migration.';
COMMENT ON COLUMN atomicphase_migration.version IS
    'Version of the migration; the highest one is the version of the schema.';
COMMENT ON COLUMN atomicphase_migration.name IS
    'What the migration does, as its file name in migrations/ says.';
COMMENT ON COLUMN atomicphase_migration.applied_at IS
    'When the migration was applied.';`

// Beginner is satisfied by *pgx.Conn, *pgxpool.Pool and pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrator applies, reports and prints the migrations for the Postgres
// schema that holds the library's tables and functions. Its zero value
// works on the tables the connection's search_path finds, as [Migrate],
// [MigrationVersion] and [Migrations] do:
//
//	m := atomicphase.Migrator{Schema: "payments"}
//	if err := m.Migrate(ctx, pool); err != nil {
//		return err
//	}
//	client, err := phase.NewClient(pool, &phase.Config{Schema: "payments"}, charge)
type Migrator struct {
	// Schema is the Postgres schema that holds the library's tables and
	// functions, the one phase.Config.Schema names. The migrations, and
	// the table that records their versions, name their objects in it,
	// whatever the connection's search_path; Migrate creates it when it is
	// missing. The name is used as it is, quoted: case matters.
	//
	// Defaults to empty: the schema the connection's search_path finds
	// (public, unless the role or the URL sets another).
	Schema string
}

// check returns the error of an invalid Schema.
func (m Migrator) check(what string) error {
	if err := pgschema.Check(m.Schema); err != nil {
		return fmt.Errorf("atomicphase: %s: Migrator.Schema: %w", what, err)
	}
	return nil
}

// Migrations returns every migration this release knows, oldest first,
// with its SQL naming the library's tables and functions in m's schema, as
// [Migrator.Migrate] applies it: for teams that apply SQL with their own
// tool ('atomicphase migrate -print -schema'). For a schema, the first
// migration begins with CREATE SCHEMA IF NOT EXISTS. Run each in one
// transaction.
func (m Migrator) Migrations() ([]Migration, error) {
	if err := m.check("migrations"); err != nil {
		return nil, err
	}
	ms := Migrations()
	if m.Schema == "" {
		return ms, nil
	}
	for i := range ms {
		ms[i].SQL = pgschema.Qualify(m.Schema, ms[i].SQL)
	}
	ms[0].SQL = "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{m.Schema}.Sanitize() + ";\n" + ms[0].SQL
	return ms, nil
}

// Migrate is [Migrate] in m's schema, which it creates first when it is
// missing (that needs the CREATE privilege on the database; a schema that
// exists needs only CREATE on the schema).
func (m Migrator) Migrate(ctx context.Context, db Beginner) error {
	if err := m.check("migrate"); err != nil {
		return err
	}
	_, err := migrate(ctx, db, migrations, m.Schema)
	return err
}

// Version is [MigrationVersion] in m's schema: 0 when the schema, or its
// version table, does not exist.
func (m Migrator) Version(ctx context.Context, db Beginner) (int, error) {
	if err := m.check("migration version"); err != nil {
		return 0, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("atomicphase: migration version: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	version, _, err := readVersion(ctx, tx, m.Schema)
	if err != nil {
		return 0, fmt.Errorf("atomicphase: migration version: %w", err)
	}
	return version, nil
}

// Migrate brings the database's schema up to the latest version in
// [Migrations]. It creates the atomicphase_migration table if need be, then
// applies each pending migration in a transaction of its own, together with
// the row that records its version: a failure leaves the database at the last
// migration that succeeded, and the next Migrate resumes from there.
//
// Migrate is safe to run at every start and from several processes at once:
// each transaction takes the same advisory lock before it reads the version,
// so concurrent runs wait for each other and every migration is applied once.
//
// A database set up with [SchemaSQL] or by a release before versioned
// migrations has no version table; Migrate adopts it by applying every
// migration, which changes nothing that exists. A database that records a
// newer version than this release knows is refused with an error wrapping
// [ErrSchemaTooNew].
//
// Migrate works on the tables the connection's search_path finds; a
// [Migrator] works on those of a schema named in its Schema.
func Migrate(ctx context.Context, db Beginner) error {
	return Migrator{}.Migrate(ctx, db)
}

// MigrationVersion returns the highest migration version recorded in the
// database: len(Migrations()) once this release's Migrate has run, 0 when
// none has (an empty database, or one set up with [SchemaSQL] or by a release
// before versioned migrations). It changes nothing.
func MigrationVersion(ctx context.Context, db Beginner) (int, error) {
	return Migrator{}.Version(ctx, db)
}

// migrate applies the pending migrations of ms in schema (empty for the
// search_path's) and returns those it applied. Tests pass migrations of
// their own.
func migrate(ctx context.Context, db Beginner, ms []Migration, schema string) ([]Migration, error) {
	var applied []Migration
	for {
		m, err := migrateNext(ctx, db, ms, schema)
		if err != nil || m == nil {
			return applied, err
		}
		applied = append(applied, *m)
	}
}

// migrateNext applies the first pending migration of ms and records its
// version, in one transaction, and returns it; nil when none is pending.
func migrateNext(ctx context.Context, db Beginner, ms []Migration, schema string) (*Migration, error) {
	tx, err := beginReadCommitted(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("atomicphase: migrate: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	// The version is read after the lock is granted, so a run that waited
	// sees the migrations of the run it waited for, and goes on from there.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockID)); err != nil {
		return nil, fmt.Errorf("atomicphase: migrate: lock: %w", err)
	}
	version, exists, err := readVersion(ctx, tx, schema)
	if err != nil {
		return nil, fmt.Errorf("atomicphase: migrate: %w", err)
	}
	if version > len(ms) {
		return nil, fmt.Errorf("atomicphase: migrate: %w (the database is at version %d, this release knows versions up to %d)",
			ErrSchemaTooNew, version, len(ms))
	}
	if !exists {
		if err := createSchema(ctx, tx, schema); err != nil {
			return nil, fmt.Errorf("atomicphase: migrate: %w", err)
		}
		if _, err := tx.Exec(ctx, pgschema.Qualify(schema, createVersionTable)); err != nil {
			return nil, fmt.Errorf("atomicphase: migrate: create %s: %w", versionTable, err)
		}
	}
	var next *Migration
	if version < len(ms) {
		next = &ms[version]
		if _, err := tx.Exec(ctx, pgschema.Qualify(schema, next.SQL)); err != nil {
			return nil, fmt.Errorf("atomicphase: migrate: apply %03d_%s: %w", next.Version, next.Name, err)
		}
		record := pgschema.Qualify(schema, "INSERT INTO atomicphase_migration (version, name) VALUES ($1, $2)")
		if _, err := tx.Exec(ctx, record, next.Version, next.Name); err != nil {
			return nil, fmt.Errorf("atomicphase: migrate: record %03d_%s: %w", next.Version, next.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("atomicphase: migrate: %w", err)
	}
	return next, nil
}

// beginReadCommitted begins at READ COMMITTED where db lets it choose, so
// that the version read after the lock wait sees what the previous holder
// committed even where default_transaction_isolation is higher: a
// REPEATABLE READ snapshot would be taken before the wait. A pgx.Tx can only
// begin a savepoint, which runs at its transaction's level.
func beginReadCommitted(ctx context.Context, db Beginner) (pgx.Tx, error) {
	if db, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		return db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	}
	return db.Begin(ctx)
}

// readVersion returns the highest version recorded in schema, 0 when none
// is, and whether the version table exists. It looks the table up first
// because a failed query would abort tx.
func readVersion(ctx context.Context, tx pgx.Tx, schema string) (version int, exists bool, err error) {
	table := versionTable
	if schema != "" {
		table = pgx.Identifier{schema, versionTable}.Sanitize()
	}
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return 0, false, err
	}
	if !exists {
		return 0, false, refuseCitusWorker(ctx, tx)
	}
	err = tx.QueryRow(ctx, pgschema.Qualify(schema, "SELECT coalesce(max(version), 0) FROM atomicphase_migration")).Scan(&version)
	return version, true, err
}

// citusWorkerSQL reports whether the node is a worker of a Citus cluster,
// on a database where Citus is installed: the coordinator's group is 0, and
// a node added to it as a worker is given another.
const citusWorkerSQL = `SELECT coalesce((SELECT groupid FROM pg_catalog.pg_dist_local_group) > 0, false)`

// refuseCitusWorker returns an error when tx's node is a worker of a
// Citus cluster: the migrations' version table, and the tables a migration
// creates, live on the coordinator, and a worker refuses to create them.
// A process connected to a worker runs its workflows there, but migrates
// through the coordinator.
func refuseCitusWorker(ctx context.Context, tx pgx.Tx) error {
	var citus, worker bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL`).Scan(&citus); err != nil || !citus {
		return err
	}
	if err := tx.QueryRow(ctx, citusWorkerSQL).Scan(&worker); err != nil {
		return err
	}
	if worker {
		return errors.New("this is a worker node of a Citus cluster, whose schema is kept on its coordinator: " +
			"migrate through the coordinator (docs/citus.md)")
	}
	return nil
}

// createSchema creates schema unless it is empty or exists. It looks first,
// rather than CREATE SCHEMA IF NOT EXISTS, which needs the CREATE privilege
// on the database even when the schema exists: a role given a schema that
// an administrator created may lack it.
func createSchema(ctx context.Context, tx pgx.Tx, schema string) error {
	if schema == "" {
		return nil
	}
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil || exists {
		return err
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	return nil
}

// mustParseMigrations reads the migrations in dir of fsys, whose files are
// named NNN_name.up.sql and numbered from 1 without gaps.
func mustParseMigrations(fsys fs.FS, dir string) []Migration {
	names, err := fs.Glob(fsys, path.Join(dir, "*.up.sql"))
	if err != nil {
		panic(err)
	}
	// Glob returns names in lexical order, which the zero-padded numbers
	// make the order of versions.
	var ms []Migration
	for i, file := range names {
		number, name, _ := strings.Cut(strings.TrimSuffix(path.Base(file), ".up.sql"), "_")
		version, err := strconv.Atoi(number)
		if err != nil || version != i+1 || len(number) != 3 || name == "" {
			panic(fmt.Sprintf("atomicphase: migration %s: want %03d_name.up.sql", file, i+1))
		}
		sql, err := fs.ReadFile(fsys, file)
		if err != nil {
			panic(err)
		}
		ms = append(ms, Migration{Version: version, Name: name, SQL: string(sql)})
	}
	return ms
}
