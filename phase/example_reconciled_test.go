package phase_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// A charge whose answer is lost after the provider made it. The key is held,
// and the completer asks the provider what became of the call instead of
// charging again.
func ExampleReconciled() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type Charge struct{ Amount int }
	type run = phase.Input[Charge, struct{}]

	// The provider's charges by downstream key; it charges, then the
	// connection drops before its answer arrives.
	charges := map[string]string{}
	call := func(ctx context.Context, in *run) (string, error) {
		charges[in.DownstreamKey()] = fmt.Sprintf("ch_%d", len(charges)+1)
		return "", phase.MaybeHappened(errors.New("connection reset"))
	}
	// The provider can be asked for the charge made under a key.
	reconcile := func(ctx context.Context, in *run) (string, phase.Verdict, error) {
		if id, ok := charges[in.DownstreamKey()]; ok {
			return id, phase.Happened, nil
		}
		return "", phase.NotHappened, nil // the next run makes the call
	}
	record := func(ctx context.Context, tx pgx.Tx, in *run, chargeID string) (phase.Result, error) {
		return phase.JSON(http.StatusCreated, map[string]string{"charge": chargeID}), nil
	}
	w, err := phase.NewWorkflow("charges",
		phase.Reconciled(phase.Foreign("charged", call, record), reconcile, record))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{Logger: quiet,
		// Take keys at once, instead of a minute after they stopped.
		Completer: recovery.CompleterConfig{StuckAfter: -1}}, w)
	if err != nil {
		log.Fatal(err)
	}
	_, err = w.Run(ctx, client, "acme", "k1", Charge{Amount: 2000})
	fmt.Println(errors.Is(err, phase.ErrOutcomeUnknown))

	// The key is on hold: a retry is refused until the outcome is known.
	out, err := w.Run(ctx, client, "acme", "k1", Charge{Amount: 2000})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(out.Kind, out.Hold)

	// The completer reconciles the key (Start runs it in the background).
	if _, err := client.Complete(ctx); err != nil {
		log.Fatal(err)
	}
	out, err = w.Run(ctx, client, "acme", "k1", Charge{Amount: 2000})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(out.Kind, " ", out.Response.Status, " ", string(out.Response.Body))
	fmt.Println("charges:", len(charges))
	// Output:
	// true
	// on_hold unknown
	// replayed 201 {"charge":"ch_1"}
	// charges: 1
}
