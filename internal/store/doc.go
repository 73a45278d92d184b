// Package store holds every statement that touches the idempotency_keys
// table. Nothing outside the library can call it: a key is advanced,
// finished, released or claimed only by running its workflow.
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
// returns keyrow.ErrLeaseLost. Advance and Finish raise inside the
// transaction rather than report zero rows, so that a COMMIT pipelined after
// them (see QueueAdvance) turns into a rollback of the whole phase.
//
// # Keys without a client
//
// Claim takes due keys for the completer with FOR NO KEY UPDATE SKIP LOCKED; Bury,
// Expire and Reap move keys to dead, close abandoned ones and delete expired
// ones in small batches; Count, Inspect, List, Unlock and Retry serve
// operators.
package store
