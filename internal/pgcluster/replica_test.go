package pgcluster

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// startPair starts a primary and a streaming standby of it, synchronous
// when sync is true, and stops both when t ends.
func startPair(t *testing.T, sync bool) (primary, standby *Cluster) {
	t.Helper()
	ctx := t.Context()
	primary, err := StartPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := primary.Stop(); err != nil {
			t.Error(err)
		}
	})
	execSQL(t, primary.DSN("postgres"), "CREATE TABLE rows (id int PRIMARY KEY)")
	standby, err = StartStandby(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := standby.Stop(); err != nil {
			t.Error(err)
		}
	})
	if sync {
		if err := primary.SetSynchronous(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	return primary, standby
}

func execSQL(t *testing.T, dsn, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// rowIDs returns the ids in the table rows, read through dsn.
func rowIDs(t *testing.T, dsn string) []int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, _ := conn.Query(t.Context(), "SELECT id FROM rows ORDER BY id")
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// inRecovery reports whether the server dsn reaches is a standby.
func inRecovery(t *testing.T, dsn string) bool {
	t.Helper()
	return queryOne[bool](t, dsn, "SELECT pg_is_in_recovery()")
}

// queryOne returns the one value sql returns on dsn.
func queryOne[T any](t *testing.T, dsn, sql string, args ...any) T {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var v T
	if err := conn.QueryRow(t.Context(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func TestFailoverToSynchronousStandbyKeepsEveryCommit(t *testing.T) {
	t.Parallel()
	primary, standby := startPair(t, true)
	dsn := MultiHostDSN("postgres", primary, standby)
	for i := range 100 {
		execSQL(t, dsn, "INSERT INTO rows VALUES ($1)", i)
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if processAlive(primary.PID()) || primary.PID() != 0 {
		t.Fatalf("primary still has postmaster %d after Kill", primary.PID())
	}
	if _, err := pgx.Connect(t.Context(), dsn); err == nil {
		t.Fatal("the multi-host DSN found a writable server with the primary dead and the standby not promoted")
	}
	if err := standby.Promote(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := rowIDs(t, dsn); len(got) != 100 {
		t.Errorf("promoted synchronous standby has %d of the 100 committed rows", len(got))
	}
	// A standby never waits for a standby of its own once promoted.
	execSQL(t, dsn, "INSERT INTO rows VALUES (100)")
}

func TestFailoverToDetachedStandbyLosesLaterCommits(t *testing.T) {
	t.Parallel()
	primary, standby := startPair(t, false)
	execSQL(t, primary.DSN("postgres"), "INSERT INTO rows VALUES (1)")
	// Sent before the detach, row 1 reaches the standby: promotion replays
	// all the WAL the standby received.
	if err := standby.CatchUp(t.Context(), primary); err != nil {
		t.Fatal(err)
	}
	if err := standby.Detach(t.Context()); err != nil {
		t.Fatal(err)
	}
	execSQL(t, primary.DSN("postgres"), "INSERT INTO rows VALUES (2)")
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := rowIDs(t, MultiHostDSN("postgres", primary, standby)); len(got) != 1 || got[0] != 1 {
		t.Errorf("promoted standby has rows %v, want [1]: row 2 was committed after the detach", got)
	}
}

func TestRebuildMakesFailedPrimaryAStandbyOfTheNewOne(t *testing.T) {
	t.Parallel()
	a, b := startPair(t, true)
	dsn := MultiHostDSN("postgres", a, b)
	execSQL(t, dsn, "INSERT INTO rows VALUES (1)")
	// Two failovers: a → b, then b → a, a rebuilt from b in between.
	for i, next := range []struct{ dead, promoted *Cluster }{{a, b}, {b, a}} {
		if err := next.dead.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := next.promoted.Promote(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := next.dead.Rebuild(t.Context(), next.promoted); err != nil {
			t.Fatal(err)
		}
		if err := next.promoted.SetSynchronous(t.Context(), true); err != nil {
			t.Fatal(err)
		}
		if !inRecovery(t, next.dead.DSN("postgres")) {
			t.Fatalf("failover %d: the rebuilt cluster is not a standby", i+1)
		}
		execSQL(t, dsn, "INSERT INTO rows VALUES ($1)", i+2)
	}
	if got := rowIDs(t, dsn); len(got) != 3 {
		t.Errorf("after two failovers the primary has rows %v, want [1 2 3]", got)
	}
	if inRecovery(t, dsn) {
		t.Error("the multi-host DSN reached a standby")
	}
}

// TestSetSynchronousRefusesAsynchronousCommits checks that a cluster whose
// commits wait for no standby, as Start's do, is not made synchronous in
// name only.
func TestSetSynchronousRefusesAsynchronousCommits(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	if err := c.SetSynchronous(t.Context(), true); err == nil {
		t.Error("SetSynchronous accepted a cluster with synchronous_commit=off")
	}
}
