package keyrow

import "time"

// EventKind names something that happened to a key: in a run, in the
// completer or in the reaper. Its value is the name metrics and logs use.
type EventKind string

// The events of runs, the completer and the reaper: one list, one spelling
// for each.
const (
	// EventNew: a new key was stored and its lease taken.
	EventNew EventKind = "new"
	// EventResumed: an unfinished key's lease was taken over; the run
	// continues after its recovery point.
	EventResumed EventKind = "resumed"
	// EventReplayed: a finished key's stored response was replayed.
	EventReplayed EventKind = "replayed"
	// EventInFlight: another run holds the key's lease; the run was refused.
	EventInFlight EventKind = "in_flight"
	// EventOnHold: the key is on hold (Event.Hold says why); the run was
	// refused.
	EventOnHold EventKind = "on_hold"
	// EventElsewhere: the key is unfinished under a workflow definition
	// this process does not run; the run was refused.
	EventElsewhere EventKind = "elsewhere"
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
	// EventCompleted: the completer ran an abandoned key to its stored
	// response.
	EventCompleted EventKind = "completed"
	// EventCompleterFailed: the completer ran an abandoned key and it failed
	// again (its run reports EventFailed too); the completer backs off.
	EventCompleterFailed EventKind = "completer_failed"
	// EventDead: the completer moved keys to the dead hold (Event.Count).
	EventDead EventKind = "dead"
	// EventReaped: the reaper deleted finished keys (Event.Count).
	EventReaped EventKind = "reaped"
	// EventAbandoned: the reaper gave abandoned keys their terminal response
	// (Event.Count).
	EventAbandoned EventKind = "abandoned"
)

// Event describes one thing that happened to a key, or, for the completer's
// and reaper's batch events, to Count keys. Fields that do not apply to the
// kind are zero.
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
	// Hold says why a key is on hold, for EventOnHold.
	Hold Hold
	// Count is how many keys a completer or reaper event concerns (1 for
	// EventCompleted and EventCompleterFailed); zero for a run's events,
	// each about its one key.
	Count int
	// Duration is how long the phase or run took.
	Duration time.Duration
	Err      error
}
