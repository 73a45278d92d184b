// Package fakeapi is what the examples' fake third-party APIs (fakestripe,
// payoutprovider) share: a Server that honours Idempotency-Key as Stripe
// does, keeps its keys in Postgres, and fails on demand in the ways that make
// idempotency keys necessary. Each fake adds its own routes and tables; this
// package answers everything about keys, faults and counts.
//
// # Routes
//
// A fake registers its API routes with Server.Handle. Every request to one
// is counted, answered with a Request-Id header, authenticated when the
// fake asks for it (Config.Authenticate), and has its body capped at
// MaxBodyBytes. The Server itself serves the control routes, which need no
// authentication:
//
//	GET  /_faults  the faults still planned
//	POST /_faults  change them: the fields a JSON object names, all or none
//	GET  /_stats   what the Server has done (Stats), the fake's own
//	               counts (Config.Counts) after requests
//
// Any other path or method is answered 404 invalid_request_error, in
// Stripe's words.
//
// # Idempotency
//
// A request that changes something runs through Server.Execute, which
// executes it at most once per caller and idempotency key:
//
//   - The first request to begin executing stores its response in the same
//     transaction that makes its change, so the change never exists without
//     its stored response.
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
// Only requests about to execute draw from the plan (see Faults): requests
// rejected by validation, refused with 409 or answered from a stored result
// never consume a fault. A failure before execution answers 500 api_error
// and stores nothing, so a retry executes; a drop after execution commits
// the change and its stored response and then closes the connection after
// the answer's status line, so the client sees a network error (even on a
// reused keep-alive connection, where Go's net/http would silently resend a
// request that got no byte of an answer) and a retry with the key
// replays the response. The fields of /_faults are named for Config.Action:
// with "charge",
//
//	{"fail_before_charge": 1, "timeout_after_charge": 2,
//	 "fail_before_charge_rate": 0.05, "timeout_after_charge_rate": 0.1, "delay_ms": 50}
//
// # Schema
//
// A Server named N keeps its keys in the table N_idempotency_keys, which
// KeysSchema creates. Config.Schema is the fake's own tables (Config.Tables)
// and that table; Config.Migrate applies it. PaymentsTable creates the
// table of the payments a fake makes, with the columns every fake's
// payments have.
package fakeapi
