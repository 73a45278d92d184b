package phase

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/atomicphase/atomicphase/keyrow"
)

// ErrUnavailable is returned when the key store cannot be reached or was
// lost during the run, and for a run that Client.Stop cut short (which is
// ErrStopped too). Nothing of the interrupted phase was committed and no
// response was stored: retrying with the same key is safe, and resumes
// after the last committed phase. The HTTP handler answers 503 with
// Retry-After.
var ErrUnavailable = errors.New("phase: idempotency key store unavailable")

// commitLostError ends a run whose key is no longer at the recovery point
// the run committed last, though the run still held its lease: the database
// lost that commit, as a failover to an asynchronous standby can. The run
// commits nothing more, frees its lease, and the key resumes from the
// recovery point the database holds. It is both ErrUnavailable (the store
// the run wrote to was lost; a retry resumes the key) and
// keyrow.ErrLeaseLost (the run stopped without committing).
type commitLostError struct{ point string }

func (e *commitLostError) Error() string {
	return fmt.Sprintf("phase: the key is no longer at recovery point %q, which this run committed: "+
		"the database lost that commit, as a failover to an asynchronous standby can; the run stopped and freed its lease, "+
		"and the key resumes from the recovery point the database holds", e.point)
}

func (e *commitLostError) Is(target error) bool {
	return target == ErrUnavailable || target == keyrow.ErrLeaseLost
}

// cutShortError ends a run that its process cut short as it stopped:
// Client.Stop past its context, or the completer's context cancelled.
// It is ErrStopped and ErrUnavailable, so a caller is told the server is
// stopping and to retry: nothing of the interrupted step was kept, and the
// key resumes from its last committed phase. Its text, which the key's
// last error records, says what happened rather than blame the store.
type cutShortError struct{ err error }

func (e *cutShortError) Error() string {
	return "phase: run cut short, its process is stopping: " + e.err.Error()
}

func (e *cutShortError) Unwrap() error { return e.err }

func (e *cutShortError) Is(target error) bool {
	return target == ErrStopped || target == ErrUnavailable
}

// ErrRunTimeout is returned when a run exceeded Config.RunTimeout. Its
// committed phases are kept and its lease freed; a retry resumes it. The
// HTTP handler answers 503 with Retry-After.
var ErrRunTimeout = errors.New("phase: run exceeded its time limit")

// ErrNoResponse is returned when a workflow ran out of phases without any
// phase responding: a bug in the workflow, reported instead of committed.
var ErrNoResponse = errors.New("phase: workflow ended without a response")

// ErrInvalidRequest is returned, wrapped with the reason, for a request that
// can never be stored: its JSON holds a NUL character (\u0000), which
// Postgres's jsonb cannot hold. The HTTP handler answers 400.
var ErrInvalidRequest = errors.New("phase: request cannot be stored")

// PanicError is the error of a run in which user code (a phase, a foreign
// call, a record, reconcile, When, Decode or Tenant function) panicked. The
// runner recovers the panic and ends the run like any other failure:
// nothing of the phase is committed, the lease is freed and the key stays
// resumable. The panic is logged with its stack, and the HTTP handler
// answers 500.
type PanicError struct {
	// Where names the user function that panicked, such as "phase charge".
	Where string
	// Value is what was passed to panic.
	Value any
	// Stack is the panicking goroutine's stack.
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("phase: panic in %s: %v", e.Where, e.Value) }

// protect calls f and turns a panic in it into a *PanicError whose Where is
// what, followed by the phase's name when there is one. (The name is joined
// only on a panic, so that a run allocates nothing for it.)
func protect(what, phase string, f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			where := what
			if phase != "" {
				where += " " + phase
			}
			err = &PanicError{Where: where, Value: v, Stack: debug.Stack()}
		}
	}()
	return f()
}

// ErrNotRegistered is returned when running or serving a workflow that was
// not given to NewClient: the completer could not finish its keys.
var ErrNotRegistered = errors.New("phase: workflow is not registered with the client")

// ErrStopped is returned for a run started after Client.Stop began, which
// ran nothing, and for a run that Stop cut short as its context ended,
// which is ErrUnavailable too: nothing of its interrupted step was kept
// and a retry resumes it. The HTTP handler answers both with 503 and
// Retry-After, problem type ProblemShuttingDown.
var ErrStopped = errors.New("phase: client is stopping")

// ErrDefinitionElsewhere is returned for a key that is unfinished under a
// definition of its workflow that this process neither runs nor adopts. It
// is also returned for a key at a recovery point the adopting workflow
// cannot place. Nothing was run and the key is untouched. A process that
// runs its definition finishes it. The HTTP handler answers 503 with
// Retry-After.
var ErrDefinitionElsewhere = errors.New("phase: the key started under a workflow definition this process does not run")

// ErrOutcomeUnknown marks a foreign call that may or may not have taken
// effect (for example, a timeout after the request was sent). Wrap it with
// MaybeHappened.
var ErrOutcomeUnknown = errors.New("phase: outcome of the foreign call is unknown")

// ErrInvalidResolution wraps the reason a resolution was refused before
// anything was recorded: its output does not decode into the phase's
// output type, or no foreign phase awaits an outcome at its recovery point.
var ErrInvalidResolution = errors.New("phase: invalid resolution")

// ErrTransactionPooler is returned, wrapped, by Client.Check (and so by
// Start, Complete, Reap and the first Run) when the pool reaches Postgres
// through a transaction pooler, such as PgBouncer with
// pool_mode = transaction, in a query exec mode that needs each connection
// to keep its server session. A transaction pooler runs each transaction on
// whichever server session is free, so:
//
//   - cache_statement, pgx's default, fails unless the pooler prepares a
//     connection's named statements again on every session that runs them
//     (PgBouncer 1.21 and later with max_prepared_statements > 0, the
//     default since 1.24); before that, a statement prepared in one
//     transaction is missing, or another one, in the next;
//   - describe_exec sends each statement in two round trips, which the
//     pooler may hand to two sessions: the second may run another client's
//     statement.
//
// Set default_query_exec_mode=cache_describe in the database URL (or
// pgxpool.Config.ConnConfig.DefaultQueryExecMode to
// pgx.QueryExecModeCacheDescribe), which prepares nothing a session keeps.
//
// It also wraps the errors of statements that met a missing or duplicate
// prepared statement at run time, in case Check did not catch the pooler.
var ErrTransactionPooler = errors.New("phase: the pool's connections are pooled by transaction (such as PgBouncer with pool_mode = transaction), " +
	"which cannot run statements that pgx prepares on server sessions; set default_query_exec_mode=cache_describe in the database URL")

// ErrCrash is returned by an Injector to crash the run at a point exactly as
// a killed process would: the open transaction rolls back, the lease is not
// freed, nothing is answered. The key resumes once its lease expires.
var ErrCrash = errors.New("phase: injected crash")

// RequestError is an error a Tenant or Decode function returns to answer the
// client with a specific status and a message a client developer can act on.
// Field names the offending request field, when there is one.
type RequestError struct {
	Status int
	Detail string
	Field  string
}

func (e *RequestError) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Detail
	}
	return e.Detail
}

// storeDown reports an error that says the database could not be reached,
// went away, or refused work for a while: connection failures, server
// shutdowns, a standby that is read-only after a failover, exhausted
// resources, cancelled or timed-out statements. Such a failure leaves nothing
// of the phase committed, so the client is told to retry. Errors the server
// raises about the statement itself (data exceptions, constraint violations)
// are not: retrying would fail the same way.
func storeDown(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch class := pgErr.Code[:2]; {
		case class == "08", // connection exception
			class == "53",                                           // insufficient resources
			strings.HasPrefix(pgErr.Code, "57P"),                    // admin or crash shutdown, cannot connect now
			pgErr.Code == pgerrcode.ReadOnlySQLTransaction,          // a standby, or a primary demoted by failover
			pgErr.Code == pgerrcode.QueryCanceled,                   // statement timeout or cancel request
			pgErr.Code == pgerrcode.LockNotAvailable,                // lock timeout
			pgErr.Code == pgerrcode.SerializationFailure,            // retried phases that still conflict
			pgErr.Code == pgerrcode.DeadlockDetected,                //
			pgErr.Code == pgerrcode.IdleInTransactionSessionTimeout: //
			return true
		}
		return false
	}
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, puddle.ErrClosedPool) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// retryable reports a serialization failure or deadlock, after which the
// phase's transaction can simply run again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) &&
		(pgErr.Code == pgerrcode.SerializationFailure || pgErr.Code == pgerrcode.DeadlockDetected)
}
