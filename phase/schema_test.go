package phase_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// TestAClientWithTablesInASchemaOffTheSearchPathRunsRecoversAndOperates:
// with Config.Schema, every statement of a run, its replay and conflict,
// the completer, the reaper, the history and an operator's action reaches
// the tables of that schema, which the connection's search_path does not
// find (pgtest.SchemaPool checks that it finds no idempotency_keys).
func TestAClientWithTablesInASchemaOffTheSearchPathRunsRecoversAndOperates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.SchemaPool(t, "payments")
	e := setupPool(t, db, func(c *phase.Config) {
		c.Schema = "payments"
		c.Completer = recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}
	})
	h := e.handler(t)

	// A run, its replay, and a conflict with a run in flight.
	first := post(h, "k1", `{"item":"lamp","amount":2000}`)
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	again := post(h, "k1", `{"item":"lamp","amount":2000}`)
	if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() || again.Header().Get(phase.ReplayedHeader) != "true" {
		t.Fatalf("replay: %d %q replayed=%q", again.Code, again.Body, again.Header().Get(phase.ReplayedHeader))
	}
	paused, resume := make(chan struct{}), make(chan struct{})
	pause := phase.InjectorFunc(func(ctx context.Context, at phase.Point) error {
		if at == (phase.Point{Phase: "charged", Stage: phase.BeforeCall}) {
			close(paused)
			<-resume
		}
		return nil
	})
	done := make(chan int, 1)
	go func() {
		pausing := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(phase.WithInjector(r.Context(), pause)))
		})
		done <- post(pausing, "k2", `{"item":"desk","amount":300}`).Code
	}()
	<-paused
	if rec := post(h, "k2", `{"item":"desk","amount":300}`); rec.Code != http.StatusConflict {
		t.Fatalf("a retry while the key runs: %d %s, want 409", rec.Code, rec.Body)
	}
	close(resume)
	if code := <-done; code != http.StatusCreated {
		t.Fatalf("the paused run: %d, want 201", code)
	}

	// A crash after the charge, finished by the completer; its lease is
	// first freed by an operator, with the action audited.
	crash := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "charged", Stage: phase.AfterCall}))
	if _, err := e.w.Run(crash, e.c, "acme", "k3", order{Item: "chair", Amount: 40}); !errors.Is(err, phase.ErrCrash) {
		t.Fatalf("crashed run: %v, want ErrCrash", err)
	}
	freed, err := e.c.Unlock(phase.WithActor(ctx, "ops:ana"), "acme", "k3")
	if err != nil || !freed {
		t.Fatalf("Unlock: %v, %v; want the crashed run's lease freed", freed, err)
	}
	res, err := e.c.Complete(ctx)
	if err != nil || res.Completed != 1 {
		t.Fatalf("Complete: %+v, %v; want the crashed key completed", res, err)
	}
	for _, key := range []string{"k1", "k2", "k3"} {
		orders, orderID := e.orderCount(t, key)
		if orders != 1 || e.pay.chargesFor(orderID) != 1 {
			t.Fatalf("%s: %d orders, %d charges; want one of each", key, orders, e.pay.chargesFor(orderID))
		}
	}
	d, err := e.c.Describe(ctx, "acme", "k3")
	if err != nil || d.RecoveryPoint != keyrow.Finished || len(d.Audit) != 1 || d.Audit[0].Actor != "ops:ana" {
		t.Fatalf("Describe: %+v, %v; want k3 finished with the unlock audited", d, err)
	}

	// What operators read: counts, listings, definitions, the history the
	// completer recorded.
	counts, err := e.c.Counts(ctx)
	if err != nil || counts.Finished != 3 || counts.Unfinished() != 0 {
		t.Fatalf("Counts: %+v, %v; want 3 finished", counts, err)
	}
	page, err := e.c.List(ctx, keyrow.ListFilter{Status: keyrow.StatusFinished})
	if err != nil || len(page.Keys) != 3 {
		t.Fatalf("List: %d keys, %v; want 3", len(page.Keys), err)
	}
	defs, err := e.c.Definitions(ctx)
	if err != nil || len(defs) != 0 {
		t.Fatalf("Definitions: %v, %v; want no unfinished keys", defs, err)
	}
	minutes, err := e.c.History(ctx, time.Hour)
	if err != nil || len(minutes) == 0 {
		t.Fatalf("History: %v, %v; want the minute the completer recorded", minutes, err)
	}

	// The reaper deletes a finished key past its retention.
	if _, err := db.Exec(ctx, `UPDATE payments.idempotency_keys SET finished_at = now() - interval '400 days', created_at = now() - interval '400 days', retain_for = NULL
		WHERE idempotency_key = 'k1'`); err != nil {
		t.Fatal(err)
	}
	reaped, err := e.c.Reap(ctx)
	if err != nil || reaped.Reaped != 1 {
		t.Fatalf("Reap: %+v, %v; want k1 reaped", reaped, err)
	}
	if _, err := e.c.Inspect(ctx, "acme", "k1"); !errors.Is(err, keyrow.ErrNotFound) {
		t.Fatalf("Inspect of the reaped key: %v, want ErrNotFound", err)
	}
}

// echo is a workflow of one local phase that answers with the request and
// touches no table of its own.
func echo(t *testing.T) *phase.Workflow[order, struct{}] {
	t.Helper()
	w, err := phase.NewWorkflow("echo",
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, in.Req), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestTwoClientsWithTwoSchemasInOneDatabaseKeepSeparateKeys: the same key
// used through clients of two schemas is two keys, each replayed from its
// own schema.
func TestTwoClientsWithTwoSchemasInOneDatabaseKeepSeparateKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.SchemaPool(t, "alpha", "beta")
	w := echo(t)
	clients := map[string]*phase.Client{}
	for _, schema := range []string{"alpha", "beta"} {
		c, err := phase.NewClient(db, &phase.Config{Schema: schema, Logger: quiet}, w)
		if err != nil {
			t.Fatal(err)
		}
		clients[schema] = c
	}
	// Another request under one key would be a mismatch in one schema.
	for i, schema := range []string{"alpha", "beta"} {
		out, err := w.Run(ctx, clients[schema], "acme", "k1", order{Item: schema, Amount: i + 1})
		if err != nil || out.Kind != phase.OutcomeNew {
			t.Fatalf("%s: %+v, %v; want a new key", schema, out, err)
		}
	}
	for i, schema := range []string{"alpha", "beta"} {
		out, err := w.Run(ctx, clients[schema], "acme", "k1", order{Item: schema, Amount: i + 1})
		if err != nil || out.Kind != phase.OutcomeReplayed || !strings.Contains(string(out.Response.Body), schema) {
			t.Fatalf("%s: %+v, %v; want its own response replayed", schema, out, err)
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "idempotency_keys"}.Sanitize()).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s holds %d keys (%v), want 1", schema, n, err)
		}
	}
}

// TestConfigSchemaRefusesANameThatCannotBeASchema: an invalid name fails
// NewClient, before any statement.
func TestConfigSchemaRefusesANameThatCannotBeASchema(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, name := range []string{`"payments"`, "pg_keys", strings.Repeat("s", 64), "bad\x00name", "tab\tname"} {
		if _, err := phase.NewClient(pool, &phase.Config{Schema: name}); err == nil || !strings.Contains(err.Error(), "Config.Schema") {
			t.Errorf("Schema %q: %v, want an error naming Config.Schema", name, err)
		}
	}
	for _, name := range []string{"", "payments", "Payments", "billing-v2", strings.Repeat("s", 63)} {
		if _, err := phase.NewClient(pool, &phase.Config{Schema: name}); err != nil {
			t.Errorf("Schema %q: %v", name, err)
		}
	}
}
