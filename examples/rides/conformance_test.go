package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/conformance"
	"github.com/atomicphase/atomicphase/examples/internal/exampleprog/exampleprogtest"
	"github.com/atomicphase/atomicphase/examples/internal/fakeapi/fakeapitest"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// The rides API, served by rides serve in front of rides fakestripe, passes
// every scenario of the atomicphase profile strictly, counted by the charges fake
// Stripe made, with a second rider for scoping and a restart of the API in
// the middle of a storm. Fake Stripe answers slowly, as the real one does,
// so that a ride is in flight long enough to be caught.
func TestServePassesTheConformanceCheck(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	stripeAddr, apiAddr := exampleprogtest.FreeAddr(t), exampleprogtest.FreeAddr(t)
	stripe := start(t, "fakestripe", "-addr", stripeAddr, "-database-url", dsn)
	stripe.waitListening(t, stripeAddr)
	serve := func() *command {
		c := start(t, "serve", "-addr", apiAddr, "-database-url", dsn, "-stripe-url", "http://"+stripeAddr)
		c.waitListening(t, apiAddr)
		return c
	}
	api := serve()

	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const otherRider = "other@example.com"
	if _, err := pool.Exec(t.Context(), `INSERT INTO users (email, stripe_customer_id) VALUES ($1, $2)`, otherRider, ride.UserCustomer); err != nil {
		t.Fatal(err)
	}
	res, err := http.Post("http://"+stripeAddr+"/_faults", "application/json", strings.NewReader(`{"delay_ms": 150}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()

	conformance.Test(t, conformance.Config{
		URL: "http://" + apiAddr + "/rides",
		Header: http.Header{"Authorization": {ride.UserEmail},
			"Content-Type": {"application/x-www-form-urlencoded"}},
		Body:        []byte("origin_lat=1&origin_lon=2&target_lat=3&target_lon=4"),
		OtherCaller: http.Header{"Authorization": {otherRider}},
		// The API is phase.Handler's: held to its spelling, not only to
		// what is safe.
		Profile: conformance.AtomicPhase(),
		Strict:  true,
		Executions: func(ctx context.Context) (int64, error) {
			return fakeapitest.Count(ctx, "http://"+stripeAddr, "charges")
		},
		Restart: func(context.Context) error {
			if code := api.stop(t); code != 0 {
				return fmt.Errorf("rides serve exited %d:\n%s", code, api)
			}
			api = serve()
			return nil
		},
	})
}
