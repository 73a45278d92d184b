// Package payoutprovider is a fake payout provider: an HTTP API that sends
// money out of the ledger to an external destination, keeps its payouts in
// Postgres, honours idempotency keys as Stripe does, and fails on request.
//
// # API
//
//	POST /v1/payouts       make a payout; requires an Idempotency-Key header
//	GET  /v1/payouts/{id}  read a payout
//	GET  /_faults          the faults still planned
//	POST /_faults          change them (JSON, see Faults)
//	GET  /_stats           what this server has done (see Stats)
//
// A payout request is JSON: {"amount": 1250, "currency": "EUR",
// "destination": "dest_alice", "reference": "42"}. The answer is the payout,
// whose status is "paid", or "failed" with a failure_code when the
// destination refuses it ([ClosedDestination] always does). A failed payout
// moved no money, but it is a result like a paid one: it is stored under the
// key and replayed. Every API answer carries a Request-Id; errors are Stripe's
// {"error": {"type", "code", "message", "param"}}, and a route the API does
// not serve is answered 404 invalid_request_error.
//
// # Idempotency
//
// Every payout request carries an Idempotency-Key. The request that first
// executes under a key stores its response in the same transaction that
// makes the payout, so a crash leaves both or neither. Later requests with
// the key and the same parameters get that response again, byte for byte,
// with Idempotent-Replayed: true and Original-Request naming the Request-Id
// of the request that executed; with other parameters they get 400; while
// the first is still executing they get 409. Requests refused before
// executing (bad parameters, an injected failure) store nothing, so a retry
// executes. A stored response answers for 24 hours, as on Stripe; after
// that the key is new.
//
// # Faults
//
// A [Server] fails on purpose when told to, from Go ([Server.SetFaults]) or
// over HTTP (POST /_faults): it can answer 500 before making the payout
// (nothing stored), make the payout and store its result and then close the
// connection without answering (the caller sees a network error and cannot
// know the payout happened), and delay every request.
//
// # Client
//
// [Client] makes payouts. It reports an answer that never came, after the
// request was sent, and any 5xx as [ErrOutcomeUnknown]: the payout may have
// been made, and repeating the request with the same key is the way to find
// out without paying twice.
package payoutprovider
