package phase_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
)

// Isolation runs one phase's transaction at a stricter level than the
// database's default. Its serialization failures are retried, up to
// Config.MaxPhaseRetries.
func ExamplePhase_Isolation() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type run = phase.Input[struct{}, struct{}]
	level := func(name string) phase.Phase[struct{}, struct{}] {
		return phase.Local(name, func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			var iso string
			err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&iso)
			fmt.Println(name, iso)
			return phase.Next(), err
		})
	}
	w, err := phase.NewWorkflow("seats",
		level("seat_held").Isolation(pgx.Serializable),
		level("ticket_issued"),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, "ok"), nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := w.Run(ctx, client, "acme", "k1", struct{}{}); err != nil {
		log.Fatal(err)
	}
	// Output:
	// seat_held serializable
	// ticket_issued read committed
}
