package phase_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// TestARunWhoseLastCommitTheDatabaseLostCommitsNothingMore: after a failover
// to an asynchronous standby, the standby can hold a run's lease but not the
// phase the run committed last. The run must then commit nothing more, and
// make no call that is not safe to repeat; it frees its lease, and the next
// run resumes at once from the recovery point the database holds and runs
// the lost phase again, so the key never finishes without it. The loss is played by moving the key back
// to started, under the same token, and deleting the first phase's row,
// right after that phase committed.
func TestARunWhoseLastCommitTheDatabaseLostCommitsNothingMore(t *testing.T) {
	t.Parallel()
	type run = phase.Input[order, orderState]
	for _, shape := range []struct {
		name string
		// second is the phase after the one whose commit is lost; third,
		// when set, follows it and responds.
		second func(step func(ctx context.Context, tx pgx.Tx, in *run, name string) error, call func(ctx context.Context, in *run) (string, error)) phase.Phase[order, orderState]
		third  bool
		// calls is how many calls the first run makes, and calls the
		// whole test.
		firstCalls, calls int
	}{
		{name: "a local phase's advance, held back to the next phase", third: true,
			second: func(step func(ctx context.Context, tx pgx.Tx, in *run, name string) error, _ func(ctx context.Context, in *run) (string, error)) phase.Phase[order, orderState] {
				return phase.Local("b", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
					return phase.Next(), step(ctx, tx, in, "b")
				})
			}},
		{name: "a finish",
			second: func(step func(ctx context.Context, tx pgx.Tx, in *run, name string) error, _ func(ctx context.Context, in *run) (string, error)) phase.Phase[order, orderState] {
				return phase.Local("b", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
					return phase.JSON(http.StatusCreated, map[string]string{"ok": "b"}), step(ctx, tx, in, "b")
				})
			}},
		{name: "the mark before a call not safe to repeat", third: true, firstCalls: 0, calls: 1,
			second: func(step func(ctx context.Context, tx pgx.Tx, in *run, name string) error, call func(ctx context.Context, in *run) (string, error)) phase.Phase[order, orderState] {
				return phase.Foreign("b", call, func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
					return phase.Next(), step(ctx, tx, in, "b")
				})
			}},
		{name: "the record of a repeatable call", third: true, firstCalls: 1, calls: 2,
			second: func(step func(ctx context.Context, tx pgx.Tx, in *run, name string) error, call func(ctx context.Context, in *run) (string, error)) phase.Phase[order, orderState] {
				return phase.Foreign("b", call, func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
					return phase.Next(), step(ctx, tx, in, "b")
				}).Repeatable()
			}},
	} {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.Pool(t)
			ctx := context.Background()
			if _, err := db.Exec(ctx, `CREATE TABLE steps (ikey text NOT NULL, phase text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			step := func(ctx context.Context, tx pgx.Tx, in *run, name string) error {
				_, err := tx.Exec(ctx, `INSERT INTO steps VALUES ($1, $2)`, in.Key, name)
				return err
			}
			pay := newPayments()
			call := func(ctx context.Context, in *run) (string, error) {
				return pay.Charge(ctx, in.DownstreamKey(), 1, in.Req.Amount)
			}
			phases := []phase.Phase[order, orderState]{
				phase.Local("a", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
					return phase.Next(), step(ctx, tx, in, "a")
				}),
				shape.second(step, call),
			}
			if shape.third {
				phases = append(phases, phase.Local("c", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
					return phase.JSON(http.StatusCreated, map[string]string{"ok": "c"}), step(ctx, tx, in, "c")
				}))
			}
			w, err := phase.NewWorkflow("lost", phases...)
			if err != nil {
				t.Fatal(err)
			}
			c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
			if err != nil {
				t.Fatal(err)
			}

			lose := phase.InjectorFunc(func(ctx context.Context, at phase.Point) error {
				if at != (phase.Point{Phase: "a", Stage: phase.AfterCommit}) {
					return nil
				}
				_, err := db.Exec(ctx, `
					WITH back AS (UPDATE idempotency_keys SET recovery_point = 'started', phase_state = 'null'
					              WHERE idempotency_key = 'k1' AND recovery_point = 'a' AND lock_token IS NOT NULL RETURNING 1)
					DELETE FROM steps WHERE ikey = 'k1' AND EXISTS (SELECT FROM back)`)
				return err
			})
			_, err = w.Run(phase.WithInjector(ctx, lose), c, "acme", "k1", order{Item: "x", Amount: 5})
			if !errors.Is(err, keyrow.ErrLeaseLost) || !errors.Is(err, phase.ErrUnavailable) {
				t.Fatalf("run after its last commit was lost: %v, want keyrow.ErrLeaseLost and phase.ErrUnavailable", err)
			}
			var rp string
			var steps int
			var leased bool
			if err := db.QueryRow(ctx, `SELECT recovery_point, lock_token IS NOT NULL, (SELECT count(*) FROM steps)
				FROM idempotency_keys WHERE idempotency_key = 'k1'`).Scan(&rp, &leased, &steps); err != nil {
				t.Fatal(err)
			}
			if rp != keyrow.Started || leased || steps != 0 {
				t.Fatalf("after the run: key at %q (leased: %v) with %d phase rows, want started, free, with none", rp, leased, steps)
			}
			if got := sum(pay); got != shape.firstCalls {
				t.Fatalf("the run made %d calls, want %d", got, shape.firstCalls)
			}

			// The next run, at once, runs every phase once from the recovery
			// point the database holds.
			out, err := w.Run(ctx, c, "acme", "k1", order{Item: "x", Amount: 5})
			if err != nil || out.Response == nil || out.Response.Status != http.StatusCreated {
				t.Fatalf("next run: %+v, %v; want 201", out, err)
			}
			rows, err := db.Query(ctx, `SELECT phase FROM steps WHERE ikey = 'k1' ORDER BY phase`)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"a", "b"}
			if shape.third {
				want = append(want, "c")
			}
			if len(got) != len(want) || got[0] != "a" || got[1] != "b" || (shape.third && got[2] != "c") {
				t.Fatalf("phase rows %v, want each phase once: %v", got, want)
			}
			if got := sum(pay); got != shape.calls {
				t.Fatalf("%d calls in all, want %d", got, shape.calls)
			}
			if len(pay.calls) > 1 || pay.total() > 1 {
				t.Fatalf("calls under %d downstream keys making %d charges, want one key and at most one charge", len(pay.calls), pay.total())
			}
		})
	}
}

// sum is how many calls p was sent.
func sum(p *payments) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.calls {
		n += c
	}
	return n
}
