package phase_test

import (
	"context"
	"fmt"
	"log"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/phase"
)

// With Config.Schema the library's tables are in a schema of their own,
// migrated there by an atomicphase.Migrator with the same name; the
// workflow's own statements still find its tables by the search_path.
func ExampleConfig_schema() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	if err := (atomicphase.Migrator{Schema: "payments"}).Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	w := transfers()
	client, err := phase.NewClient(pool, &phase.Config{Schema: "payments"}, w)
	if err != nil {
		log.Fatal(err)
	}
	out, err := w.Run(ctx, client, "acme", "key-1", Transfer{Amount: 500, Payout: "bank"})
	if err != nil {
		log.Fatal(err)
	}
	var keys int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments.idempotency_keys`).Scan(&keys); err != nil {
		log.Fatal(err)
	}
	fmt.Println(out.Kind, out.Response.Status, "- keys in payments:", keys)
	// Output: new 201 - keys in payments: 1
}
