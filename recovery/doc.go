// Package recovery finishes, cleans up and explains work that no client is
// waiting for.
//
// # Completer
//
// A request can stop part-way: its process crashed, its store hiccuped, or a
// foreign call failed. Its key keeps the recovery point of the last
// committed phase, and a client retry resumes it. When no client comes
// back, the Completer does: it claims unfinished keys whose lease is free or
// stale and whose last run is older than MinIdle, with FOR UPDATE SKIP
// LOCKED and the same lease a request takes, rebuilds the typed request from
// the stored params, and runs the remaining phases through a Resumer (a
// *phase.Runner). Several completers in several processes share the work
// without a leader. A key that keeps failing is retried with growing backoff
// and, after MaxAttempts, moves to the dead hold for an operator.
//
// # Unknown outcomes
//
// A foreign call can end without telling whether it happened. Unless its
// phase is declared repeatable (the provider honours the downstream
// idempotency key, as Stripe does), the key is held as unknown: clients get
// 409, and the completer asks the phase's reconcile function, which looks
// the call up and resolves it to done or retry.
//
// # Reaper
//
// The Reaper deletes finished keys older than the retention in small
// batches and gives abandoned keys a terminal response first; see Reaper.
//
// # Metrics
//
// Observer receives the completer's and reaper's events (completed, dead,
// reaped, expired), as phase.Config.Observer receives a runner's (new,
// replayed, conflict, mismatch, resumed); keyrow.Count gives the gauges
// (stuck, unknown, dead). Metrics tallies all of them for any metrics
// library to read.
package recovery

import "errors"

// ErrUnknownWorkflow is returned by a Resumer for a key whose workflow it
// does not know. The completer reports it and leaves the key for a process
// that does.
var ErrUnknownWorkflow = errors.New("recovery: unknown workflow")

// EventKind names what the completer or reaper did.
type EventKind string

// The events of the completer and reaper.
const (
	// EventCompleted: the completer ran a key to its stored response.
	EventCompleted EventKind = "completed"
	// EventFailed: the completer ran a key and it failed again.
	EventFailed EventKind = "completer_failed"
	// EventDead: keys moved to the dead hold.
	EventDead EventKind = "dead"
	// EventReaped: finished keys were deleted.
	EventReaped EventKind = "reaped"
	// EventExpired: abandoned keys got a terminal response.
	EventExpired EventKind = "expired"
)

// Event describes what the completer or reaper did; Count says to how many
// keys, and the key fields are set for single-key events.
type Event struct {
	Kind     EventKind
	Count    int
	Workflow string
	Tenant   string
	Key      string
	Err      error
}

// Observer receives events; it must be fast and safe for concurrent use.
type Observer func(Event)
