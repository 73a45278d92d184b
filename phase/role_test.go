package phase_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// TestARoleWithTheDocumentedGrantsRunsEverything: the application's role
// needs only what docs/operating.md lists ("The database role"): USAGE on
// the schema and SELECT, INSERT, UPDATE and DELETE on the library's tables.
// With nothing more it runs a workflow, has the completer finish a key
// whose call failed, reaps, counts, lists and retries a key as an operator.
func TestARoleWithTheDocumentedGrantsRunsEverything(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "TestCitusARoleWithTheDocumentedGrantsRunsEverything runs it there")
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, `CREATE TABLE notes (tenant text NOT NULL, key text NOT NULL, phase text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	documentedGrantsRunEverything(t, admin, false)
}

// TestCitusARoleWithTheDocumentedGrantsRunsEverything is
// TestARoleWithTheDocumentedGrantsRunsEverything on a key table distributed
// with Citus, where the role reaches the shards on the workers too.
func TestCitusARoleWithTheDocumentedGrantsRunsEverything(t *testing.T) {
	t.Parallel()
	admin := pgtest.CitusPool(t, nil)
	pgtest.CitusTable(t, admin, `notes (tenant text NOT NULL, key text NOT NULL, phase text NOT NULL)`)
	documentedGrantsRunEverything(t, admin, true)
}

// documentedGrantsRunEverything creates a role with the documented grants
// on the schema of admin's connections, which holds the library's tables
// and notes, and runs everything as it.
func documentedGrantsRunEverything(t *testing.T, admin *pgxpool.Pool, citus bool) {
	ctx := context.Background()
	var schema string
	if err := admin.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	// On Citus each test has a schema of its own in a shared database.
	role := "app_" + strings.TrimPrefix(db, "pgtest_")
	if schema != "public" {
		role = "app_" + schema
	}
	role = role[:min(len(role), 60)]
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT, INSERT ON notes TO ` + role,
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys, atomicphase_audit, atomicphase_status_history,
             atomicphase_backlog_samples, atomicphase_watch, atomicphase_walk TO ` + role,
	} {
		// On Citus the role and its grants reach every node.
		if err := pgtest.RetryDeadlocks(func() error { _, err := admin.Exec(ctx, stmt); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if citus {
		// docs/citus.md: Citus draws the audit's ids on the coordinator
		// with nextval, which checks the role's grant on the sequence.
		grant := `GRANT USAGE ON SEQUENCE atomicphase_audit_id_seq TO ` + role
		if err := pgtest.RetryDeadlocks(func() error { _, err := admin.Exec(ctx, grant); return err }); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, stmt := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			_ = pgtest.RetryDeadlocks(func() error { _, err := admin.Exec(context.Background(), stmt); return err })
		}
	})
	cfg := admin.Config().Copy()
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var failing atomic.Bool
	failing.Store(true)
	note := func(name string) func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) error {
		return func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) error {
			_, err := tx.Exec(ctx, `INSERT INTO notes VALUES ($1, $2, $3)`, in.Tenant, in.Key, name)
			return err
		}
	}
	w, err := phase.NewWorkflow("granted",
		phase.Local("noted", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			return phase.Next(), note("noted")(ctx, tx, in)
		}),
		phase.Foreign("called",
			func(ctx context.Context, in *phase.Input[order, struct{}]) (string, error) {
				if failing.Load() {
					return "", errors.New("provider down")
				}
				return "ok", nil
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], _ string) (phase.Result, error) {
				return phase.JSON(201, "done"), note("called")(ctx, tx, in)
			}).Repeatable())
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pool, &phase.Config{Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Run(ctx, c, "acme", "k1", order{}); err == nil {
		t.Fatal("a run whose call failed succeeded")
	}
	failing.Store(false)
	if out, err := w.Run(ctx, c, "acme", "k2", order{}); err != nil || out.Kind != phase.OutcomeNew {
		t.Fatalf("a run as the role: %v, %v", kindOf(out), err)
	}
	if res, err := c.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("a completer pass as the role: %+v, %v; want the failed key completed", res, err)
	}
	if _, err := c.Reap(ctx); err != nil {
		t.Fatalf("a reaper run as the role: %v", err)
	}
	// The completer logs a failure to record its history and goes on: the
	// tables say whether the role could.
	var recorded bool
	err = admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM atomicphase_status_history) AND EXISTS (SELECT FROM atomicphase_backlog_samples)`).Scan(&recorded)
	if err != nil || !recorded {
		t.Fatalf("the completer's pass as the role recorded its history: %v, %v; want a minute and a count", recorded, err)
	}
	if _, err := c.Backlog(ctx); err != nil {
		t.Fatalf("the backlog as the role: %v", err)
	}
	counts, err := c.Counts(ctx)
	if err != nil || counts.Finished != 2 {
		t.Fatalf("counts as the role: %+v, %v; want 2 finished", counts, err)
	}
	if page, err := c.List(ctx, keyrow.ListFilter{Status: keyrow.StatusFinished}); err != nil || len(page.Keys) != 2 {
		t.Fatalf("a listing of the finished keys as the role: %d keys, %v; want 2", len(page.Keys), err)
	}
	// A key the completer gave up on, retried by an operator: an audited
	// action.
	failing.Store(true)
	if _, err := w.Run(ctx, c, "acme", "k3", order{}); err == nil {
		t.Fatal("a run whose call failed succeeded")
	}
	if _, err := admin.Exec(ctx, `UPDATE idempotency_keys SET hold = 'dead' WHERE idempotency_key = 'k3'`); err != nil {
		t.Fatal(err)
	}
	if err := c.Retry(phase.WithActor(ctx, "ops"), "acme", "k3"); err != nil {
		t.Fatalf("an operator's retry as the role: %v", err)
	}
	var audited int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM atomicphase_audit WHERE idempotency_key = 'k3' AND refused IS NULL`).Scan(&audited); err != nil || audited != 1 {
		t.Fatalf("%d audit rows of the retry (%v); want 1", audited, err)
	}
}
