package keyrow

import (
	"encoding/json"
	"errors"
	"time"
)

// Errors of operator actions.
var (
	// ErrNotUnknown is returned when resolving a key that is not held as
	// unknown at the recovery point the resolution names (it was resolved,
	// retried or finished meanwhile), or that a run holds right now.
	ErrNotUnknown = errors.New("keyrow: key is not held as unknown at that recovery point")
	// ErrNotLocked is returned when unlocking a key that has no lease.
	ErrNotLocked = errors.New("keyrow: key has no lease to free")
)

// Resolution is an operator's word on a foreign call whose outcome is
// unknown: the call of the phase after RecoveryPoint happened, with Output
// as what the call returned, or it did not happen and is to be made again
// with the same downstream key. The next run of the key takes it instead
// of calling the phase's reconcile function, and only while the key is
// still at RecoveryPoint.
type Resolution struct {
	RecoveryPoint string `json:"recovery_point"`
	Happened      bool   `json:"happened"`
	// Output is the call's output as JSON, decoded into the phase's output
	// type for its record function; only when Happened.
	Output json.RawMessage `json:"output,omitempty"`
}

// Actions recorded in the audit.
const (
	ActionUnlock  = "unlock"
	ActionRetry   = "retry"
	ActionResolve = "resolve"
)

// AuditEntry is one operator action on one key, as the audit keeps it.
type AuditEntry struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Tenant string    `json:"tenant"`
	Key    string    `json:"key"`
	// Before and After are the key's operator-visible fields (recovery
	// point, hold, lease, attempts, failures, last error, resolution)
	// around the action; Detail is what the action was given.
	Before json.RawMessage `json:"before"`
	After  json.RawMessage `json:"after"`
	Detail json.RawMessage `json:"detail"`
}
