// Package phase declares workflows of atomic phases and runs them under
// idempotency keys with a [Client].
//
// # Workflows
//
// A [Workflow] is a named, ordered list of phases over a request type and a
// state type, declared with [NewWorkflow]. Each phase's name is the
// recovery point it commits. The names started and finished are reserved.
// The state is committed with every phase, so a later phase, or a resumed
// run in another process, reads what earlier ones produced.
//
// Two kinds of phase make "at most one foreign side effect per phase" a
// matter of the API's shape:
//
//   - [Local] phases do database work in one transaction.
//   - [Foreign] phases make exactly one call, outside any transaction, with
//     a downstream idempotency key ([Input.DownstreamKey]). They record its
//     outcome in a short transaction.
//
// [Phase.When] lets a phase apply only to some requests. [Phase.Repeatable]
// and [Reconciled] say what to do when a call's outcome is unknown.
//
// Send the downstream key as the foreign request's Idempotency-Key header:
//
//	req.Header.Set("Idempotency-Key", in.DownstreamKey())
//
// Go's net/http then resends the request by itself when a reused
// keep-alive connection drops before the answer. With the key that is
// harmless. A test that injects such drops must disable keep-alives to see
// them, or drop the connection only after the first byte of the answer.
//
// # The client
//
// [NewClient] builds the one [Client] a process needs from a pool and a
// [Config] whose zero values are documented defaults:
//
//	client, err := phase.NewClient(pool, nil, orders, refunds)
//
// Workflows are registered with it. [Workflow.Run] and [Handler] refuse a
// workflow the client does not know. The client's completer claims only
// keys of its workflows, so during a rolling deploy a process never takes
// keys it cannot run.
//
// [Client.Start] runs the completer and the reaper (package recovery) in
// the background. [Client.Stop] stops them and lets runs in flight finish.
// When its context ends it cancels them instead, and each run frees its
// lease.
//
// Operators act through the client too: [Client.Inspect], [Client.List],
// [Client.Counts], [Client.Unlock], [Client.Hold], [Client.Retry],
// [Client.Resolve], [Client.Reap]. The atomicphase command wraps them.
// Unlock, Hold, Retry and Resolve take what the operator saw
// ([keyrow.Row.Seen]). They refuse a key that changed since, with a
// [keyrow.ChangedError].
//
// # Connection poolers
//
// The client takes only transaction-scoped locks and sets nothing on a
// session. So it runs through a transaction pooler such as PgBouncer with
// pool_mode = transaction, as long as pgx does not prepare statements on
// server sessions. The pool needs this in its URL (or
// pgx.QueryExecModeCacheDescribe in its config):
//
//	default_query_exec_mode=cache_describe
//
// [NewClient] refuses query exec modes that cannot send the client's
// parameters at all (exec, simple_protocol), and disabled pgx caches.
// [Client.Check], which Start and the first run call, finds a transaction
// pooler in front of a pool that prepares statements and returns
// [ErrTransactionPooler]. See docs/pgbouncer.md.
//
// # Running
//
// [Workflow.Run] takes the key's lease in one statement. Then it replays
// the stored response, reports a conflict or mismatch, or runs the phases
// after the stored recovery point. Each phase commits together with its
// fenced advance. An error rolls the phase back, frees the lease and keeps
// the recovery point, so the next retry resumes.
//
// [Handler] adapts this to net/http. It answers every error as RFC 9457
// problem+json that says whether retrying with the same key is safe.
//
// # Requests that finish in the background
//
// With [HTTPConfig.AcceptAfter] the handler answers 202 Accepted as soon
// as the named phase has committed (the ride row exists, say). Its
// Location points at the request's status. The run goes on with the
// remaining phases without holding the request.
//
//   - If the process dies, the key's lease expires, and the completer or the
//     client's next retry resumes it after its last committed phase. It is
//     still one effect per phase.
//   - A retry of the request answers 202 again while the run goes on (not
//     409), and the stored final response once it is done.
//
// [StatusHandler] serves the status: 202 with the recovery point until the
// key is finished, then its stored response. A tenant only ever sees its
// own keys. An error of its Tenant function is answered as the handler
// answers it: 401 for a refused tenant, 503 with Retry-After for a store
// outage. Package caller follows a 202 by polling its Location.
//
// # Limits and failures
//
// [Config.CallTimeout] (default one minute) bounds each foreign call. A
// call that exceeds it has an unknown outcome. The next run repeats it with
// the same downstream key when the phase is Repeatable; otherwise the key
// is held for reconciliation. [Config.RunTimeout] (default five minutes)
// bounds a run, the completer's included, so one hung key cannot stall a
// completer pass. -1 disables either limit.
//
// A panic in user code is recovered by the runner and ends the run like
// any failure, as a [*PanicError]. User code is a phase, a call, a record,
// reconcile, When, Decode or Tenant function. Nothing of the phase commits,
// the lease is freed and the key stays resumable. The panic is logged with
// its stack and the handler answers 500. The runner recovers rather than
// re-panics so that a bug in one request's phase cannot leave its key
// locked or take the process down, wherever the run was called from.
//
// Errors from the store are told apart by their cause:
//
//   - A request that can never be stored (an invalid tenant or key, a NUL
//     character in its JSON) is refused before the store with 400.
//   - A store that is unreachable, shut down, read-only after a failover,
//     or lost in the middle of a run gives [ErrUnavailable] and 503 with
//     Retry-After. Nothing of the interrupted phase was committed, and a
//     retry with the same key resumes it.
//   - 500 is kept for bugs in user code.
//
// Some text from outside the library is only recorded, never run on: the
// error that ended a run (whatever its phase or provider put in it), an
// operator's name and resolution, and the audit of them. It is stored
// whatever it holds. A NUL character, which Postgres cannot keep, is
// stored as the two characters \0, and bytes that are not UTF-8 as U+FFFD.
// Recording a run's error never keeps its lease. If the server refuses it
// anyway, the lease is freed without it and the error goes to the log.
//
// # Fencing
//
// Every write of a run names its lease's token. A run that stalled past
// its lease (a GC pause, a frozen VM) and was taken over writes nothing.
// Its phase rolls back and it ends with keyrow.ErrLeaseLost.
//
// Before each foreign call the run makes sure, by the database clock, that
// the key is still its own, and does not make the call when it is not. A
// recent commit is that proof; otherwise the run renews its lease first,
// one statement. While the call runs, the lease is renewed every third of
// its TTL, until the call returns or exceeds CallTimeout.
//
// A holder that stalls longer than the whole TTL just before its call, or
// whose lease an operator freed with [Client.Unlock] or cleared with
// [Client.Hold] right after its last commit or its claim, can still send
// its call after another run sent the same one, or after the hold.
// Both calls carry the same downstream key, so a provider that honours
// idempotency keys acts once. Unlock is for holders known to be dead.
//
// Local phases are batched: a phase's BEGIN travels with its first
// statement, and the advance and COMMIT with the next local phase's first
// statement. Three local phases of one statement each take five round
// trips, acquire included. A phase's Go code may therefore run more than
// once for one commit: its effects belong in its transaction.
// docs/fencing.md has the details, the exact windows and costs, and why
// the batching is safe.
//
// # Fault injection
//
// A run consults its [Injector] hooks at every fault [Point]:
//
//   - before a transaction
//   - before a foreign call, in it once the lease is renewed, and after it
//   - before and after commit
//   - before the response
//
// [WithInjector] gives one run its own. [ErrCrash] stops the run as a
// killed process would: the transaction rolls back and the lease is kept.
// [Recorder] discovers a workflow's points, [CrashAt] crashes at one, and
// package phasetest runs the whole crash matrix in a workflow author's
// tests.
//
// # Hooks
//
// [Config.Logger] receives structured logs with workflow, tenant, key and
// recovery_point attributes. Everything else that watches or steers a
// client is a [Hook] in [Config.Hooks]. A hook is found by the interfaces
// it implements, as pgx finds a tracer's:
//
//   - An [Observer] receives a [keyrow.Event], with the run's or pass's
//     context, for everything that happens to a key in runs, the completer
//     and the reaper.
//   - A [RunWrapper], [PhaseWrapper], [CallWrapper] or [PassWrapper] wraps
//     each run, phase, foreign call or completer pass in a function that
//     takes and returns its context. A span it starts is the parent of
//     everything the step does, the phase's own SQL and the foreign call's
//     HTTP request included.
//   - An [Injector] injects faults.
//
// Events and outcomes share one spelling: [OutcomeInFlight] is reported as
// keyrow.EventInFlight, "in_flight". Package otelphase is the
// OpenTelemetry hook; this package does not depend on OpenTelemetry.
package phase
