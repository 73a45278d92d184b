// Package recovery is where crashed and abandoned requests are finished:
// the completer, which finishes, reconciles and gives up on keys that no
// client is waiting for, the reaper, which cleans them up, and their
// configuration. A phase.Client builds both from its Config (Completer,
// Reaper) and runs them: its Start starts them, its Stop stops them, and
// its Complete and Reap run them once. Their SQL stays inside the library,
// out of users' reach.
//
// # Completer
//
// A request can stop part-way: its process crashed, its store hiccuped, or a
// foreign call failed. Its key keeps the recovery point of the last
// committed phase, and a client retry resumes it. When no client comes
// back, the completer does: it claims unfinished keys whose lease is free or
// stale and whose last run is older than [CompleterConfig.StuckAfter], with FOR
// NO KEY UPDATE SKIP LOCKED and the same lease a request takes, rebuilds the
// typed request from the stored params, and runs the remaining phases.
// Its claim leaves the key's last run as it was, so a key whose completer's
// run died with its process is due again when its lease runs out.
// Several completers in several processes share the work without a leader.
// A process claims only keys of the workflows registered with its client,
// so during a rolling deploy a process that does not know a new workflow
// leaves its keys alone.
//
// A key the completer keeps failing is retried with growing backoff, and
// after [CompleterConfig.MaxAttempts] failures of the completer's own moves
// to the dead hold for an operator, but only once it is abandoned: a key a
// client retried within StuckAfter is never marked dead, so a client that keeps
// retrying while a provider is down converges once the provider recovers.
// Each run of the completer is bounded by the client's RunTimeout, and a
// pass does not wait for a key that outlasts the rest of its batch by far
// (none of them ending for four times their median, a call that hangs
// until CallTimeout): the key goes on in its slot, and the next pass
// claims keys for the others. One hung key costs a drain one slot, not the
// whole completer. Under a workflow's [CompleterConfig.InFlight] cap whose
// slots such keys hold, that workflow's keys are not claimed, and those
// its pass claimed already are handed back, due again at once.
//
// # Pace
//
// The completer's pace follows its keys, not a clock. A pass that claimed
// keys is followed at once by the next, so after an outage a backlog
// drains as fast as its keys finish: at about Concurrency keys per
// duration of one key, per process. Only a pass that found none, or only
// keys it had handed back already, waits [CompleterConfig.Interval]. A key
// handed back (one that waits for an operator, or for a process that runs
// its definition) goes behind every other due key and is backed off like a
// failure, so such keys never hold up the keys due behind them. A pass
// claims as many keys as finished in half a lease at the last pass's rate
// (at most [CompleterConfig.BatchSize]), so the last key of a batch starts
// well within the lease the claim gave it; the first pass, which knows no
// rate, claims Concurrency. After a pass that failed (store trouble) or
// whose keys mostly failed (provider trouble) the pause doubles, up to a
// minute; provider trouble halves the keys run at once, and the next pass
// claims no more than it runs, so a provider still down gets a few calls a
// pass; each pass that goes well restores one. Live requests keep
// priority: the next pass runs a quarter fewer keys at once (at least one)
// when, during the pass, more than one in a hundred of the process's live
// runs took over 1.5 times the p99 they had while the completer was idle
// (between its passes, not during one that found nothing; the promise that
// their p99 stays within 1.5 times it), or when the keys of the
// pass took, in the median, over 1.5 times the quickest median seen (the
// store is busy, for other processes' live requests too). Both leave the
// foreign calls out: a slow provider does not count, only the time spent
// in the queues for the server's CPU, its locks and the pool.
// [CompleterConfig.InFlight] caps the keys of one workflow run at once,
// for a provider that rate-limits. Several processes share a backlog
// through the SKIP LOCKED claim: each key is claimed by one of them, and
// each runs pass after pass while keys are due. docs/operating.md says how
// long a backlog takes to drain.
//
// # Unknown outcomes
//
// A foreign call can end without telling whether it happened. Unless its
// phase is declared repeatable (the provider honours the downstream
// idempotency key, as Stripe does), the key is held as unknown: clients get
// 409, and the completer asks the phase's reconcile function, which looks
// the call up and resolves it.
//
// # Reaper
//
// The reaper deletes finished keys older than [ReaperConfig.Retention] in
// small batches, pausing between them so that traffic keeps its latency. A
// key that never finished (the completer gave up on it, or no completer ran)
// and has been idle for the whole retention is first given a terminal 500
// "request abandoned" response rather than deleted: a client retrying it
// late gets that answer instead of a fresh run that could repeat side
// effects, and one retention later the reaper deletes it like any finished
// key. Keys in flight or awaiting reconciliation are never touched.
//
// # Status history
//
// Once a minute (its first pass or count of the minute) the completer
// also records the unfinished keys of each workflow by status in the
// atomicphase_status_history table, for the console's chart: one INSERT
// ... SELECT that counts them from the completer's watch and the keys its
// walk has yet to pass (never a finished key; see docs/operating.md) and
// keeps the row set of the minute that another process wrote first. The
// reaper deletes the rows older than a day, one DELETE a run.
//
// Every five seconds, on a loop of its own beside its passes (and in a
// pass run on demand), the completer also counts the unfinished keys not
// on hold into the atomicphase_backlog_samples table, each count with the
// database's time, from which phase.Client.Backlog measures how fast a
// backlog drains; the reaper deletes counts older than an hour. On a key
// table distributed with Citus both tables are reference tables, written
// through the coordinator or a worker.
//
// # Metrics
//
// The completer's and reaper's events (completed, completer_failed, dead,
// reaped, expired) are in the one list of keyrow.EventKind, with a run's,
// and reach the observers among the client's hooks (phase.Config.Hooks);
// the client's Counts gives the gauges. [Metrics] tallies events for any
// metrics library to read.
package recovery
