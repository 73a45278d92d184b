package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// TimePassedSQL makes the keys of a test that wrote past times into their
// rows as they would be had that time passed: a key created no later than
// it last ran or finished (the reaper and the completer's walk read keys by
// when they were created), and every due time in the completer's watch
// come (the next claim judges each key by its row again).
const TimePassedSQL = `
UPDATE idempotency_keys SET created_at = least(created_at, last_run_at, finished_at)
WHERE created_at > least(last_run_at, finished_at);
UPDATE atomicphase_watch SET due_at = now() WHERE due_at > now()`

// TimePassed brings the key table of db up to the times a test wrote into
// its rows (see TimePassedSQL). A test calls it after it ages keys by hand.
func TimePassed(t testing.TB, db Execer) {
	t.Helper()
	if _, err := db.Exec(context.Background(), TimePassedSQL); err != nil {
		t.Fatalf("pgtest: time passed: %v", err)
	}
}
