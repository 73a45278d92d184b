package phase_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// TestCitusLostLeaseKeepsNothingOfThePhase: on Citus the write that
// commits a phase is a function that runs a plain UPDATE and raises when it
// matched no row, so COMMIT, which travels with it, persists nothing. A
// phase whose key was taken over, or deleted, while its Go code ran keeps
// nothing of its transaction, whether it advances or finishes; a fence
// that raised only on a row it could read would have committed the phase
// of a key that is gone.
func TestCitusLostLeaseKeepsNothingOfThePhase(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	pgtest.CitusTable(t, db, "notes (tenant text NOT NULL, key text NOT NULL)")
	steal := `UPDATE idempotency_keys SET lock_token = $3 WHERE tenant = $1 AND id = $2`
	remove := `DELETE FROM idempotency_keys WHERE tenant = $1 AND id = $2`
	for _, tc := range []struct {
		name, lose string
		finish     bool
	}{
		{"advance after a takeover", steal, false},
		{"finish after a takeover", steal, true},
		{"advance of a deleted key", remove, false},
		{"finish of a deleted key", remove, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uuid.NewString()
			local := func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO notes VALUES ($1, $2)`, in.Tenant, in.Key); err != nil {
					return phase.Result{}, err
				}
				args := []any{in.Tenant, in.ID}
				if tc.lose == steal {
					args = append(args, uuid.New())
				}
				if _, err := db.Exec(ctx, tc.lose, args...); err != nil {
					return phase.Result{}, err
				}
				if tc.finish {
					return phase.JSON(201, "done"), nil
				}
				return phase.Next(), nil
			}
			phases := []phase.Phase[order, struct{}]{phase.Local("noted", local)}
			if !tc.finish {
				phases = append(phases, phase.Local("answered", func(context.Context, pgx.Tx, *phase.Input[order, struct{}]) (phase.Result, error) {
					return phase.JSON(201, "done"), nil
				}))
			}
			w, err := phase.NewWorkflow("fenced", phases...)
			if err != nil {
				t.Fatal(err)
			}
			c, err := phase.NewClient(db, nil, w)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Run(ctx, c, "acme", key, order{}); !errors.Is(err, keyrow.ErrLeaseLost) {
				t.Fatalf("run = %v, want ErrLeaseLost", err)
			}
			var notes int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM notes WHERE tenant = 'acme' AND key = $1`, key).Scan(&notes); err != nil {
				t.Fatal(err)
			}
			if notes != 0 {
				t.Fatalf("%d notes of the phase committed after its lease was lost, want 0", notes)
			}
		})
	}
}

// TestCitusAWorkflowRunsThroughAWorkerNode: Citus runs queries from any
// node that holds its metadata, and the functions that commit a phase
// (migration 011) are on every node, so an application that spreads its
// connections over the workers runs its workflows there as through the
// coordinator: each phase commits, and a retry replays the stored answer.
func TestCitusAWorkflowRunsThroughAWorkerNode(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	pgtest.CitusTable(t, db, "notes (tenant text NOT NULL, key text NOT NULL, phase text NOT NULL)")
	worker := pgtest.CitusWorkerPool(t, db)
	// While failing, the second phase fails: its key is left for the
	// completer.
	var failing atomic.Bool
	note := func(name string, res phase.Result) phase.Phase[order, struct{}] {
		return phase.Local(name, func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			if name == "second" && failing.Load() {
				return phase.Result{}, errors.New("second phase failed")
			}
			_, err := tx.Exec(ctx, `INSERT INTO notes VALUES ($1, $2, $3)`, in.Tenant, in.Key, name)
			return res, err
		})
	}
	w, err := phase.NewWorkflow("noted", note("first", phase.Next()), note("second", phase.Next()), note("third", phase.JSON(201, "done")))
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	logger := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := phase.NewClient(worker, &phase.Config{Logger: logger, Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []phase.OutcomeKind{phase.OutcomeNew, phase.OutcomeReplayed} {
		out, err := w.Run(ctx, c, "acme", "k1", order{})
		if err != nil || out.Kind != want || out.Response == nil || out.Response.Status != 201 {
			t.Fatalf("run through the worker: %v, %v; want %v with 201", kindOf(out), err, want)
		}
	}
	var notes int
	var point string
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM notes WHERE tenant = 'acme' AND key = 'k1'),
        (SELECT recovery_point FROM idempotency_keys WHERE tenant = 'acme' AND idempotency_key = 'k1')`).Scan(&notes, &point); err != nil {
		t.Fatal(err)
	}
	if notes != 3 || point != keyrow.Finished {
		t.Fatalf("seen from the coordinator: %d notes, recovery point %q; want 3 and %q", notes, point, keyrow.Finished)
	}
	// The completer and the reaper work through the worker too, and find
	// nothing to complain of: the status history, a reference table, is
	// recorded and trimmed there as on the coordinator, and the completer
	// has no watch to drop a key it finished from.
	if out := logged.String(); out != "" {
		t.Fatalf("the client logged, through the worker:\n%s", out)
	}
	failing.Store(true)
	if _, err := w.Run(ctx, c, "acme", "k2", order{}); err == nil {
		t.Fatal("a run whose second phase failed succeeded")
	}
	failing.Store(false)
	failed := len(logged.String())
	if res, err := c.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("a completer pass through the worker: %+v, %v; want the failed key completed", res, err)
	}
	if ms, err := c.History(ctx, time.Hour); err != nil || len(ms) != 1 || ms[0].Workflow != "noted" {
		t.Fatalf("the status history through the worker after a completer pass: %+v, %v; want its minute", ms, err)
	}
	if _, err := c.Reap(ctx); err != nil {
		t.Fatalf("a reaper run through the worker: %v", err)
	}
	if out := logged.String()[failed:]; out != "" {
		t.Fatalf("the client logged, through the worker:\n%s", out)
	}
}
