package keyrow

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors of operator actions.
var (
	// ErrNotUnknown is returned when resolving a key that is not held as
	// unknown at the recovery point the resolution names (it was resolved,
	// retried or finished meanwhile), or that a run holds right now.
	ErrNotUnknown = errors.New("keyrow: key is not held as unknown at that recovery point")
	// ErrNoLease is returned when unlocking a key that has no lease.
	ErrNoLease = errors.New("keyrow: key has no lease to free")
	// ErrNotRunnable is returned when putting on hold a key that is
	// finished or already on hold.
	ErrNotRunnable = errors.New("keyrow: key is finished or already on hold")
	// ErrChanged is returned, as a *ChangedError, when an operator action
	// is refused because the key is no longer as the operator saw it.
	ErrChanged = errors.New("keyrow: key changed since it was seen")
)

// Seen is what an operator saw of a key when choosing an action: its
// recovery point, its hold, its lease and the resolution pending on it.
// An operator action given a Seen changes the key only while all of them
// are still as seen, checked on the locked row in the statement that
// changes it; otherwise nothing changes and the action fails with a
// *ChangedError. Row.Seen returns it; its token (String, ParseSeen)
// is what the console's forms and the command line's -seen flag carry.
type Seen struct {
	RecoveryPoint string `json:"recovery_point"`
	Hold          Hold   `json:"hold,omitempty"`
	// Attempts and LeaseTakenAt name the lease: every run that takes the
	// key's lease adds an attempt, and a released or freed lease has no
	// LeaseTakenAt. A renewal changes neither.
	Attempts     int        `json:"attempts"`
	LeaseTakenAt *time.Time `json:"lease_taken_at,omitempty"`
	// Resolution is the resolution that was pending, nil when none was.
	Resolution *Resolution `json:"resolution,omitempty"`
}

// Seen returns what an operator sees of r, for an action on it.
func (r *Row) Seen() Seen {
	s := Seen{RecoveryPoint: r.RecoveryPoint, Hold: r.Hold, Attempts: r.Attempts, LeaseTakenAt: r.LeaseTakenAt}
	if r.Resolution != nil {
		res := *r.Resolution
		s.Resolution = &res
	}
	return s
}

// String returns s as an opaque token of URL-safe characters, which
// ParseSeen reads back.
func (s Seen) String() string {
	data, _ := json.Marshal(s) // a Seen always encodes
	return base64.RawURLEncoding.EncodeToString(data)
}

// ParseSeen returns the Seen of a token made by Seen.String.
func ParseSeen(token string) (Seen, error) {
	var seen Seen
	data, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return seen, errors.New("keyrow: not a token of what was seen")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&seen); err != nil || seen.RecoveryPoint == "" {
		return Seen{}, errors.New("keyrow: not a token of what was seen")
	}
	return seen, nil
}

// Changes lists, in words, how now differs from what s saw: empty when
// nothing an operator action relies on has changed.
func (s Seen) Changes(now *Row) []string {
	var changes []string
	if now.RecoveryPoint != s.RecoveryPoint {
		changes = append(changes, fmt.Sprintf("the recovery point moved from %s to %s", s.RecoveryPoint, now.RecoveryPoint))
	}
	if now.Hold != s.Hold {
		changes = append(changes, fmt.Sprintf("the hold changed from %s to %s", holdText(s.Hold), holdText(now.Hold)))
	}
	switch {
	case now.Attempts != s.Attempts && now.LeaseTakenAt != nil:
		changes = append(changes, fmt.Sprintf("a run took the lease again (attempt %d, taken at %s)",
			now.Attempts, now.LeaseTakenAt.UTC().Format(time.RFC3339)))
	case now.Attempts != s.Attempts:
		changes = append(changes, fmt.Sprintf("a run took the lease again and gave it back (attempt %d)", now.Attempts))
	case !sameTime(now.LeaseTakenAt, s.LeaseTakenAt) && now.LeaseTakenAt == nil:
		changes = append(changes, "the lease was given back or freed")
	case !sameTime(now.LeaseTakenAt, s.LeaseTakenAt):
		changes = append(changes, fmt.Sprintf("the lease was taken at %s", now.LeaseTakenAt.UTC().Format(time.RFC3339)))
	}
	if !s.Resolution.Equal(now.Resolution) {
		switch {
		case now.Resolution == nil:
			changes = append(changes, "the pending resolution ("+s.Resolution.String()+") was taken by a run or dropped")
		case s.Resolution == nil:
			changes = append(changes, "a resolution was recorded: "+now.Resolution.String())
		default:
			changes = append(changes, "the pending resolution was replaced: "+now.Resolution.String())
		}
	}
	return changes
}

func holdText(h Hold) string {
	if h == "" {
		return "none"
	}
	return string(h)
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// ChangedError is the refusal of an operator action on a key that is no
// longer as the operator saw it, or that has a resolution pending which
// the action would have replaced or dropped unseen. Nothing was changed;
// the refusal is in the audit. It matches ErrChanged with errors.Is, and
// also ErrNotUnknown, ErrNotHeld, ErrNoLease or ErrNotRunnable when the key
// has left the state the action needs.
type ChangedError struct {
	// Action is the refused action (ActionUnlock, ActionRetry,
	// ActionResolve, ActionHold).
	Action string
	// Seen is what the action was given; nil when it was given nothing
	// and refused a pending resolution.
	Seen *Seen
	// Now is the key as it was when the action was refused.
	Now *Row
	// Changes says, in words, what differs from what was seen.
	Changes []string
	// state is the sentinel of a key outside the action's state, if any.
	state error
}

// NewChangedError returns the refusal of action on now given seen; state,
// when not nil, is the sentinel of the state the key left.
func NewChangedError(action string, seen *Seen, now *Row, changes []string, state error) *ChangedError {
	return &ChangedError{Action: action, Seen: seen, Now: now, Changes: changes, state: state}
}

func (e *ChangedError) Error() string {
	return "keyrow: " + e.Action + " refused: " + e.Reason()
}

// Reason says why the action was refused, as the audit records it.
func (e *ChangedError) Reason() string {
	if e.Seen == nil {
		return strings.Join(e.Changes, "; ")
	}
	return "the key changed since it was seen: " + strings.Join(e.Changes, "; ")
}

// Unwrap returns ErrChanged and the sentinel of the state the key left.
func (e *ChangedError) Unwrap() []error {
	if e.state != nil {
		return []error{ErrChanged, e.state}
	}
	return []error{ErrChanged}
}

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

// Equal reports whether r and o are the same resolution (both nil, or the
// same recovery point, outcome and output, compared as JSON values).
func (r *Resolution) Equal(o *Resolution) bool {
	if r == nil || o == nil {
		return r == o
	}
	if r.RecoveryPoint != o.RecoveryPoint || r.Happened != o.Happened {
		return false
	}
	if len(r.Output) == 0 || len(o.Output) == 0 {
		return len(r.Output) == len(o.Output)
	}
	a, errA := canonical(r.Output)
	b, errB := canonical(o.Output)
	if errA != nil || errB != nil {
		return bytes.Equal(r.Output, o.Output)
	}
	return bytes.Equal(a, b)
}

// canonical re-encodes a JSON value with its object keys sorted and its
// whitespace dropped, keeping numbers as written.
func canonical(data json.RawMessage) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// String describes r for an operator: whether the call happened, with its
// output.
func (r *Resolution) String() string {
	if r == nil {
		return "none"
	}
	if r.Happened {
		return fmt.Sprintf("happened after %s, output %s", r.RecoveryPoint, r.Output)
	}
	return "did not happen after " + r.RecoveryPoint
}

// Actions recorded in the audit.
const (
	ActionUnlock  = "unlock"
	ActionRetry   = "retry"
	ActionResolve = "resolve"
	ActionHold    = "hold"
)

// AuditFilter selects audit entries; its zero value selects every entry,
// newest first. Every condition set must hold.
type AuditFilter struct {
	// Tenant and Key select the entries of one key; Tenant alone, those
	// of the tenant's keys.
	Tenant, Key string
	// Actor and Action select the entries of one actor and one action
	// (ActionUnlock, ActionRetry, ActionResolve, ActionHold).
	Actor, Action string
	// Before selects the entries older than the entry with this id, the
	// last of the previous page; zero starts at the newest.
	Before int64
	// Limit caps the entries returned. Defaults to DefaultListLimit.
	Limit int
}

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
	// Refused says why the action was refused, changing nothing (Before
	// and After are then the same); empty when it was done.
	Refused string `json:"refused,omitempty"`
}
