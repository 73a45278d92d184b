// Package pgtest gives every test a real PostgreSQL database of its own, on
// any machine, and starts throwaway servers for programs that are not tests.
//
// A test asks for a database and gets one that nobody else touches, already
// migrated with [atomicphase.Migrate]:
//
//	func TestCharge(t *testing.T) {
//		t.Parallel()
//		pool := pgtest.Pool(t)
//		...
//	}
//
// # Sources
//
// The first test that asks for a database starts (or finds) one server, which
// every test in the binary then shares. It comes from the first of these that
// works:
//
//  1. The server named by the DSN in the environment variable
//     ATOMICPHASE_TEST_DATABASE_URL ([EnvDSN]). Tests create and drop their
//     own databases on it, so it must be PostgreSQL 13 or later and the role
//     needs CREATEDB.
//  2. A postgres container started with testcontainers-go, when a Docker
//     engine answers within a couple of seconds.
//  3. A [Cluster] started by package pgcluster from the PostgreSQL server
//     binaries on this machine (initdb and postgres on PATH, in
//     pg_config --bindir, or under /usr/lib/postgresql). It listens only on
//     a Unix socket in a temporary directory and runs with durability turned
//     off. The environment variable ATOMICPHASE_POSTGRES_BINDIR
//     ([pgcluster.EnvBinDir]) names the one directory to take them from, to
//     test against another PostgreSQL version; Docker is then not tried.
//
// When none works, the test fails with a message naming all three fixes; it
// is never skipped.
//
// On that server the package migrates one template database, and each call to
// [DSN] or [Pool] clones it with CREATE DATABASE ... TEMPLATE, which costs a
// file copy instead of a migration. Tests can therefore call t.Parallel freely.
//
// # PgBouncer
//
// [BouncerDSN] and [BouncerPool] give a test its own database as [DSN] and
// [Pool] do, reached through a PgBouncer in transaction pooling mode that
// the tests of the binary share: each transaction runs on whichever of the
// database's few server sessions is free. It is started in front of the
// shared server, whichever source that came from (an external server from
// EnvDSN included, with the login EnvDSN names), from the pgbouncer program
// (Debian and Ubuntu: apt-get install pgbouncer). Without it those tests
// skip in one line saying so, unless ATOMICPHASE_TEST_REQUIRE lists
// pgbouncer ([testenv.RequireEnv]), as CI does: then they fail. [Routes]
// runs a test both ways.
//
// # Cleanup
//
// Each test's database is dropped in t.Cleanup. The server itself outlives the
// tests, because the package cannot know which test is the last one:
//
//   - A local [Cluster] is started with a parent-death signal, so the kernel
//     kills the postmaster when the test binary exits for any reason, SIGKILL
//     included, and its backends follow it. Its temporary directory is removed
//     by [Cluster.Stop], or by the next cluster started after its owner died.
//   - A container is removed by testcontainers' reaper (Ryuk) once the test
//     binary is gone.
//   - On an external server, databases left by a killed test binary are
//     dropped by the next test binary that starts there at least an hour
//     after they were created.
//
// Packages that call [Main] from TestMain stop the server, drop the template
// and remove the temporary directory as soon as their tests finish:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// # Counting statements
//
// [StatementCounter] is a pgx tracer that records the statements and round
// trips a connection makes, so a test can pin the cost of an operation:
//
//	var counter pgtest.StatementCounter
//	config, _ := pgxpool.ParseConfig(pgtest.DSN(t))
//	config.ConnConfig.Tracer = &counter
package pgtest
