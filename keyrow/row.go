package keyrow

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Reserved recovery points. Every key starts at Started; a key whose response
// is stored is at Finished. Workflows name their own points in between.
const (
	Started  = "started"
	Finished = "finished"
)

// Hold is why an unfinished key waits for someone to act instead of running.
// The zero Hold means the key is not on hold.
type Hold string

// The holds a key can be put on.
const (
	// HoldUnknown marks a key whose last foreign call may or may not have
	// happened; it waits for reconciliation.
	HoldUnknown Hold = "unknown"
	// HoldDead marks a key the completer gave up on after repeated failures
	// of its own while no client was retrying it, or that an operator put
	// on hold (phase.Client.Hold); an operator can retry it.
	HoldDead Hold = "dead"
)

// Limits on the names a key row stores. The library checks them before it
// sends anything to the database, so a request that breaks them gets a clear
// error instead of a store failure.
const (
	// MaxTenantLength is the longest tenant, in characters.
	MaxTenantLength = 255
	// MaxNameLength is the longest workflow or phase name, in characters.
	MaxNameLength = 100
)

// Errors callers branch on.
var (
	// ErrLeaseLost is returned when a run finds that its lease was taken over
	// by another run (its own expired), or freed by an operator: the run
	// stopped and changed nothing after that point.
	ErrLeaseLost = errors.New("keyrow: lease lost: the key was taken over by another run")
	// ErrNotFound is returned when the tenant has no key by that name.
	ErrNotFound = errors.New("keyrow: key not found")
	// ErrNotHeld is returned when retrying a key that is not on hold: it is
	// waiting, stuck, in flight or finished, so there is nothing to retry.
	ErrNotHeld = errors.New("keyrow: key is not on hold")
	// ErrInvalidTenant is returned for an empty tenant, one longer than
	// MaxTenantLength characters, or one that is not valid UTF-8 or holds a
	// NUL character.
	ErrInvalidTenant = errors.New("keyrow: invalid tenant")
)

// CheckTenant returns an error wrapping ErrInvalidTenant, written for the
// client developer, unless tenant can be stored.
func CheckTenant(tenant string) error {
	if err := checkText(tenant, MaxTenantLength); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidTenant, err)
	}
	return nil
}

// CheckName returns an error unless name can be stored as a workflow or
// phase name: 1 to MaxNameLength characters of valid UTF-8 without NUL.
func CheckName(name string) error {
	return checkText(name, MaxNameLength)
}

func checkText(s string, max int) error {
	switch n := utf8.RuneCountInString(s); {
	case n == 0:
		return errors.New("must not be empty")
	case n > max:
		return fmt.Errorf("is %d characters long; the limit is %d", n, max)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return errors.New("contains a NUL character")
		}
	}
	return nil
}

// Response is a stored HTTP response, replayed byte for byte.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Status is where a key stands, as operators and gauges see it.
type Status string

// The states of a key. Every key is in exactly one of them.
const (
	// StatusFinished keys hold a stored response.
	StatusFinished Status = "finished"
	// StatusInFlight keys are unfinished and held by a live lease.
	StatusInFlight Status = "in_flight"
	// StatusWaiting keys are unfinished, not on hold and unleased, and were
	// touched recently: a client is expected to retry them, or the
	// completer to take them once they have been idle long enough.
	StatusWaiting Status = "waiting"
	// StatusStuck keys are unfinished, not on hold and unleased, and have been
	// idle longer than the completer's idle threshold: its backlog.
	StatusStuck Status = "stuck"
	// StatusUnknown keys await reconciliation of a foreign call.
	StatusUnknown Status = "unknown"
	// StatusDead keys were given up on and wait for an operator.
	StatusDead Status = "dead"
)

// Row is everything stored about one key that an operator needs, read in one
// statement so its fields agree with each other. Only the request
// fingerprint is left out: it is a hash, useful to the code that compares
// requests and to nobody else.
type Row struct {
	ID       uuid.UUID `json:"id"`
	Tenant   string    `json:"tenant"`
	Key      string    `json:"key"`
	Workflow string    `json:"workflow"`
	// Definition is the workflow definition the key started under (or was
	// adopted by); empty for keys stored before definitions were recorded.
	Definition    string `json:"definition"`
	RecoveryPoint string `json:"recovery_point"`
	// CallPending names the phase whose foreign call, not safe to repeat,
	// may have been sent by a run that then stopped: the next run
	// reconciles it, or holds the key for an operator.
	CallPending string `json:"call_pending,omitempty"`
	// Hold is set for a parked key, empty otherwise.
	Hold      Hold      `json:"hold"`
	CreatedAt time.Time `json:"created_at"`
	LastRunAt time.Time `json:"last_run_at"`
	// FinishedAt is set once the response is stored.
	FinishedAt *time.Time `json:"finished_at"`
	// LeaseTakenAt and LeaseExpiresAt describe the last lease taken; they stay
	// set after a lease expires until someone takes or frees the key.
	LeaseTakenAt   *time.Time `json:"lease_taken_at" db:"locked_at"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at" db:"lock_expires_at"`
	// Attempts counts the runs that took the key's lease.
	Attempts int `json:"attempts"`
	// Failures counts the completer's own failed runs since the key last
	// made progress; the completer gives up on a key when they reach its
	// MaxAttempts.
	Failures int `json:"failures"`
	// LastError is the error that ended the key's last failed run, until
	// a run commits a phase of the key (when Failures is reset too).
	// Text Postgres cannot hold is kept escaped: a NUL as the two
	// characters \0, bytes that are not UTF-8 as U+FFFD. A run's error is
	// never the reason its lease stays taken: should the server refuse
	// it all the same, the lease is freed without it.
	LastError string `json:"last_error"`
	// ResponseStatus, ResponseHeader and ResponseBody are the stored
	// response of a finished key, nil otherwise.
	ResponseStatus *int        `json:"response_status"`
	ResponseHeader http.Header `json:"response_headers"`
	ResponseBody   []byte      `json:"response_body"`
	// Params is the request as first received; State the workflow's state
	// as last committed.
	Params json.RawMessage `json:"params"`
	State  json.RawMessage `json:"state"`
	// LeaseLeft is how long the current lease has to run by the database
	// clock when the row was read; zero when the lease is free or expired.
	LeaseLeft time.Duration `json:"lease_left_ns"`
	// Resolution is an operator's resolution of an unknown outcome that no
	// run has acted on yet; nil otherwise.
	Resolution *Resolution `json:"resolution,omitempty"`
}

// Status returns the key's status as it was read, at now: an unfinished key
// neither held nor leased is waiting until it has been idle for stuckAfter,
// and stuck after that.
func (r *Row) Status(stuckAfter time.Duration, now time.Time) Status {
	switch {
	case r.FinishedAt != nil:
		return StatusFinished
	case r.Hold == HoldUnknown:
		return StatusUnknown
	case r.Hold != "":
		return StatusDead
	case r.LeaseLeft > 0:
		return StatusInFlight
	case now.Sub(r.LastRunAt) < stuckAfter:
		return StatusWaiting
	}
	return StatusStuck
}

// Statuses returns every Status, the unfinished ones first, in the order a
// key moves through them, then StatusFinished.
func Statuses() []Status {
	return []Status{StatusInFlight, StatusWaiting, StatusStuck, StatusUnknown, StatusDead, StatusFinished}
}

// Counts is how many keys are in each Status.
type Counts struct {
	// Finished is exact on small tables; on large ones it is estimated
	// from the table's statistics, and FinishedEstimated is set, so that
	// counting never reads every finished key.
	Finished          int  `json:"finished"`
	FinishedEstimated bool `json:"finished_estimated,omitempty"`
	InFlight          int  `json:"in_flight"`
	Waiting           int  `json:"waiting"`
	Stuck             int  `json:"stuck"`
	Unknown           int  `json:"unknown"`
	Dead              int  `json:"dead"`
}

// Of returns how many keys of status s were counted; zero for a string that
// names no Status.
func (c Counts) Of(s Status) int {
	if n := c.of(s); n != nil {
		return *n
	}
	return 0
}

// Set records n keys of status s; it does nothing for a string that names
// no Status.
func (c *Counts) Set(s Status, n int) {
	if p := c.of(s); p != nil {
		*p = n
	}
}

func (c *Counts) of(s Status) *int {
	switch s {
	case StatusFinished:
		return &c.Finished
	case StatusInFlight:
		return &c.InFlight
	case StatusWaiting:
		return &c.Waiting
	case StatusStuck:
		return &c.Stuck
	case StatusUnknown:
		return &c.Unknown
	case StatusDead:
		return &c.Dead
	}
	return nil
}

// Total is the number of keys counted.
func (c Counts) Total() int {
	return c.Finished + c.Unfinished()
}

// Add returns c and o counted together: the keys of each state summed,
// the finished ones estimated when either's were.
func (c Counts) Add(o Counts) Counts {
	return Counts{
		Finished:          c.Finished + o.Finished,
		FinishedEstimated: c.FinishedEstimated || o.FinishedEstimated,
		InFlight:          c.InFlight + o.InFlight,
		Waiting:           c.Waiting + o.Waiting,
		Stuck:             c.Stuck + o.Stuck,
		Unknown:           c.Unknown + o.Unknown,
		Dead:              c.Dead + o.Dead,
	}
}

// Unfinished is the number of keys without a stored response, in any state.
func (c Counts) Unfinished() int {
	return c.InFlight + c.Waiting + c.Stuck + c.Unknown + c.Dead
}

// DefaultListLimit is how many keys a listing returns when ListFilter.Limit
// is zero.
const DefaultListLimit = 50

// ListFilter selects keys for an operator's listing; its zero value selects
// every key. Every condition set must hold.
type ListFilter struct {
	// Status selects the keys of one Status; empty selects every key. Keys
	// of the unfinished statuses are listed idle longest first; finished
	// keys, and all keys, newest first.
	Status Status
	// StuckAfter is how idle a key must be to be stuck rather than
	// waiting; zero means any idle time.
	StuckAfter time.Duration
	// Workflow, Tenant and KeyPrefix select the keys of one workflow, of
	// one tenant, and whose key starts with KeyPrefix.
	Workflow  string
	Tenant    string
	KeyPrefix string
	// OlderThan and NewerThan select keys first seen at least, or at most,
	// this long ago by the database clock.
	OlderThan time.Duration
	NewerThan time.Duration
	// Sort orders the listing. Defaults to SortIdle for the unfinished
	// states and SortNewest otherwise.
	Sort Sort
	// After is the Next of the previous Page; empty starts at the first.
	After string
	// Limit caps the keys returned. Defaults to DefaultListLimit.
	Limit int
}

// Sort is the order of a listing.
type Sort string

// The orders of a listing. Each pages through an index, however many keys
// the table holds.
const (
	// SortNewest lists the keys most recently first seen first.
	SortNewest Sort = "newest"
	// SortOldest lists the keys first seen longest ago first.
	SortOldest Sort = "oldest"
	// SortIdle lists the keys whose last run is oldest first; it needs
	// ListFilter.State to name an unfinished state.
	SortIdle Sort = "idle"
)

// Page is one page of a listing.
type Page struct {
	Keys []Row `json:"keys"`
	// Next continues the listing as ListFilter.After; empty on the last
	// page.
	Next string `json:"next,omitempty"`
}

// DefinitionCount is how many unfinished keys one workflow definition has:
// after a deploy, the keys that still need a process running that
// definition (or adopting it) to finish.
type DefinitionCount struct {
	Workflow string `json:"workflow"`
	// Definition is empty for keys stored before definitions were
	// recorded.
	Definition string `json:"definition"`
	// Unfinished counts every unfinished key, Held those on hold.
	Unfinished int `json:"unfinished"`
	Held       int `json:"held"`
	// Oldest is when the oldest of them was created.
	Oldest time.Time `json:"oldest"`
}
