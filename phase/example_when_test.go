package phase_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
)

// When makes a phase apply to some requests only: here, gift wrapping.
// Other runs pass over it without a transaction.
func ExamplePhase_When() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type Order struct {
		Item string
		Gift bool
	}
	type State struct{ Steps []string }
	type run = phase.Input[Order, State]
	step := func(name string) phase.Phase[Order, State] {
		return phase.Local(name, func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			in.State.Steps = append(in.State.Steps, name)
			return phase.Next(), nil
		})
	}
	w, err := phase.NewWorkflow("orders",
		step("order_created"),
		// The predicate reads only the request and the committed state,
		// so every run of a key decides the same way.
		step("gift_wrapped").When(func(in *run) bool { return in.Req.Gift }),
		phase.Local("confirmed", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, in.State.Steps), nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	for i, order := range []Order{{Item: "lamp"}, {Item: "vase", Gift: true}} {
		out, err := w.Run(ctx, client, "acme", fmt.Sprint("k", i), order)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(order.Item, " ", string(out.Response.Body))
	}
	// Output:
	// lamp ["order_created"]
	// vase ["order_created","gift_wrapped"]
}
