package phasetest

import (
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// EnvDSN names the environment variable holding the DSN of a PostgreSQL
// server (13 or later) on which DSN and Pool create their databases; the
// role needs CREATEDB. When it is unset, the first test that asks for a
// database starts a throwaway server: a postgres container when a Docker
// engine answers, else a cluster from the PostgreSQL server binaries on
// this machine (initdb and postgres on PATH, in pg_config --bindir, or under
// /usr/lib/postgresql). When none of the three works the test fails with a
// message naming them; it is never skipped.
const EnvDSN = pgtest.EnvDSN

// DSN returns the DSN of a new database for t alone, already migrated with
// atomicphase.Migrate, and drops it when t finishes. The test creates its own
// tables in it. Every test in the binary shares one server and clones one
// migrated template, so a database costs a file copy (about 20 ms) and tests
// may call t.Parallel freely.
//
// Nothing outlives the test binary for long: each database is dropped in
// t.Cleanup; a throwaway server is killed with the binary even when it is
// killed with SIGKILL (a parent-death signal for a local cluster,
// testcontainers' reaper for a container); on a server named by EnvDSN, a
// database left by a killed binary is dropped by the next binary that starts
// there an hour or more later. Call Main from TestMain to release the server
// as soon as the tests end.
func DSN(t testing.TB) string {
	t.Helper()
	return pgtest.DSN(t)
}

// Pool returns a pool on a new database for t alone, as DSN describes, and
// closes it when t finishes.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgtest.Pool(t)
}

// Main runs the tests, then stops the throwaway server that DSN or Pool
// started, or drops the template database from the server named by EnvDSN.
// Call it from TestMain:
//
//	func TestMain(m *testing.M) { phasetest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if err := pgtest.Release(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
