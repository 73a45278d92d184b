// Package keyrow is the model of an idempotency key: the row stored for
// each (tenant, key), the rules a key and a tenant must follow, and the
// fingerprint that tells one request from another. It holds no SQL; the
// statements that write a key live inside the library, so a key can only be
// advanced, finished or released by running its workflow.
//
// # The row
//
// One row per (tenant, idempotency key) holds the request's fingerprint and
// params, the recovery point of its last committed phase ([Started] before
// the first, [Finished] once its response is stored), the typed phase state,
// a lease (locked_at, lock_expires_at, lock_token) and, once finished, the
// [Response] to replay. [Row] is what an operator sees of it; schema.sql
// comments every column. Every key is in exactly one [Status].
//
// # Headers and fingerprints
//
// [ParseKey] reads the Idempotency-Key header in both forms clients send: a
// bare token (Stripe) and an RFC 8941 quoted string (the IETF draft).
// [Fingerprint] hashes the workflow name and the canonical JSON of the
// request, so equal meaning gives an equal fingerprint regardless of key
// order, whitespace or number spelling.
package keyrow
