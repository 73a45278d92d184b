package phase

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

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
