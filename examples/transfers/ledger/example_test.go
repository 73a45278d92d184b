package ledger_test

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/transfers/ledger"
	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/phase"
)

// The ledger's API is the transfers workflow, registered with a client that
// runs it and, in the background, finishes the transfers no client comes
// back for, and the HTTP handler.
func ExampleTransfers() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, "postgres://localhost/ledger")
	if err != nil {
		log.Fatal(err)
	}
	if err := ledger.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	transfers, err := ledger.Transfers(payoutprovider.NewClient("http://localhost:8081", nil))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(db, nil, transfers)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	h, err := ledger.Handler(db, client, transfers)
	if err != nil {
		log.Fatal(err)
	}
	// curl -H 'Authorization: Bearer alice' -H 'Idempotency-Key: rent-2026-05' \
	//      -d '{"from_account":2,"payout_destination":"dest_landlord","amount":95000,"currency":"EUR"}' \
	//      localhost:8080/transfers
	log.Fatal(http.ListenAndServe("localhost:8080", h))
}

// Verify checks the ledger's invariants in one snapshot; it is safe to run
// against a live system.
func ExampleVerify() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, "postgres://localhost/ledger")
	if err != nil {
		log.Fatal(err)
	}
	report, err := ledger.Verify(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	if !report.OK() {
		_ = report.Write(log.Writer())
		log.Fatal("the ledger is broken")
	}
}
