// Package conformance proves an Idempotency-Key endpoint from the outside:
// it sends the requests a retrying client, a network failure and a crowd of
// concurrent clients send, and judges the answers, safety first. It needs
// nothing from the endpoint but its URL, or its http.Handler in a Go test,
// so it checks endpoints written with any framework, behind any gateway, in
// staging.
//
//	func TestChargeEndpoint(t *testing.T) {
//		conformance.Test(t, conformance.Config{
//			Handler: charges,
//			URL:     "/charges",
//			Header:  http.Header{"Authorization": {"Bearer test"}, "Content-Type": {"application/json"}},
//			Body:    []byte(`{"amount": 2000, "currency": "usd"}`),
//		})
//	}
//
// The command atomicphase check runs the same scenarios against a URL.
//
// # Scenarios
//
// [Scenarios] lists them, each with the standard or article it comes from:
// a missing or empty key is refused and not executed; a repeated, too long
// or malformed key is refused, or works as a key; a retry is answered with
// the first answer, byte for byte, marked as a replay; the key reused with
// another request is refused; a retry or another request sent while the
// first is in flight, and a storm of identical requests at once, execute
// once; a replayed 5xx is the first one; an answer lost to a dropped
// connection is replayed to the retry; keys are scoped to their caller; a
// restart while an execution is in flight loses nothing; every 409, 429 and
// 503 a client retries says when. docs/conformance.md explains each.
//
// # Verdicts
//
// A finding is of one of two kinds. What is unsafe fails in every profile:
// a second execution, a replay that differs from the first answer, an
// execution without a key, a reused key's other request executed or given
// the first answer, an answer lost across a restart, one caller's key
// answering another, a missing or absurd Retry-After. An answer that is
// safe but spelled otherwise than the profile says is a [Differs] verdict,
// which fails the check only with [Config.Strict]. A verdict says what was
// seen, and where the check infers (two executions from two answers that
// differ), that it infers.
//
// # Executions
//
// From the outside, a second execution shows as two successful answers for
// one key that differ, or that are both unmarked as replays by an endpoint
// that marks its replays. With [Config.Executions], a count of the
// endpoint's effects (charges made, rows inserted), each scenario checks
// the exact number of executions, and the restart scenario can land its
// restart on an execution in flight.
//
// # Profiles
//
// The guarantees are the same in every [Profile]; where the peers disagree,
// on the replay marker, the status of a reused key, the format of errors,
// whether a 5xx may be replayed and what a key may be, the profile decides
// how an answer is spelled. [Generic], the default, is passed by any safe
// endpoint; [IETF], [Stripe] and [AtomicPhase] hold an endpoint to one
// spelling, with Strict.
//
// # Contract
//
// [OpenAPI] writes the contract a profile checks as an OpenAPI 3.1
// fragment, to merge into an API's own description.
package conformance
