package consume_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/consume"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

// A consumer runs a workflow once per message, the message's id as the
// key. A duplicate delivery replays the stored answer; an id reused with
// another payload is dropped.
func ExampleRun() {
	ctx := context.Background()
	pool, done, err := pgtest.NewPool(ctx, "example") // your application's pool
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	type Invoice struct{ Amount int }
	sent := 0
	w, err := phase.NewWorkflow("invoices",
		phase.Local("invoice_sent", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Invoice, struct{}]) (phase.Result, error) {
			sent++
			return phase.JSON(200, "sent"), nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.DiscardHandler)}, w)
	if err != nil {
		log.Fatal(err)
	}
	deliveries := []struct {
		id      string
		payload Invoice
	}{{"msg-1", Invoice{100}}, {"msg-1", Invoice{100}}, {"msg-1", Invoice{900}}}
	for _, d := range deliveries {
		v := consume.Run(ctx, client, w, "billing", d.id, d.payload)
		switch v.Action {
		case consume.Ack: // the answer is stored: acknowledge the message
			fmt.Println(v.Action, v.Outcome.Kind)
		case consume.Retry: // nak it for v.Backoff(deliveries); at the last delivery allowed, as for Drop
			fmt.Println(v.Action, v.Err)
		case consume.Drop: // it can never succeed: keep it where an operator sees it (a dead letter), then terminate it
			fmt.Println(v.Action, v.Err)
		case consume.Abandon: // stopped as a killed consumer would (tests): neither ack nor nak
		}
	}
	fmt.Println("invoices sent:", sent)
	// Output:
	// ack new
	// ack replayed
	// drop consume: the message id was already used with another payload
	// invoices sent: 1
}
