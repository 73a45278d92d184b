// Package phase declares workflows of atomic phases and runs them under
// idempotency keys with a [Client].
//
// # Workflows
//
// A [Workflow] is a named, ordered list of phases over a request type and a
// state type, declared with [NewWorkflow]. Each phase's name is the recovery
// point it commits; started and finished are reserved. The state is committed with
// every phase, so a later phase, or a resumed run in another process, reads
// what earlier ones produced.
//
// Two kinds of phase make "at most one foreign side effect per phase" a
// matter of the API's shape: [Local] phases do database work in one
// transaction; [Foreign] phases make exactly one call, outside any
// transaction, with a downstream idempotency key ([Input.DownstreamKey]), and
// record its outcome in a short transaction. [Phase.When] lets a phase apply
// only to some requests; [Phase.Repeatable] and [Reconciled] say what to do
// when a call's outcome is unknown.
//
// Send the downstream key as the foreign request's Idempotency-Key header.
// Go's net/http then resends the request by itself when a reused keep-alive
// connection drops before the answer; with the key that is harmless, but a
// test that injects such drops must disable keep-alives to see them, or
// drop the connection only after the first byte of the answer.
//
// # The client
//
// [NewClient] builds the one [Client] a process needs from a pool and a
// [Config] whose zero values are documented defaults. Workflows are
// registered with it: [Workflow.Run] and [Handler] refuse a workflow the
// client does not know, and the client's completer claims only
// keys of its workflows, so during a rolling deploy a process never takes
// keys it cannot run. [Client.Start] runs the completer and the reaper
// (package recovery) in the background; [Client.Stop] stops them and lets
// runs in flight finish, or cancels them when its context ends, each run
// then freeing its lease. Operators act through the client too:
// [Client.Inspect], [Client.List], [Client.Counts], [Client.Unlock],
// [Client.Retry], [Client.Resolve], [Client.Reap]; the atomicphase command
// wraps them. Unlock, Retry and Resolve take what the operator saw
// ([keyrow.Row.Seen]) and refuse, with a [keyrow.ChangedError], a key that
// changed since.
//
// # Connection poolers
//
// The client takes only transaction-scoped locks and sets nothing on a
// session, so it runs through a transaction pooler such as PgBouncer with
// pool_mode = transaction, as long as pgx does not prepare statements on
// server sessions: the pool needs default_query_exec_mode=cache_describe in
// its URL (or pgx.QueryExecModeCacheDescribe in its config). [NewClient]
// refuses query exec modes that cannot send the client's parameters at all
// (exec, simple_protocol) and disabled pgx caches; [Client.Check], which
// Start and the first run call, finds a transaction pooler in front of a
// pool that prepares statements and returns [ErrTransactionPooler].
//
// # Running
//
// [Workflow.Run] takes the key's lease in one statement and then replays the
// stored response, reports a conflict or mismatch, or runs the phases after
// the stored recovery point. Each phase commits together with its fenced
// advance; an error rolls the phase back, frees the lease and keeps the
// recovery point, so the next retry resumes. [Handler] adapts this to
// net/http and answers every error as RFC 9457 problem+json that says
// whether retrying with the same key is safe.
//
// # Requests that finish in the background
//
// With [HTTPConfig.AcceptAfter] the handler answers 202 Accepted as soon as
// the named phase has committed (the ride row exists, say), with Location
// pointing at the request's status, and the run goes on with the remaining
// phases without holding the request. If the process dies, the key's lease
// expires and the completer, or the client's next retry, resumes it after
// its last committed phase: one effect per phase still. A retry of the
// request answers 202 again while the run goes on (not 409), and the
// stored final response once it is done. [StatusHandler] serves the
// status: 202 with the recovery point until the key is finished, then
// its stored response; a tenant only ever sees its own keys, and an error
// of its Tenant function is answered as the handler answers it (401 for a
// refused tenant, 503 with Retry-After for a store outage). Package caller
// follows a 202 by polling its Location.
//
// # Limits and failures
//
// [Config.CallTimeout] (default one minute) bounds each foreign call: a call
// that exceeds it has an unknown outcome, repeated with the same downstream
// key by the next run when the phase is Repeatable and held for
// reconciliation otherwise. [Config.RunTimeout] (default five minutes)
// bounds a run, the completer's included, so one hung key cannot stall a
// completer pass. -1 disables either limit.
//
// A panic in user code (a phase, a call, a record, reconcile, When, Decode
// or Tenant function) is recovered by the runner and ends the run like any
// failure, as a [*PanicError]: nothing of the phase commits, the lease is
// freed and the key stays resumable; the panic is logged with its stack and
// the handler answers 500. The runner recovers rather than re-panics so that
// a bug in one request's phase cannot leave its key locked or take the
// process down, wherever the run was called from.
//
// Errors from the store are told apart by their cause. A request that can
// never be stored (an invalid tenant or key, a NUL character in its JSON) is
// refused before the store with 400. A store that is unreachable, shut down,
// read-only after a failover, or lost in the middle of a run gives
// [ErrUnavailable] and 503 with Retry-After: nothing of the interrupted
// phase was committed and a retry with the same key resumes it. 500 is kept
// for bugs in user code.
//
// Text from outside the library that is only recorded, never run on (the
// error that ended a run, whatever its phase or provider put in it; an
// operator's name and resolution, and the audit of them), is stored
// whatever it holds: a NUL character, which Postgres cannot keep, as the
// two characters \0, and bytes that are not UTF-8 as U+FFFD. Recording a
// run's error never keeps its lease: if the server refuses it anyway, the
// lease is freed without it and the error goes to the log.
//
// # Fencing
//
// Every write of a run names its lease's token, so a run that stalled past
// its lease (a GC pause, a frozen VM) and was taken over writes nothing: its
// phase rolls back and it ends with keyrow.ErrLeaseLost. Before each
// foreign call the run makes sure, by the database clock, that the key is
// still its own, and does not make the call when it is not. The commit of
// the phase before the call (or the statement that took the key) is that
// proof when its transaction began less than a third of the TTL ago, at
// most a second: it found the lease the run's own and extended it to a
// whole TTL from the transaction's start by the database clock, so no other
// run can have taken the key over by its expiry since, and the call costs
// no statement of its own. Otherwise (the run stalled, the phase before ran
// long, or the completer reached the key long after claiming it with many
// others) the run renews its lease first, one statement. While the call
// runs, the lease is renewed every third of its TTL after that proof, until
// the call returns or exceeds CallTimeout.
//
// What remains is the time between that proof and the call's request
// leaving the process, plus the call itself: a holder that stalls longer
// than the whole TTL in exactly that window can still send its call after
// another run took the key over and sent the same call. So can a holder
// whose lease an operator freed with Client.Unlock less than a third of a
// TTL after its last commit: Unlock is for holders known to be dead. Both
// calls carry the same downstream key, so a provider that honours
// idempotency keys acts once; with one that does not, keep LeaseTTL well
// above the longest pause a process can suffer, and prefer providers that
// honour keys.
//
// A local phase costs its own statements plus one round trip: its
// transaction's BEGIN is sent in one batch with its first statement, and
// the fenced advance in one batch with COMMIT; a phase that sends nothing
// costs the advance alone. When the next phase is local too, the advance
// and COMMIT wait and travel in front of that phase's BEGIN and first
// statement (the record of a foreign call never waits: it commits before
// anything after it runs, the next phase's Go code included, so that a
// crash cannot lose a call that was made), so passing from one local phase to the next costs no round
// trip at all: three local phases of one statement each take five round
// trips, acquire included. When the two phases run at the same isolation
// level, that COMMIT and BEGIN are one statement, COMMIT AND CHAIN, which
// commits the one transaction and begins the next with the characteristics
// the one had (on a key table distributed with Citus they stay two): the
// three phases then cost eleven statements. The phase still sees a plain
// pgx.Tx at its isolation level. Its first call pays a round trip of its
// own for BEGIN when it is CopyFrom, Begin (a savepoint), LargeObjects or
// Conn, or a statement with a pgx.QueryExecMode argument; River's InsertTx
// asks for Conn first, so a phase that starts with it pays that round trip
// too.
//
// A phase's Go code therefore runs before the commit of the local phase
// before it is known. The fence still decides: the server runs the batch in
// order and skips the rest of it at the first error, so when the advance
// finds the lease lost, or the COMMIT fails, nothing of the earlier phase
// commits and none of the later phase's statements run. The runner then
// discards what the later phase returned, restores the state as last
// committed, and treats the failure as the earlier phase's: it runs that
// phase again after a serialization failure or deadlock (up to
// Config.MaxPhaseRetries), and otherwise ends the run as that phase's
// failure, or with keyrow.ErrLeaseLost. A local phase's Go code may thus run
// more than once for one commit, as it may after any retried phase; its
// effects belong in its transaction. A phase that fails before sending
// anything has the commit before it sent on its own first, so the key
// resumes after that phase. Two things keep each commit in its own round
// trip: a foreign phase next (its call must follow a commit the run knows
// of), and a PhaseWrapper hook (a wrapped phase includes its commit).
// Meanwhile the earlier phase's transaction stays open, holding its locks
// until the next phase's first statement: keep Go code before a phase's
// first statement short.
//
// # Fault injection
//
// A run consults its [Injector] hooks at every fault [Point] (before a
// transaction, before a foreign call, in it once the lease is renewed,
// after it, before and after commit, before the response); [WithInjector]
// gives one run its own. [ErrCrash] stops the run as a killed process
// would: the transaction rolls back and the lease is kept. [Recorder] discovers a
// workflow's points, [CrashAt] crashes at one, and package phasetest runs the
// whole crash matrix in a workflow author's tests.
//
// # Hooks
//
// [Config.Logger] receives structured logs with workflow, tenant, key and
// recovery_point attributes. Everything else that watches or steers a
// client is a [Hook] in [Config.Hooks], found by the interfaces it
// implements, as pgx finds a tracer's: an [Observer] receives a
// [keyrow.Event], with the run's or pass's context, for everything that
// happens to a key in runs, the completer and the reaper; a [RunWrapper],
// [PhaseWrapper], [CallWrapper] or [PassWrapper] wraps each run, phase,
// foreign call or completer pass in a function that takes and returns its
// context, so a span it starts is the parent of everything the step does,
// the phase's own SQL and the foreign call's HTTP request included; an
// [Injector] injects faults. Events and outcomes share one spelling
// ([OutcomeInFlight] is reported as keyrow.EventInFlight, "in_flight").
// Package otelphase is the OpenTelemetry hook; this package does not
// depend on OpenTelemetry.
package phase
