package fakestripe_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http/httptest"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v85"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
)

// A ride's charge through the official client, made twice with one
// idempotency key: the second call is answered with the first charge.
func ExampleNewClient() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := fakestripe.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(fakestripe.New(pool, fakestripe.Config{}))
	defer srv.Close()

	sc := stripe.NewClient("sk_test_rides", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL: stripe.String(srv.URL),
	})))
	params := &stripe.ChargeCreateParams{
		Amount:      stripe.Int64(2000),
		Currency:    stripe.String(string(stripe.CurrencyUSD)),
		Customer:    stripe.String("cus_rider"),
		Description: stripe.String("Charge for ride 123"),
		Params:      stripe.Params{IdempotencyKey: stripe.String("ride-123")},
	}
	params.AddMetadata("ride_id", "123")

	first, err := sc.V1Charges.Create(ctx, params)
	if err != nil {
		log.Fatal(err)
	}
	again, err := sc.V1Charges.Create(ctx, params)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(again.ID == first.ID, again.LastResponse.Header.Get("Idempotent-Replayed"))
}

// Faults set from Go: the next charge fails before executing, so the retry
// with the same key is the one that charges.
func ExampleServer_FailBeforeCharge() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	server := fakestripe.New(pool, fakestripe.Config{})
	srv := httptest.NewServer(server)
	defer srv.Close()

	server.FailBeforeCharge(1)
	sc := stripe.NewClient("sk_test_rides", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
	})))
	params := &stripe.ChargeCreateParams{
		Amount:   stripe.Int64(2000),
		Currency: stripe.String("usd"),
		Customer: stripe.String("cus_rider"),
		Params:   stripe.Params{IdempotencyKey: stripe.String("ride-123")},
	}
	var se *stripe.Error
	if _, err := sc.V1Charges.Create(ctx, params); errors.As(err, &se) {
		fmt.Println("first attempt:", se.HTTPStatusCode, se.Type)
	}
	if _, err := sc.V1Charges.Create(ctx, params); err == nil {
		fmt.Println("retry charged")
	}
}
