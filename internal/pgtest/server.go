package pgtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
)

// EnvDSN names the environment variable holding the DSN of a PostgreSQL
// server for tests to create their databases on. When it is set, tests
// start no server of their own.
const EnvDSN = "ATOMICPHASE_TEST_DATABASE_URL"

const (
	// databasePrefix starts the name of every database this package
	// creates, followed by its creation time, so that sweepStaleDatabases
	// can tell abandoned ones on an external server.
	databasePrefix = "pgtest_"

	// staleDatabaseAge is how old a database on an external server must be
	// before it is taken for the leftover of a killed test binary: far
	// longer than go test's default 10-minute timeout.
	staleDatabaseAge = time.Hour

	// startTimeout bounds starting the shared server, which may include
	// pulling a container image.
	startTimeout = 5 * time.Minute

	// adminTimeout bounds creating or dropping one test database.
	adminTimeout = time.Minute
)

// Cluster is a private PostgreSQL server started from local binaries, as
// described by [pgcluster.Cluster]. A test that restarts the server or kills
// its postmaster starts a Cluster of its own, so as not to disturb the tests
// sharing the server of [Server].
type Cluster = pgcluster.Cluster

// StartCluster starts a Cluster of the caller's own, as [pgcluster.Start]
// does; the caller stops it.
func StartCluster(ctx context.Context) (*Cluster, error) {
	return pgcluster.Start(ctx)
}

// ServerInfo describes the server that the tests of a binary share.
type ServerInfo struct {
	// AdminDSN connects to the server's maintenance database: as the
	// superuser postgres on a server this package started, as whoever
	// EnvDSN names on an external one.
	AdminDSN string

	// Cluster is the server when it was started from local binaries, so a
	// test can restart it or find its postmaster; nil otherwise. Restarting
	// it interrupts every test sharing it, so a test that restarts the
	// server for its own sake is better off with a Cluster of its own.
	Cluster *Cluster
}

// DSN returns the DSN of a new database for t alone, migrated with
// atomicphase.Migrate, and drops the database when t finishes. The first call
// in a test binary starts the shared server (see the package documentation);
// if no server can be had, t fails.
func DSN(t testing.TB) string {
	t.Helper()
	if OnCitus() {
		return citusDSN(t)
	}
	// Not t.Context(): it is canceled before cleanups run, and the drop in
	// the cleanup needs to connect.
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	dsn, drop, err := NewDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Error(err)
		}
	})
	return dsn
}

// NewDatabase is DSN for code without a testing.TB, such as runnable
// examples: it returns the DSN of a new migrated database on the shared
// server, named after label, and a function that drops it.
func NewDatabase(ctx context.Context, label string) (dsn string, drop func() error, err error) {
	srv, err := sharedServer()
	if err != nil {
		return "", nil, err
	}
	name, err := srv.createDatabase(ctx, label)
	if err != nil {
		return "", nil, err
	}
	drop = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		return srv.dropDatabase(ctx, name)
	}
	if dsn, err = withDatabase(srv.admin, name); err != nil {
		_ = drop()
		return "", nil, err
	}
	return dsn, drop, nil
}

// Pool returns a pool on a new database for t alone, as DSN describes, and
// closes it when t finishes.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return PoolWith(t, nil)
}

// PoolWith is Pool with configure applied to the pool's config first, to set
// its size or a tracer.
func PoolWith(t testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return poolOn(t, DSN(t), configure)
}

// SchemaPool returns a pool on a new database for t alone, as Pool does,
// where the library's tables and functions are in each of schemas
// (migrated there with atomicphase.Migrator) and in no schema the
// connection's search_path reaches: a statement that does not name the
// schema finds no table and fails, rather than reach a table that should
// not be there. The schemas are created by the migration.
func SchemaPool(t testing.TB, schemas ...string) *pgxpool.Pool {
	t.Helper()
	SkipOnCitus(t, "the tables of a test are in the schema of its own that Citus gives it")
	pool := Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	_, err := pool.Exec(ctx, `
DROP TABLE idempotency_keys, atomicphase_audit, atomicphase_status_history, atomicphase_backlog_samples, atomicphase_migration;
DROP FUNCTION atomicphase_lease_lost(), atomicphase_advance, atomicphase_finish, atomicphase_advance_from, atomicphase_finish_from`)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	for _, schema := range schemas {
		if err := (atomicphase.Migrator{Schema: schema}).Migrate(ctx, pool); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	var found *string
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idempotency_keys')::text`).Scan(&found); err != nil || found != nil {
		t.Fatalf("pgtest: the search_path still finds idempotency_keys (%v, %v)", found, err)
	}
	return pool
}

// CountingPool is PoolWith with a StatementCounter as the pool's tracer, to
// count every statement and round trip it sends; configure may be nil.
func CountingPool(t testing.TB, configure func(*pgxpool.Config)) (*pgxpool.Pool, *StatementCounter) {
	t.Helper()
	counter := &StatementCounter{}
	return PoolWith(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = counter
		if configure != nil {
			configure(cfg)
		}
	}), counter
}

// poolOn returns a pool on dsn, a database DSN or BouncerDSN created for t,
// with configure applied to its config, and closes it when t finishes.
func poolOn(t testing.TB, dsn string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	// Registered after DSN's cleanup, so it runs first: the pool's
	// connections are closed before the database is dropped.
	t.Cleanup(pool.Close)
	return pool
}

// Server returns the server that the tests of this binary share, starting
// it if no test has yet.
func Server(t testing.TB) ServerInfo {
	t.Helper()
	srv, err := sharedServer()
	if err != nil {
		t.Fatal(err)
	}
	return ServerInfo{AdminDSN: srv.admin, Cluster: srv.cluster}
}

// Main runs the tests and then releases the shared server: it stops the
// server this package started, or drops the template database from an
// external one. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Without it a started server still dies with the test binary, but its
// temporary directory stays until the next test binary sweeps it away.
//
// When the tests pass, Main then fails the binary if any goroutine is left
// running (go.uber.org/goleak), besides those ignore names by their
// top function: a run, heartbeat or background service that outlives its
// test is a leak the package's users would inherit.
func Main(m *testing.M, ignore ...string) {
	code := m.Run()
	if err := Release(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		opts := []goleak.Option{}
		for _, fn := range ignore {
			opts = append(opts, goleak.IgnoreTopFunction(fn))
		}
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left running after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Release releases the shared server as Main does, for a TestMain with
// cleanup of its own; tests that run after it fail.
func Release() error { return stopShared() }

// shared is the one server of this test binary, started by the first test
// that needs it. It is package state because tests cannot pass it to each
// other, and one server per binary is what makes a test's database cheap.
var shared struct {
	mu  sync.Mutex
	srv *server
	err error
}

func sharedServer() (*server, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = startShared()
	}
	return shared.srv, shared.err
}

func startShared() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		srv, err := newServer(ctx, dsn, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%w (server from %s)", err, EnvDSN)
		}
		return srv, nil
	}
	tw, err := startThrowaway(ctx, true)
	if err != nil {
		return nil, err
	}
	srv, err := newServer(ctx, tw.dsn, tw.cluster, tw.stop)
	if err != nil {
		_ = tw.stop()
		return nil, err
	}
	return srv, nil
}

func stopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	srv := shared.srv
	shared.srv, shared.err = nil, errors.New("pgtest: shared server used after Main stopped it")
	// The bouncer goes first: it holds connections to the server.
	bouncerErr := errors.Join(stopBouncer(), stopCitus())
	if srv == nil {
		return bouncerErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	return errors.Join(bouncerErr, srv.close(ctx))
}

// server is a PostgreSQL server holding a migrated template database, from
// which it creates test databases.
type server struct {
	admin    string       // DSN of the maintenance database
	cluster  *Cluster     // the server, when started from local binaries
	stop     func() error // releases a server this package started; nil for an external one
	template string
}

// newServer creates and migrates a template database on the server whose
// maintenance database admin names. On an external server (stop is nil), it
// first drops databases abandoned there by killed test binaries.
func newServer(ctx context.Context, admin string, cluster *Cluster, stop func() error) (*server, error) {
	s := &server{admin: admin, cluster: cluster, stop: stop, template: databaseName("template")}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	if stop == nil {
		sweepStaleDatabases(ctx, conn)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(s.template)); err != nil {
		return nil, fmt.Errorf("pgtest: create template database: %w", err)
	}
	if err := s.migrateTemplate(ctx); err != nil {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(s.template)+" WITH (FORCE)")
		return nil, err
	}
	return s, nil
}

func (s *server) migrateTemplate(ctx context.Context) error {
	dsn, err := withDatabase(s.admin, s.template)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pgtest: connect to template database: %w", err)
	}
	// Closed before any clone: CREATE DATABASE waits up to five seconds for
	// sessions in the template to go, then fails.
	defer conn.Close(ctx)
	if err := atomicphase.Migrate(ctx, conn); err != nil {
		return fmt.Errorf("pgtest: migrate template database: %w", err)
	}
	return nil
}

// createDatabase clones the template into a new database named after the
// test.
//
// Clones run concurrently. CREATE DATABASE ... TEMPLATE refuses a template
// that has sessions of its own ("source database is being accessed by other
// users"), but a clone in progress is a session in the maintenance database,
// not in the template, so clones do not block each other; nothing else
// connects to the template once it is migrated.
func (s *server) createDatabase(ctx context.Context, testName string) (string, error) {
	name := databaseName(testName)
	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE "+ident(s.template)); err != nil {
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	return name, nil
}

// dropDatabase drops a test database, closing the connections the test left
// open: a test that forgot to close a pool should not fail the cleanup.
func (s *server) dropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// close stops a server this package started, or drops the template from an
// external one.
func (s *server) close(ctx context.Context) error {
	if s.stop != nil {
		return s.stop()
	}
	return s.dropDatabase(ctx, s.template)
}

// sweepStaleDatabases drops databases this package created on an external
// server more than staleDatabaseAge ago, left behind by test binaries that
// were killed before their cleanups ran. Failures are ignored: sweeping is a
// courtesy, not something a test depends on.
func sweepStaleDatabases(ctx context.Context, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", databasePrefix)
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		created, ok := databaseCreated(name)
		if !ok || time.Since(created) < staleDatabaseAge {
			continue
		}
		// Without FORCE, so that a database still in use survives.
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name))
	}
}

// databaseName returns a new database name: the prefix, the creation time,
// a random part, and as much of a lowercased label (a test name) as fits
// in Postgres's 63-byte limit.
func databaseName(label string) string {
	return databaseNameAt(label, time.Now())
}

// databaseNameAt is databaseName for a database created at created.
func databaseNameAt(label string, created time.Time) string {
	const maxLen = 63
	name := fmt.Sprintf("%s%s_%08x_", databasePrefix, strconv.FormatInt(created.Unix(), 36), rand.Uint32())
	var b strings.Builder
	underscore := true
	for _, r := range strings.ToLower(label) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			underscore = false
		case !underscore:
			b.WriteByte('_')
			underscore = true
		}
	}
	slug := b.String()
	if len(name)+len(slug) > maxLen {
		slug = slug[:maxLen-len(name)]
	}
	return strings.TrimRight(name+slug, "_")
}

// databaseCreated returns the creation time encoded in a name from
// databaseName.
func databaseCreated(name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, databasePrefix)
	if !ok {
		return time.Time{}, false
	}
	stamp, _, _ := strings.Cut(rest, "_")
	sec, err := strconv.ParseInt(stamp, 36, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

// withDatabase returns dsn with its database replaced, in either DSN form.
// database is a name from databaseName, which needs no quoting.
func withDatabase(dsn, database string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			// Not wrapped: url errors quote the whole DSN, password included.
			return "", errors.New("pgtest: cannot parse the DSN as a URL")
		}
		u.Path, u.RawPath = "/"+database, ""
		return u.String(), nil
	}
	// In keyword/value form the last setting of a keyword wins.
	return dsn + " dbname=" + database, nil
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }
