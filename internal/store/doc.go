// Package store holds every statement that touches the idempotency_keys
// table. Nothing outside the library can call it: a key is advanced,
// finished, released or claimed only by running its workflow.
//
// # Acquire
//
// Acquire reads the key and inserts it when it is new, in one statement,
// and otherwise says why it cannot be taken: Replay, Held (with the lease
// time left), Mismatch, Parked or Elsewhere. Replays and conflicts cost one
// round trip, take no lock and write nothing. A key found with a free or
// expired lease is taken over by a second statement, an INSERT ... ON
// CONFLICT DO UPDATE that takes the lease only when the newest row version
// still allows it. Acquire and Renew write only the lease, and commit
// without waiting for the WAL flush; every write of a phase waits for it.
//
// # Fencing
//
// Every write by a holder (Advance, Finish, Release, Renew) names the
// holder's lock token. When the token no longer matches, because the lease
// expired and another run took the key over, the write changes nothing and
// returns keyrow.ErrLeaseLost. Advance and Finish raise inside the
// transaction rather than report zero rows, so that a COMMIT pipelined after
// them (see Write) turns into a rollback of the whole phase.
//
// # The row's rules
//
// The table has no CHECK constraints: Postgres re-reads and re-plans each
// one on every INSERT and UPDATE, which on this hot row cost more than the
// statements. The rules they stated hold by construction instead: every
// value is checked before it is sent (tenant, key and names by length, hold
// and status by value, the fingerprint by its type), a statement that sets
// a lease token sets its expiry, a statement that finishes a key sets its
// recovery point, finish time and response together and clears its lease,
// and a holder's writes match unfinished rows only.
//
// # Keys without a client
//
// Claim takes due keys for the completer with FOR NO KEY UPDATE SKIP LOCKED; Bury,
// Expire and Reap move keys to dead, close abandoned ones and delete expired
// ones in small batches; Count, Inspect, List, Unlock and Retry serve
// operators.
//
// # Schemas
//
// Every statement names the library's tables and function unqualified.
// A client whose tables are in a schema of their own sends them through a
// Schema's Querier, which puts each statement in that schema the first
// time it goes out and keeps the result (see package pgschema); a lease's
// writes, which the phase runner queues on its own connection, are put in
// it with Write.In. Without a schema the Querier is the pool itself, and
// every statement goes out as written.
package store
