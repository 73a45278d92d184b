package pgcluster

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/testenv"
)

// needBouncer skips or fails t, as testenv decides, when the pgbouncer
// program is missing.
func needBouncer(t *testing.T) {
	t.Helper()
	if _, err := findBouncer(); err != nil {
		testenv.SkipWithout(t, "pgbouncer", err)
	}
}

func startBouncer(t *testing.T, c *Cluster, poolSize int) *Bouncer {
	t.Helper()
	needBouncer(t)
	b, err := StartBouncer(context.Background(), BouncerConfig{Server: c.DSN("postgres"), PoolSize: poolSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// backendPID returns the server session that runs a statement sent on conn.
func backendPID(t *testing.T, conn *pgx.Conn) uint32 {
	t.Helper()
	var pid uint32
	if err := conn.QueryRow(context.Background(), "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestBouncerHandsServerSessionsFromTransactionToTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	needBouncer(t) // before the cluster: skipping should cost nothing
	b := startBouncer(t, startCluster(t), 4)
	connect := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, b.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		return conn
	}
	a, other := connect(), connect()

	// The bouncer answers the login itself, with a process ID of its own.
	if pid := backendPID(t, a); pid == a.PgConn().PID() {
		t.Errorf("the server session %d is the one the login announced: no bouncer in between", pid)
	}
	// Outside a transaction, the session a statement freed is the next
	// one's, whichever client sends it.
	if pa, po := backendPID(t, a), backendPID(t, other); pa != po {
		t.Errorf("two clients' statements ran on sessions %d and %d; a transaction pooler reuses the idle one", pa, po)
	}
	// Inside a transaction, the session is the client's until it ends.
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var inTx uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if po := backendPID(t, other); po == inTx {
		t.Errorf("another client ran on session %d while a transaction held it", po)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A statement prepared on a session stays with the session, not the
	// client: this is why pgx's statement cache fails behind the bouncer.
	if _, err := a.Exec(ctx, "PREPARE probe AS SELECT 1", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, "EXECUTE probe", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Errorf("another client could not run the statement a client prepared on the shared session: %v", err)
	}
}

func TestBouncerStopRemovesEverything(t *testing.T) {
	t.Parallel()
	needBouncer(t)
	ctx := context.Background()
	c := startCluster(t)
	b, err := StartBouncer(ctx, BouncerConfig{Server: c.DSN("postgres")})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, b.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	pid := b.PID()
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	if processAlive(pid) {
		t.Errorf("pgbouncer %d still runs after Stop", pid)
	}
	if _, err := os.Stat(b.dir); !os.IsNotExist(err) {
		t.Errorf("bouncer directory %s still exists after Stop (stat: %v)", b.dir, err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("a connection through the bouncer still works after Stop")
	}
	if err := b.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestBouncerLogsInWithTheServersCredentials(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		server string
		want   []string
	}{
		{"host=/tmp/sock port=5433 user=postgres", []string{"* = host=/tmp/sock port=5433 user=postgres\n", "server_tls_sslmode = disable\n"}},
		{"postgres://alice:it's%20secret@db.example:6543/app?sslmode=require",
			[]string{"* = host=db.example port=6543 user=alice password='it''s secret'\n", "server_tls_sslmode = require\n"}},
		{"postgres://bob@db.example/app?sslmode=prefer", []string{"user=bob\n", "server_tls_sslmode = prefer\n"}},
	} {
		server, err := pgconn.ParseConfig(tc.server)
		if err != nil {
			t.Fatal(err)
		}
		b := &Bouncer{dir: t.TempDir()}
		if err := b.configure(server, BouncerConfig{}); err != nil {
			t.Fatal(err)
		}
		ini, err := os.ReadFile(b.iniPath())
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range append(tc.want, "pool_mode = transaction\n", "default_pool_size = 8\n") {
			if !strings.Contains(string(ini), want) {
				t.Errorf("for server %q, the configuration does not hold %q:\n%s", tc.server, want, ini)
			}
		}
	}
}
