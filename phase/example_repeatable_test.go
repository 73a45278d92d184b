package phase_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
)

// A provider that honours idempotency keys makes a call safe to repeat.
// Repeatable says so: a lost answer leaves the key resumable, and the next
// run sends the call again with the same downstream key.
func ExamplePhase_Repeatable() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type run = phase.Input[struct{ Amount int }, struct{}]
	var keys []string // the downstream key of each call
	w, err := phase.NewWorkflow("refunds", phase.Foreign("refunded",
		func(ctx context.Context, in *run) (string, error) {
			keys = append(keys, in.DownstreamKey())
			if len(keys) == 1 {
				return "", phase.MaybeHappened(errors.New("timeout"))
			}
			return "re_1", nil // the provider's answer for this key
		},
		func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, id), nil
		}).Repeatable())
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{Logger: quiet}, w)
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		out, err := w.Run(ctx, client, "acme", "k1", struct{ Amount int }{500})
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Print(out.Kind, " ", string(out.Response.Body))
	}
	fmt.Println(len(keys), "calls, same key:", keys[0] == keys[1])
	// Output:
	// phase refunded: phase: outcome of the foreign call is unknown: timeout
	// resumed "re_1"
	// 2 calls, same key: true
}
