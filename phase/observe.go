package phase

import (
	"context"
	"time"
)

// EventKind names something that happened to a key during a run.
type EventKind string

// The events a runner reports to its Observer.
const (
	// EventAcquired: a new key was stored and its lease taken.
	EventAcquired EventKind = "acquired"
	// EventResumed: an unfinished key's lease was taken over; the run
	// continues after its recovery point.
	EventResumed EventKind = "resumed"
	// EventReplayed: a finished key's stored response was replayed.
	EventReplayed EventKind = "replayed"
	// EventConflict: another run holds the key's lease, or the key is parked.
	EventConflict EventKind = "conflict"
	// EventMismatch: the key was first used with another request.
	EventMismatch EventKind = "mismatch"
	// EventPhaseCommitted: a phase committed and advanced the recovery point.
	EventPhaseCommitted EventKind = "phase_committed"
	// EventFinished: the response was stored and the key finished.
	EventFinished EventKind = "finished"
	// EventFailed: a phase failed; the lease was freed and the recovery point
	// kept, so the next run resumes.
	EventFailed EventKind = "failed"
	// EventRetried: a phase hit a serialization failure or deadlock and is
	// run again.
	EventRetried EventKind = "retried"
	// EventUnknown: a foreign call's outcome is unknown.
	EventUnknown EventKind = "unknown"
	// EventCrashed: an injected crash stopped the run; the lease is not freed.
	EventCrashed EventKind = "crashed"
	// EventLeaseLost: the run found its lease taken over and stopped without
	// committing.
	EventLeaseLost EventKind = "lease_lost"
)

// Event describes one thing that happened to a key. Fields that do not apply
// to the kind are zero.
type Event struct {
	Kind          EventKind
	Workflow      string
	Tenant        string
	Key           string
	RecoveryPoint string
	// Phase is the phase concerned, for phase events.
	Phase string
	// Status is the response status, for finished and replayed keys.
	Status int
	// Duration is how long the phase or run took.
	Duration time.Duration
	Err      error
}

// Observer receives every Event of a client's runs, with the run's context,
// so a tracer can attach the event to the caller's span. It is called
// synchronously on the run's goroutine and must be fast and safe for
// concurrent use; a metrics or tracing library plugs in here.
type Observer func(ctx context.Context, ev Event)
