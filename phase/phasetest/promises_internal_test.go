package phasetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
)

// recordingTB is a testing.TB whose Errorf records the failure instead of
// failing the test, so that a test can show that a check fails.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recordingTB) Helper() {}

// said fails t unless exactly one recorded failure contains want, and
// forgets them all.
func (r *recordingTB) said(t *testing.T, want string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], want) {
		t.Errorf("failures %q; want one that says %q", r.errs, want)
	}
	r.errs = nil
}

// TestPromiseChecksFailWhenAPromiseIsBroken drives the checks of a
// scenario's runs, as a runner that broke each promise would pass its fault
// points, against keys left by real runs, and checks that each broken
// promise fails the scenario, naming it.
func TestPromiseChecksFailWhenAPromiseIsBroken(t *testing.T) {
	t.Parallel()
	pool := Pool(t)
	w, err := phase.NewWorkflow("promises",
		phase.Local("opened", func(ctx context.Context, tx pgx.Tx, in *phase.Input[int, struct{}]) (phase.Result, error) {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return phase.Next(), err
		}),
		phase.Foreign("charged", func(ctx context.Context, in *phase.Input[int, struct{}]) (string, error) {
			return "ch_1", nil
		}, func(ctx context.Context, tx pgx.Tx, in *phase.Input[int, struct{}], id string) (phase.Result, error) {
			return phase.Next(), nil
		}).Repeatable(),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[int, struct{}]) (phase.Result, error) {
			return phase.JSON(201, "ok"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	crash := func(key string, at phase.Point) {
		t.Helper()
		if _, err := w.Run(phase.WithInjector(ctx, phase.CrashAt(at)), c, "acme", key, 1); !errors.Is(err, phase.ErrCrash) {
			t.Fatalf("run of %s crashed at %s: %v", key, at, err)
		}
	}
	// charged: its call recorded; opened: the call not yet made.
	crash("charged", phase.Point{Phase: "answered", Stage: phase.BeforeTx})
	crash("opened", phase.Point{Phase: "charged", Stage: phase.BeforeCall})
	rec := &recordingTB{TB: t}
	run := func(key string) *watcher {
		_, wt := newLedger(rec, c, "acme", key).watch(ctx, "retry", w.Phases(), nil)
		return wt
	}
	pass := func(wt *watcher, phaseName string, stage phase.Stage) {
		if err := wt.Inject(ctx, phase.Point{Phase: phaseName, Stage: stage}); err != nil {
			t.Fatal(err)
		}
	}

	pass(run("charged"), "charged", phase.InCall)
	rec.said(t, "sent phase charged's call again though its record had committed (recovery point charged)")

	pass(run("charged"), "opened", phase.BeforeTx)
	rec.said(t, "ran phase opened again (at opened/before_tx) though it had committed")

	lost := run("opened")
	pass(lost, "charged", phase.AfterCall)
	pass(lost, "answered", phase.BeforeTx)
	rec.said(t, "reached answered/before_tx before the record of phase charged's call committed (recovery point opened)")

	pass(run("opened"), "charged", phase.AfterCommit)
	rec.said(t, "reached charged/after_commit with the phase not committed: recovery point opened")

	stale := run("charged")
	stale.takenOver()
	pass(stale, "answered", phase.AfterCommit)
	rec.said(t, "whose lease had been taken over, committed phase answered")

	// The crashed run's lease is still held: a scenario that ended so
	// failed to free it.
	row, err := c.Inspect(ctx, "acme", "opened")
	if err != nil {
		t.Fatal(err)
	}
	newLedger(rec, c, "acme", "opened").settle(row)
	rec.said(t, "is held although every run on the key has ended")

	// And a run that keeps every promise passes.
	if _, err := c.Unlock(ctx, "acme", "opened"); err != nil {
		t.Fatal(err)
	}
	kept := run("opened")
	for _, at := range []phase.Point{{Phase: "charged", Stage: phase.BeforeCall}, {Phase: "charged", Stage: phase.InCall}, {Phase: "charged", Stage: phase.AfterCall}} {
		pass(kept, at.Phase, at.Stage)
	}
	if len(rec.errs) != 0 {
		t.Fatalf("a run that keeps its promises failed: %q", rec.errs)
	}
}
