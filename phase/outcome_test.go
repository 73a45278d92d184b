package phase_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

// A run that runs nothing reports one event, spelled as its outcome, so a
// dashboard counting events and one counting outcomes agree on every name:
// a key held by another run is in_flight in both, a key on hold on_hold.
func TestRefusedRunsReportTheEventSpelledAsTheirOutcome(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	refused := func(key string, req order, want phase.OutcomeKind) {
		t.Helper()
		out, err := e.w.Run(ctx, e.c, "acme", key, req)
		if err != nil || out.Kind != want {
			t.Fatalf("%s: %+v %v, want %s", key, out, err, want)
		}
		evs := e.events.Of(key)
		last := evs[len(evs)-1]
		if string(last.Kind) != string(want) {
			t.Errorf("%s: the run reported %q, want the event spelled as its outcome %q", key, last.Kind, want)
		}
	}
	lamp := order{Item: "lamp", Amount: 5}
	if out, err := e.w.Run(ctx, e.c, "acme", "k1", lamp); err != nil || out.Kind != phase.OutcomeNew {
		t.Fatalf("first run: %+v %v", out, err)
	}
	refused("k1", lamp, phase.OutcomeReplayed)
	refused("k1", order{Item: "lamp", Amount: 6}, phase.OutcomeMismatch)

	// A run stopped in its foreign call holds the key's lease.
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.pay.fail = func(string) error {
		once.Do(func() { close(entered) })
		<-release
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.w.Run(ctx, e.c, "acme", "k2", lamp)
		done <- err
	}()
	<-entered
	refused("k2", lamp, phase.OutcomeInFlight)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := e.events.Count(keyrow.EventInFlight); n != 1 {
		t.Errorf("%d in_flight events, want 1", n)
	}
}

func TestKeyOnHoldIsReportedOnHoldWithItsHold(t *testing.T) {
	t.Parallel()
	events := &phasetest.Events{}
	w, err := phase.NewWorkflow("notify",
		phase.Foreign("sent",
			func(ctx context.Context, in *phase.Input[order, struct{}]) (string, error) {
				return "", phase.MaybeHappened(errors.New("SMTP connection dropped after DATA"))
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], _ string) (phase.Result, error) {
				return phase.JSON(200, "sent"), nil
			}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pgtest.Pool(t), &phase.Config{Hooks: []phase.Hook{events}, Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Run(ctx, c, "acme", "k1", order{Item: "x"}); !errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("first run: %v, want ErrOutcomeUnknown", err)
	}
	out, err := w.Run(ctx, c, "acme", "k1", order{Item: "x"})
	if err != nil || out.Kind != phase.OutcomeOnHold {
		t.Fatalf("retry: %+v %v, want on hold", out, err)
	}
	evs := events.Of("k1")
	last := evs[len(evs)-1]
	if last.Kind != keyrow.EventOnHold || last.Hold != keyrow.HoldUnknown || string(last.Kind) != string(out.Kind) {
		t.Errorf("retry reported %q hold %q, want %q hold %q", last.Kind, last.Hold, keyrow.EventOnHold, keyrow.HoldUnknown)
	}
}
