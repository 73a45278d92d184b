// Package phase declares workflows of atomic phases and runs them under
// idempotency keys.
//
// # Workflows
//
// A Workflow is a named, ordered list of phases over a request type and a
// state type. Each phase's name is the recovery point it commits; started
// and finished are reserved. The state is committed with every phase, so a
// later phase, or a resumed run in another process, reads what earlier ones
// produced.
//
// Two kinds of phase make "at most one foreign side effect per phase" a
// matter of the API's shape: Local phases do database work in one
// transaction; Foreign phases make exactly one call, outside any
// transaction, with a downstream idempotency key (Run.DownstreamKey), and
// record its outcome in a short transaction. When lets a phase apply only
// to some requests; Repeatable and Reconciled say what to do when a call's
// outcome is unknown.
//
// Send the downstream key as the foreign request's Idempotency-Key header.
// Go's net/http then resends the request by itself when a reused keep-alive
// connection drops before the answer; with the key that is harmless, but a
// test that injects such drops must disable keep-alives to see them.
//
// # Running
//
// Workflow.Run takes the key's lease in one statement and then replays the
// stored response, reports a conflict or mismatch, or runs the phases after
// the stored recovery point. Each phase commits together with its fenced
// advance; an error rolls the phase back, frees the lease and keeps the
// recovery point, so the next retry resumes. Workflow.Handler adapts this
// to net/http, with RFC 9457 problem responses.
//
// # Fault injection
//
// A run consults an Injector at every fault Point (before a transaction,
// before and after a foreign call, before and after commit, before the
// response). ErrCrash stops the run as a killed process would: the
// transaction rolls back and the lease is kept. Recorder discovers a
// workflow's points, CrashAt crashes at one, and package phasetest runs the
// whole crash matrix in a workflow author's tests.
//
// # Observing
//
// Config.Logger receives structured logs with workflow, tenant, key and
// recovery_point attributes; Config.Observer receives an Event for
// everything that happens to a key, for metrics.
//
// Config.Middleware wraps each run, phase, foreign call and completer pass
// in a function that takes and returns its context, as River's middleware
// and pgx's tracers do: a span a Middleware starts there is the parent of
// everything the step does, the phase's own SQL and the foreign call's HTTP
// request included. Package otelphase is the OpenTelemetry one; this
// package does not depend on OpenTelemetry.
package phase
