package phase_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

// TestAForeignCallsRecordIsDurableBeforeTheNextPhaseRuns crashes a run after
// a foreign call returned and its outcome was recorded, in the local phase
// that follows: at that phase's before_tx point, and in its Go code before
// its first statement. The record must have committed before either, so
// that the retry neither sends the call again (a Repeatable call) nor
// reconciles it (a call that is not safe to repeat), and the key holds no
// pending mark for a call whose outcome is known.
func TestAForeignCallsRecordIsDurableBeforeTheNextPhaseRuns(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"repeatable", "reconciled"} {
		for _, where := range []string{"before_tx", "in_code"} {
			t.Run(kind+"/"+where, func(t *testing.T) {
				t.Parallel()
				db := pgtest.Pool(t)
				var (
					mu         sync.Mutex
					sends      = map[string]int{}
					reconciles int
					crashed    bool
				)
				// The record writes, as a record does, so that its
				// transaction is open when the next phase begins.
				record := func(ctx context.Context, tx pgx.Tx, id string) (phase.Result, error) {
					_, err := tx.Exec(ctx, `INSERT INTO charges VALUES ($1)`, id)
					return phase.Next(), err
				}
				if _, err := db.Exec(context.Background(), `CREATE TABLE charges (id text PRIMARY KEY)`); err != nil {
					t.Fatal(err)
				}
				charge := phase.Foreign("charged",
					func(ctx context.Context, in *phase.Input[order, struct{}]) (string, error) {
						mu.Lock()
						defer mu.Unlock()
						sends[in.DownstreamKey()]++
						return "ch_" + in.Key, nil
					},
					func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], id string) (phase.Result, error) {
						return record(ctx, tx, id)
					})
				if kind == "repeatable" {
					charge = charge.Repeatable()
				} else {
					charge = phase.Reconciled(charge, func(ctx context.Context, in *phase.Input[order, struct{}]) (string, phase.Verdict, error) {
						mu.Lock()
						defer mu.Unlock()
						reconciles++
						if sends[in.DownstreamKey()] > 0 {
							return "ch_" + in.Key, phase.Happened, nil
						}
						return "", phase.NotHappened, nil
					}, func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], id string) (phase.Result, error) {
						return record(ctx, tx, id)
					})
				}
				respond := phase.Local("responded", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
					if where == "in_code" && !crashed {
						crashed = true
						return phase.Result{}, fmt.Errorf("the process dies here: %w", phase.ErrCrash)
					}
					var one int
					if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
						return phase.Result{}, err
					}
					return phase.JSON(201, "ok"), nil
				})
				w, err := phase.NewWorkflow("record-"+kind, charge, respond)
				if err != nil {
					t.Fatal(err)
				}
				c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				crashCtx := ctx
				if where == "before_tx" {
					crashCtx = phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "responded", Stage: phase.BeforeTx}))
				}
				if _, err := w.Run(crashCtx, c, "acme", "k1", order{}); !errors.Is(err, phase.ErrCrash) {
					t.Fatalf("run: %v; want the injected crash", err)
				}
				row, err := c.Inspect(ctx, "acme", "k1")
				if err != nil {
					t.Fatal(err)
				}
				if row.RecoveryPoint != "charged" || row.CallPending != "" {
					t.Fatalf("after a crash in the phase after the call: recovery point %q, call pending %q; want the call's record committed (charged) and no pending mark",
						row.RecoveryPoint, row.CallPending)
				}
				if _, err := c.Unlock(ctx, "acme", "k1"); err != nil {
					t.Fatal(err)
				}
				out, err := w.Run(ctx, c, "acme", "k1", order{})
				if err != nil || out.Kind != phase.OutcomeResumed || out.Response.Status != 201 {
					t.Fatalf("retry: %v, %v; want resumed to 201", kindOf(out), err)
				}
				mu.Lock()
				defer mu.Unlock()
				for key, n := range sends {
					if n != 1 {
						t.Errorf("downstream key %s sent %d times; want once", key, n)
					}
				}
				if reconciles != 0 {
					t.Errorf("the call was reconciled %d times; want never: its outcome was recorded", reconciles)
				}
				if row, err := c.Inspect(ctx, "acme", "k1"); err != nil || row.CallPending != "" || row.LeaseLeft > 0 || row.Hold != "" {
					t.Fatalf("finished key: %+v, %v; want no pending mark, lease or hold", row, err)
				}
			})
		}
	}
}
