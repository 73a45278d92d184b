// Package ledger is a double-entry ledger whose transfers, internal or paid
// out through an external provider, are atomicphase workflows: whatever
// crashes, races or retries happen, money is neither created nor lost, and
// every external transfer is paid out exactly once.
//
// # Accounts and entries
//
// Amounts are int64 minor units (cents); every account holds one currency.
// A customer account keeps its money in three buckets: balance (free to
// spend), held (reserved by its transfers in flight) and paid_out (sent out
// of the ledger, in all). Every movement of money is a pair of entries that
// sums to zero, one leaving a bucket and one entering another, and each
// bucket is the sum of its entries. Money enters the ledger only when an
// account is opened with a deposit (Open), from the currency's funding
// account.
//
// # Phases
//
// A transfer is the workflow Transfers, whose path depends on the request:
//
//	started → funds_held → payout_sent → settled   (external: payout_destination)
//	started → funds_held → settled                 (internal: to_account)
//
// Each phase is one transaction:
//
//   - funds_held (local): checks the accounts and moves the amount from the
//     source's balance to its hold. Insufficient funds, a currency mismatch
//     or an unknown account end the transfer here with a stored answer, and
//     nothing moves.
//   - payout_sent (foreign, external transfers only): asks the payout
//     provider for the payout with the run's downstream idempotency key, so
//     that repeating the call after a crash or a lost answer pays once, then
//     records it. A payout the provider refuses gives the hold back and ends
//     the transfer with a stored answer.
//   - settled (local): moves the hold to the receiving account, or to the
//     source's paid_out, and answers 201 with a Receipt.
//
// The transfer id and the payout id travel in the workflow's typed State,
// committed with each phase, so a resumed run, in any process, knows them.
//
// # Concurrency
//
// The phases that move money lock the accounts they touch, lowest id first,
// and run at READ COMMITTED: transfers sharing an account queue on its row
// lock and each sees the balance the previous one left, and transfers in
// opposite directions cannot deadlock. SERIALIZABLE would keep the balances
// right too, but every transaction queued on a lock would then fail with a
// serialization failure when the holder commits, and spend the phase's
// bounded retries on starting over. The rare serialization failure or
// deadlock is still retried.
//
// # Answers
//
// Handler serves POST /transfers and GET /accounts. A settled transfer is
// 201 with a Receipt. A transfer the ledger refuses is a Problem: 404 for an
// unknown account, 422 for insufficient funds, a currency mismatch or a
// refused payout; like a success it is stored under the Idempotency-Key and
// replayed byte for byte. Invalid requests are refused before anything is
// stored.
//
// # Invariants
//
// Verify checks, in one snapshot, that money is conserved (balances + holds
// + paid out = deposits, per currency), that the entries balance, that no
// balance is negative, that each transfer moved once, that every external
// transfer has exactly one payout at the provider, and that no finished
// transfer left a hold behind.
package ledger
