// Package fakestripe is a stand-in for the part of the Stripe API the rides
// example uses: creating, retrieving and listing charges. It is a real HTTP
// server that the official stripe-go client talks to, it keeps its charges
// in Postgres, it honours Idempotency-Key as Stripe does, and it fails on
// demand in the ways that make idempotency keys necessary.
//
// # Pointing a client at it
//
// Serve a Server, on a listener of its own or an httptest.Server, and give
// its URL to a Stripe client as the API's base URL: the rides example's own
// (ride.NewStripeClient), or the official stripe-go v85 client, built with
// stripe.NewBackendsWithConfig and stripe.WithBackends, which the package's
// tests use:
//
//	srv := httptest.NewServer(fakestripe.New(pool, fakestripe.Config{}))
//	sc := stripe.NewClient("sk_test_rides", stripe.WithBackends(stripe.NewBackendsWithConfig(
//		&stripe.BackendConfig{URL: stripe.String(srv.URL)})))
//	charge, err := sc.V1Charges.Create(ctx, &stripe.ChargeCreateParams{
//		Amount:   stripe.Int64(2000),
//		Currency: stripe.String("usd"),
//		Customer: stripe.String("cus_rider"),
//		Params:   stripe.Params{IdempotencyKey: stripe.String(key)},
//	})
//
// stripe-go retries a request that failed on the network (twice unless
// BackendConfig.MaxNetworkRetries says otherwise), resending the very same
// request, Idempotency-Key included, so its retries never charge twice.
//
// Any API key that starts with sk_test_ is accepted, as a Bearer token (as
// stripe-go sends it) or as the Basic user name (curl -u sk_test_x:); others
// get 401. Every key sees the same charges.
//
// # Charges
//
// POST /v1/charges takes amount, currency, customer, description and
// metadata[key], form-encoded, and answers with a succeeded, captured charge
// object. Missing or malformed parameters, and parameters it does not know,
// are refused with 400 invalid_request_error naming the param, as Stripe
// refuses them. A customer is any ID starting with cus_, except
// DeclineCustomer, whose charges are declined with 402 card_error.
//
// GET /v1/charges/{id} answers with one charge or 404 resource_missing. GET
// /v1/charges lists charges newest first, optionally for one customer, in
// pages of limit (default 10, at most 100) after the starting_after cursor,
// in Stripe's list object.
//
// # Idempotency
//
// A POST with an Idempotency-Key executes at most once per API key and
// idempotency key, as on Stripe:
//
//   - The first request to begin executing stores its response (the charge,
//     or the 402 of a decline) in the same transaction that creates the
//     charge, so a charge never exists without its stored response.
//   - A later request with the same key and the same parameters gets that
//     response byte for byte, with the header Idempotent-Replayed: true and
//     Original-Request naming the request that executed.
//   - A later request with the same key and other parameters gets 400
//     idempotency_error.
//   - A request arriving while another with its key is executing gets 409
//     idempotency_error idempotency_key_in_use.
//   - A request that failed validation, or failed before executing, stores
//     nothing: the key stays free for a corrected request or a retry.
//   - A stored response answers for KeyRetention; after that the key is new.
//
// The executing request holds a transaction-scoped Postgres advisory lock on
// its key, so several Servers on one database, in one process or many, keep
// these rules between them, and a crashed server leaves no key locked.
//
// # Faults
//
// A Server fails charge requests on demand, from Go or over HTTP for a server
// in another process; see Faults for exactly what each fault does. The
// counted faults fail the next n charge requests either before the charge
// (500 api_error, nothing stored, so a retry executes) or after it (the
// charge and its stored response are committed, then the connection is
// closed after the answer's status line, so the client sees a network error,
// on a reused keep-alive connection too, and a retry with the key replays the
// charge). Rates apply the same faults at random, for a
// simulator; a delay slows every request.
//
//	POST /_faults  {"fail_before_charge": 1, "timeout_after_charge": 2, "delay_ms": 50,
//	                "fail_before_charge_rate": 0.05, "timeout_after_charge_rate": 0.1}
//	GET  /_faults  the faults still planned, in the same shape
//	GET  /_stats   {"requests", "charges", "declined", "replays", "conflicts", "faults_injected"}
//
// A POST to /_faults sets the fields it names and leaves the others alone;
// posting zeros clears them. The control routes need no API key.
//
// # Schema
//
// Migrate creates the tables fakestripe_charges and
// fakestripe_idempotency_keys; New expects them to exist.
package fakestripe
