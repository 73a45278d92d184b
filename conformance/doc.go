// Package conformance proves an Idempotency-Key endpoint from the outside:
// it sends the requests a retrying client, a network failure and a crowd of
// concurrent clients send, and judges the answers by the HTTP contract of
// draft-ietf-httpapi-idempotency-key-header, Stripe's API or this library's
// handler. It needs nothing from the endpoint but its URL, or its
// http.Handler in a Go test, so it checks endpoints written with any
// framework, behind any gateway, in staging.
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
// a missing, empty, repeated, too long or malformed key is refused with 400;
// a retry is answered with the first answer, byte for byte, marked as a
// replay; the key reused with another request is refused; a retry or
// another request sent while the first is in flight, and a storm of
// identical requests at once, execute once; a 5xx is not kept as final; an
// answer lost to a dropped connection is replayed to the retry; keys are
// scoped to their caller; a restart in a storm loses nothing; every 409,
// 429 and 503 says when to retry. docs/conformance.md explains each.
//
// # Executions
//
// From the outside, a second execution shows as two successful answers for
// one key that differ, or that are both unmarked as replays. With
// [Config.Executions], a count of the endpoint's effects (charges made,
// rows inserted), each scenario checks the exact number of executions.
//
// # Profiles
//
// The guarantees are the same in every [Profile]; where the peers disagree,
// on the replay marker, the status of a reused key, the answer to a key in
// flight with another payload and whether a 5xx may be replayed, the
// profile decides: [IETF], [Stripe] or [AtomicPhase].
//
// # Contract
//
// [OpenAPI] writes the contract a profile checks as an OpenAPI 3.1
// fragment, to merge into an API's own description.
package conformance
