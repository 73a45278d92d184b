package phase_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// message is what the notify provider returns for a message it sent.
type message struct {
	ID string `json:"id"`
}

// notifier is a provider whose first call's outcome is lost: the call may
// or may not have gone through. It records the downstream key of each call.
type notifier struct {
	mu    sync.Mutex
	keys  []string
	lose  atomic.Bool
	asked atomic.Int32 // calls of the reconcile function
}

func (n *notifier) send(ctx context.Context, in *phase.Input[order, struct{}]) (message, error) {
	n.mu.Lock()
	n.keys = append(n.keys, in.DownstreamKey())
	n.mu.Unlock()
	if n.lose.Load() {
		return message{}, phase.MaybeHappened(errors.New("connection dropped after the request was sent"))
	}
	return message{ID: "msg-sent"}, nil
}

func (n *notifier) calls() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.keys...)
}

// notifyWorkflow sends one message and answers with its id. Its phase is
// not repeatable; with reconcile, it has a reconcile function that can never
// tell (Pending), as when the provider offers no lookup.
func notifyWorkflow(t *testing.T, n *notifier, reconcile bool) *phase.Workflow[order, struct{}] {
	t.Helper()
	record := func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], m message) (phase.Result, error) {
		return phase.JSON(200, m), nil
	}
	p := phase.Foreign("sent", n.send, record)
	if reconcile {
		p = phase.Reconciled(p, func(ctx context.Context, in *phase.Input[order, struct{}]) (message, phase.Verdict, error) {
			n.asked.Add(1)
			return message{}, phase.Pending, nil
		}, record)
	}
	w, err := phase.NewWorkflow("notify", p)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// unknownKey runs key k1 once, losing the call's outcome, and returns a
// client with the workflow registered.
func unknownKey(t *testing.T, n *notifier, reconcile bool) (*phase.Client, *pgxpool.Pool) {
	t.Helper()
	w := notifyWorkflow(t, n, reconcile)
	db := pgtest.Pool(t)
	// A key the completer failed on waits an hour; a resolution resets
	// that, so each pass below takes the key at most once.
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet,
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: time.Hour, MaxBackoff: time.Hour}}, w)
	if err != nil {
		t.Fatal(err)
	}
	n.lose.Store(true)
	if _, err := w.Run(context.Background(), c, "acme", "k1", order{Item: "note"}); !errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("first run: %v, want an unknown outcome", err)
	}
	return c, db
}

func TestResolveAsHappenedRecordsTheOperatorsOutputAndFinishesTheKeyAtOnce(t *testing.T) {
	t.Parallel()
	n := &notifier{}
	c, _ := unknownKey(t, n, true)
	ctx := phase.WithActor(context.Background(), "alice")

	row, err := c.Resolve(ctx, "acme", "k1", keyrow.Resolution{RecoveryPoint: keyrow.Started, Happened: true,
		Output: json.RawMessage(`{"id":"msg-from-the-provider-dashboard"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if row.RecoveryPoint != keyrow.Finished || row.ResponseStatus == nil || *row.ResponseStatus != 200 ||
		!strings.Contains(string(row.ResponseBody), "msg-from-the-provider-dashboard") || row.Resolution != nil {
		t.Fatalf("after resolve: %s, status %v, body %s, resolution %+v; want finished with the operator's output",
			row.RecoveryPoint, row.ResponseStatus, row.ResponseBody, row.Resolution)
	}
	if calls := n.calls(); len(calls) != 1 || n.asked.Load() != 0 {
		t.Fatalf("calls %q, reconcile asked %d times; want the one lost call and no reconcile", calls, n.asked.Load())
	}
	d, err := c.Describe(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Audit) != 1 || d.Audit[0].Actor != "alice" || d.Audit[0].Action != keyrow.ActionResolve {
		t.Fatalf("audit = %+v, want alice's resolution", d.Audit)
	}
	if len(d.Phases) != 1 || !d.Phases[0].Foreign || !d.Phases[0].Passed || d.Phases[0].DownstreamKey != n.calls()[0] {
		t.Fatalf("phases = %+v, want sent, passed, with the downstream key the call sent (%s)", d.Phases, n.calls()[0])
	}
}

func TestResolveAsNotHappenedMakesTheCallAgainWithTheSameDownstreamKey(t *testing.T) {
	t.Parallel()
	n := &notifier{}
	c, _ := unknownKey(t, n, false)
	n.lose.Store(false)

	row, err := c.Resolve(context.Background(), "acme", "k1", keyrow.Resolution{RecoveryPoint: keyrow.Started})
	if err != nil {
		t.Fatal(err)
	}
	if row.RecoveryPoint != keyrow.Finished || !strings.Contains(string(row.ResponseBody), "msg-sent") {
		t.Fatalf("after resolve: %s %s, want finished by the repeated call", row.RecoveryPoint, row.ResponseBody)
	}
	if calls := n.calls(); len(calls) != 2 || calls[0] != calls[1] {
		t.Fatalf("calls %q, want the call made again with the same downstream key", calls)
	}
}

func TestResolveRefusesOutputThatTheRecordFunctionCannotTake(t *testing.T) {
	t.Parallel()
	n := &notifier{}
	c, _ := unknownKey(t, n, false)
	ctx := context.Background()

	for _, output := range []string{`{"message_id":"msg-1"}`, `{"id":7}`, `"msg-1"`, `{"id":"a"} {"id":"b"}`} {
		_, err := c.Resolve(ctx, "acme", "k1", keyrow.Resolution{RecoveryPoint: keyrow.Started, Happened: true, Output: json.RawMessage(output)})
		if !errors.Is(err, phase.ErrInvalidResolution) {
			t.Errorf("resolve with output %s = %v, want ErrInvalidResolution", output, err)
		}
	}
	row, err := c.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if row.Hold != keyrow.HoldUnknown || row.Resolution != nil {
		t.Fatalf("after refused resolutions: hold %q, resolution %+v; want still unknown, nothing recorded", row.Hold, row.Resolution)
	}
	if _, err := c.Resolve(ctx, "acme", "k1", keyrow.Resolution{RecoveryPoint: "sent"}); !errors.Is(err, keyrow.ErrNotUnknown) {
		t.Fatalf("resolve at another recovery point = %v, want ErrNotUnknown", err)
	}
}

// A client without the workflow (the command line) records the
// resolution; the completer of a process with the workflow acts on it
// instead of asking the reconcile function, and checks the output then.
func TestTheCompleterActsOnAResolutionRecordedElsewhere(t *testing.T) {
	t.Parallel()
	n := &notifier{}
	c, db := unknownKey(t, n, true)
	ctx := context.Background()
	cli, err := phase.NewClient(db, &phase.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}

	// The reconcile function cannot tell: the key stays on hold.
	if _, err := c.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	if n.asked.Load() != 1 {
		t.Fatalf("reconcile asked %d times, want once", n.asked.Load())
	}
	// Output that does not fit the phase's type keeps the key on hold.
	if _, err := cli.Resolve(ctx, "acme", "k1", keyrow.Resolution{RecoveryPoint: keyrow.Started, Happened: true,
		Output: json.RawMessage(`{"msg":"x"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	row, err := c.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if row.Hold != keyrow.HoldUnknown || !strings.Contains(row.LastError, "does not decode") || row.Resolution != nil {
		t.Fatalf("after an output that does not fit: hold %q, last error %q, resolution %+v", row.Hold, row.LastError, row.Resolution)
	}

	if _, err := cli.Resolve(ctx, "acme", "k1", keyrow.Resolution{RecoveryPoint: keyrow.Started, Happened: true,
		Output: json.RawMessage(`{"id":"msg-checked"}`)}); err != nil {
		t.Fatal(err)
	}
	asked := n.asked.Load()
	if res, err := c.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("pass after the resolution: %+v, %v; want the key completed", res, err)
	}
	row, err = c.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if row.RecoveryPoint != keyrow.Finished || !strings.Contains(string(row.ResponseBody), "msg-checked") {
		t.Fatalf("after the pass: %s %s", row.RecoveryPoint, row.ResponseBody)
	}
	if n.asked.Load() != asked || len(n.calls()) != 1 {
		t.Fatalf("reconcile asked %d more times, %d calls; want the resolution used instead of both", n.asked.Load()-asked, len(n.calls()))
	}
}

// Two operators resolve the same unknown key from the same view, one with
// the provider's message id, one saying the call did not happen. The second
// must not overwrite the first before a run takes it: the call would be made
// again.
func TestASecondResolutionFromTheSameViewIsRefusedAndTheCallIsNotMadeAgain(t *testing.T) {
	t.Parallel()
	n := &notifier{}
	c, db := unknownKey(t, n, false)
	n.lose.Store(false)
	ctx := context.Background()
	// A client without the workflow records resolutions without running the
	// key, so both land before any run takes one.
	cli, err := phase.NewClient(db, &phase.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	row, err := cli.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	seen := row.Seen()

	if _, err := cli.Resolve(phase.WithActor(ctx, "alice"), "acme", "k1", keyrow.Resolution{RecoveryPoint: keyrow.Started,
		Happened: true, Output: json.RawMessage(`{"id":"msg-from-the-dashboard"}`)}, seen); err != nil {
		t.Fatal(err)
	}
	_, err = cli.Resolve(phase.WithActor(ctx, "bob"), "acme", "k1", keyrow.Resolution{RecoveryPoint: keyrow.Started}, seen)
	var changed *keyrow.ChangedError
	if !errors.As(err, &changed) || changed.Now.Resolution == nil || !changed.Now.Resolution.Happened {
		t.Fatalf("second resolution = %v; want refused, showing the first", err)
	}

	if res, err := c.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("pass = %+v, %v; want the key completed", res, err)
	}
	if row, err = c.Inspect(ctx, "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	if row.RecoveryPoint != keyrow.Finished || !strings.Contains(string(row.ResponseBody), "msg-from-the-dashboard") {
		t.Fatalf("after the pass: %s %s; want finished with the first resolution's output", row.RecoveryPoint, row.ResponseBody)
	}
	if calls := n.calls(); len(calls) != 1 {
		t.Fatalf("calls %q; want only the lost call, never made again", calls)
	}
	d, err := c.Describe(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Audit) != 2 || d.Audit[0].Actor != "bob" || d.Audit[0].Refused == "" || d.Audit[1].Actor != "alice" || d.Audit[1].Refused != "" {
		t.Fatalf("audit = %+v; want alice's resolution and bob's refusal", d.Audit)
	}
}
