// Package keyrow is the idempotency_keys row and every statement that
// touches it. Other packages never write SQL against the table.
//
// # The row
//
// One row per (tenant, idempotency key) holds the request's fingerprint and
// params, the recovery point of its last committed phase, the typed phase
// state, a lease (locked_at, lock_expires_at, lock_token) and, once
// finished, the response to replay. schema.sql comments every column.
//
// # Acquire
//
// Acquire is one statement: an INSERT ... ON CONFLICT DO UPDATE that creates
// the key or takes over its lease when the lease is free or expired by the
// database clock, and otherwise reads the row to say why not: Replay,
// Held (with the lease time left), Mismatch or Parked. Replays and
// conflicts cost one round trip and write nothing.
//
// # Fencing
//
// Every write by a holder (Advance, Finish, Release, Renew) names the
// holder's lock token. When the token no longer matches, because the lease
// expired and another run took the key over, the write changes nothing and
// returns ErrLeaseLost. Advance and Finish raise inside the transaction
// rather than report zero rows, so that a COMMIT pipelined after them (see
// QueueAdvance) turns into a rollback of the whole phase.
//
// # Keys without a client
//
// Claim takes due keys for the completer with FOR UPDATE SKIP LOCKED; Bury,
// Expire and Reap move keys to dead, close abandoned ones and delete expired
// ones in small batches; Count, Inspect, List, Unlock and Retry serve
// operators.
//
// # Headers and fingerprints
//
// ParseKey reads the Idempotency-Key header in both forms clients send: a
// bare token (Stripe) and an RFC 8941 quoted string (the IETF draft).
// Fingerprint hashes the workflow name and the canonical JSON of the request,
// so equal meaning gives an equal fingerprint regardless of key order,
// whitespace or number spelling.
package keyrow
