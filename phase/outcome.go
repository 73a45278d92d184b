package phase

import (
	"time"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// OutcomeKind says what a run found its key in, and so what it did. Its
// value is the name metrics and logs use; a refused run reports the event
// of the same name (keyrow.EventInFlight, EventOnHold, EventElsewhere,
// EventMismatch).
type OutcomeKind string

// The kinds of Outcome. New and Resumed runs executed phases; the others did
// nothing.
const (
	// OutcomeNew: the key was new and the run ran it to its response.
	OutcomeNew OutcomeKind = "new"
	// OutcomeResumed: the key was unfinished and free; the run continued it
	// after its last committed phase to its response.
	OutcomeResumed OutcomeKind = "resumed"
	// OutcomeReplayed: the key was finished; Response is its stored
	// response.
	OutcomeReplayed OutcomeKind = "replayed"
	// OutcomeInFlight: another run holds the key's lease.
	OutcomeInFlight OutcomeKind = "in_flight"
	// OutcomeMismatch: the key was first used with another request.
	OutcomeMismatch OutcomeKind = "mismatch"
	// OutcomeOnHold: the key is on hold (Outcome.Hold says why).
	OutcomeOnHold OutcomeKind = "on_hold"
	// OutcomeElsewhere: the key is unfinished under a definition of the
	// workflow that this process neither runs nor adopts, or at a
	// recovery point the adopting workflow cannot place; Definition names
	// it. Nothing was run: a process that runs that definition finishes
	// the key.
	OutcomeElsewhere OutcomeKind = "elsewhere"
)

// Outcome is the result of running a key.
type Outcome struct {
	Kind OutcomeKind
	// Response is the key's final response when it is finished (by this
	// run, or earlier for a replay).
	Response *keyrow.Response
	// RetryAfter is how long a client should wait before retrying a key in
	// progress or on hold.
	RetryAfter time.Duration
	// LeaseLeft is the time left on the lease of a key in flight
	// (OutcomeInFlight), uncapped: RetryAfter bounds a client's wait, but a
	// consumer that pays for each delivery waits until the lease of a
	// holder that died can have ended.
	LeaseLeft time.Duration
	// Hold says why a key on hold waits.
	Hold keyrow.Hold
	// Definition is the definition the key started under, for
	// OutcomeElsewhere.
	Definition string
}

// outcomeOf names what the store found when a run took a key: the one place
// the store's outcomes map to those a user sees.
func outcomeOf(found store.Outcome) OutcomeKind {
	switch found {
	case store.New:
		return OutcomeNew
	case store.Resumed:
		return OutcomeResumed
	case store.Replay:
		return OutcomeReplayed
	case store.Held:
		return OutcomeInFlight
	case store.Mismatch:
		return OutcomeMismatch
	case store.Parked:
		return OutcomeOnHold
	case store.Elsewhere:
		return OutcomeElsewhere
	}
	return ""
}

// refusedEvents are the events of the outcomes in which a run ran nothing,
// each spelled as its outcome.
var refusedEvents = map[OutcomeKind]keyrow.EventKind{
	OutcomeReplayed:  keyrow.EventReplayed,
	OutcomeInFlight:  keyrow.EventInFlight,
	OutcomeOnHold:    keyrow.EventOnHold,
	OutcomeElsewhere: keyrow.EventElsewhere,
	OutcomeMismatch:  keyrow.EventMismatch,
}
