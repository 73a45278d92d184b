package ride_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

// This test lives with the example that queues through River, not in
// package phase, so that River never reaches the go.sum of a module that
// imports the library.

// receiptArgs is a River job enqueued by a phase.
type receiptArgs struct {
	Key string `json:"key"`
}

func (receiptArgs) Kind() string { return "receipt" }

// TestRiverInsertTxAsAPhasesFirstStatementIsTransactional enqueues a River
// job as the first thing a phase does, when BEGIN has not been sent yet: the
// job commits with the phase, or not at all, and BEGIN still travels with
// River's statement.
func TestRiverInsertTxAsAPhasesFirstStatementIsTransactional(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, counter := pgtest.CountingPool(t, nil)
	migrator, err := rivermigrate.New(riverpgxv5.New(db), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	// River sends a pg_notify with an insert at most once per FetchCooldown
	// and queue: the warm-up's, so that the counted run sends none, however
	// long the machine takes between the two (100 ms by default).
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Logger: quiet, FetchCooldown: time.Hour, FetchPollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	type run = phase.Input[struct{}, struct{}]
	w, err := phase.NewWorkflow("queued",
		phase.Local("job_queued", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			if _, err := jobs.InsertTx(ctx, tx, receiptArgs{Key: in.Key}, nil); err != nil {
				return phase.Result{}, err
			}
			if strings.HasPrefix(in.Key, "fail") {
				return phase.Result{}, errors.New("the phase fails after its statements")
			}
			return phase.Next(), nil
		}),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.JSON(201, "ok"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Run(ctx, c, "acme", "warm-up", struct{}{}); err != nil {
		t.Fatal(err)
	}
	counter.Reset()
	if _, err := w.Run(ctx, c, "acme", "ok", struct{}{}); err != nil {
		t.Fatal(err)
	}
	// Acquire; BEGIN with River's insert; the advance with COMMIT; the
	// second phase's finish alone.
	if counter.RoundTrips() != 4 {
		t.Errorf("%d round trips, want 4: %q", counter.RoundTrips(), counter.SQL())
	}
	if _, err := w.Run(ctx, c, "acme", "fail", struct{}{}); err == nil {
		t.Fatal("the failing run succeeded")
	}
	rows, err := db.Query(ctx, `SELECT args->>'key' FROM river_job ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, []string{"warm-up", "ok"}) {
		t.Fatalf("jobs for %q, want only the successful runs'", keys)
	}
}
