// Package otelphase traces and measures a phase.Client with OpenTelemetry.
// Its [Hook] is a phase.Hook; the core packages do not depend on
// OpenTelemetry, only programs that import this package do.
//
//	hook, err := otelphase.New(&otelphase.Config{TracerProvider: tp, MeterProvider: mp})
//	c, err := phase.NewClient(pool, &phase.Config{Hooks: []phase.Hook{hook}}, rides)
//	reg, err := hook.ObserveKeys(c) // the keys gauge; reg.Unregister() when done
//
// # Spans
//
// Every run of a key is an atomicphase.run span, a child of the span in the
// run's context (the HTTP server's span, with otelhttp). Each phase it runs
// is an atomicphase.phase child of the run; a foreign phase's call is an
// atomicphase.call child of its phase, and a reconcile function an
// atomicphase.reconcile child. The context a phase function or a call
// receives carries its span, so the phase's SQL (with a tracing pgx
// tracer) and the call's HTTP request (with an otelhttp transport) are its
// children. Each completer pass is an atomicphase.completer.pass root span
// with the runs it resumes as children.
//
//	atomicphase.run        atomicphase.workflow, .outcome, .recovery_point (where the run started),
//	                       .attempt, .completer, .status (of the stored response), error.type;
//	                       .tenant and .key only with Config.KeyAttributes
//	atomicphase.phase      atomicphase.workflow, .phase, error.type
//	atomicphase.call       atomicphase.workflow, .phase, .downstream_key, error.type
//	atomicphase.completer.pass  atomicphase.claimed, .completed, .failed, .dead
//
// The outcome is the phase.OutcomeKind (new, resumed, replayed, in_flight,
// mismatch, on_hold, elsewhere) or error; an error's error.type is crash
// (an injected crash), lease_lost, outcome_unknown, panic, timeout (the
// run's time limit), unavailable (the key store), stopped (the client is
// stopping), not_registered, invalid_request, canceled, or failed (any
// other error, the workflow's own included). Spans of failed steps record
// the error and have status Error; refusals (in_flight, mismatch, on_hold,
// elsewhere) are outcomes, not errors.
//
// Tenants are often customer accounts or emails, so run spans carry the
// tenant and the idempotency key only with Config.KeyAttributes; metrics
// never do. Downstream keys are hashes (keyrow.DownstreamKey) and are
// always on call spans, which is how a call is found in the provider's
// logs.
//
// # Metrics
//
//	atomicphase.runs             counter {run}: atomicphase.workflow, .outcome, .completer, error.type
//	atomicphase.replays          counter {run}: atomicphase.workflow
//	atomicphase.refused        counter {run}: atomicphase.workflow, .outcome (in_flight or on_hold)
//	atomicphase.phase.duration   histogram, seconds: atomicphase.workflow, .phase, error.type
//	atomicphase.keys             gauge {key}: atomicphase.state (finished, in_flight, waiting, stuck, unknown, dead)
//
// Replays and refusals are also in atomicphase.runs by outcome; they have
// counters of their own because they are what alerts watch. The keys gauge
// comes from Client.Counts, which scans the keys table: it is read at most
// once per Config.CountsInterval, however often metrics are collected.
package otelphase
