package phase_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// TestAHeldKeyWaitsForRetryAndResumesUnderItsDownstreamKey: an operator
// holds a key while a run is in its foreign call. The run is fenced out
// (its commit fails, its call goes on); neither the completer nor a
// request runs the key. Retried, the completer finishes it: a repeatable
// call is made again under the same downstream key; one that is not safe
// to repeat is not made again, and the key waits for the operator's word
// on it, held as unknown.
func TestAHeldKeyWaitsForRetryAndResumesUnderItsDownstreamKey(t *testing.T) {
	t.Parallel()
	for _, repeatable := range []bool{true, false} {
		t.Run(map[bool]string{true: "repeatable", false: "not safe to repeat"}[repeatable], func(t *testing.T) {
			t.Parallel()
			holdDuringCall(t, repeatable)
		})
	}
}

func holdDuringCall(t *testing.T, repeatable bool) {
	db := pgtest.Pool(t)
	var (
		mu       sync.Mutex
		sends    = map[string]int{}
		blocking atomic.Bool
		entered  = make(chan struct{}, 1)
		release  = make(chan struct{})
	)
	blocking.Store(true)
	type run = phase.Input[order, struct{}]
	paid := phase.Foreign("paid",
		func(ctx context.Context, in *run) (string, error) {
			mu.Lock()
			sends[in.DownstreamKey()]++
			mu.Unlock()
			if blocking.Swap(false) {
				entered <- struct{}{}
				<-release
			}
			return "po_1", nil
		},
		func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, map[string]string{"payout": id}), nil
		})
	if repeatable {
		paid = paid.Repeatable()
	}
	w, err := phase.NewWorkflow("payout", paid)
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet, Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	type result struct {
		out *phase.Outcome
		err error
	}
	ran := make(chan result, 1)
	go func() {
		out, err := w.Run(ctx, c, "acme", "k1", order{})
		ran <- result{out, err}
	}()
	<-entered
	row, err := c.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Hold(phase.WithActor(ctx, "alice"), "acme", "k1", row.Seen()); err != nil {
		t.Fatal(err)
	}
	close(release)
	if r := <-ran; !errors.Is(r.err, keyrow.ErrLeaseLost) {
		t.Fatalf("the run in its call when the key was held returned %+v, %v; want ErrLeaseLost", r.out, r.err)
	}
	row, err = c.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if row.Hold != keyrow.HoldDead || row.RecoveryPoint != keyrow.Started || row.LeaseTakenAt != nil {
		t.Fatalf("after hold: hold %q at %q, lease %v; want dead at started, no lease", row.Hold, row.RecoveryPoint, row.LeaseTakenAt)
	}
	if res, err := c.Complete(ctx); err != nil || res.Claimed != 0 {
		t.Fatalf("completer on a held key: %+v, %v; want nothing claimed", res, err)
	}
	if out, err := w.Run(ctx, c, "acme", "k1", order{}); err != nil || out.Kind != phase.OutcomeOnHold {
		t.Fatalf("a request for a held key: %v, %v; want on hold", out, err)
	}
	audit, err := c.Audit(ctx, keyrow.AuditFilter{Action: keyrow.ActionHold})
	if err != nil || len(audit) != 1 || audit[0].Actor != "alice" || audit[0].Key != "k1" {
		t.Fatalf("audit of the hold: %+v, %v; want one entry by alice", audit, err)
	}

	if err := c.Retry(ctx, "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	res, err := c.Complete(ctx)
	if err != nil {
		t.Fatal(err)
	}
	row, err = c.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sends) != 1 {
		t.Fatalf("calls by downstream key %v, want every call under one key", sends)
	}
	want := 1
	if repeatable {
		want = 2
		if res.Completed != 1 || row.FinishedAt == nil || row.ResponseStatus == nil || *row.ResponseStatus != http.StatusCreated {
			t.Fatalf("after retry: %+v, finished %v, status %v; want the key completed with 201", res, row.FinishedAt, row.ResponseStatus)
		}
	} else if row.Hold != keyrow.HoldUnknown || row.FinishedAt != nil || row.RecoveryPoint != keyrow.Started {
		t.Fatalf("after retry: hold %q at %q, finished %v; want held as unknown at started", row.Hold, row.RecoveryPoint, row.FinishedAt)
	}
	for key, n := range sends {
		if n != want {
			t.Errorf("%s sent %d times; want %d", key, n, want)
		}
	}
}
