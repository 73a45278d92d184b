package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pooling says how the connections of a pool map onto server sessions.
type Pooling int

// The poolings ProbePooling tells apart.
const (
	// Direct: each connection is a server session of its own.
	Direct Pooling = iota + 1
	// Proxied: a proxy stands between the pool and Postgres, and the probe
	// saw each connection keep its own server session, as a session pooler
	// does. A transaction pooler under load, or one that does not reuse the
	// session it freed last, can look the same.
	Proxied
	// TransactionPooled: the server sessions behind two connections changed
	// hands between statements, which only a transaction (or statement)
	// pooler does, and a statement prepared on one session was missing on
	// the next (PgBouncer before 1.21, or with max_prepared_statements = 0).
	TransactionPooled
	// PreparedCarried: a transaction pooler that prepares a connection's
	// named statements again on whichever session runs them (PgBouncer
	// 1.21 and later with max_prepared_statements > 0, the default since
	// 1.24).
	PreparedCarried
)

func (p Pooling) String() string {
	switch p {
	case Direct:
		return "direct"
	case Proxied:
		return "proxied"
	case TransactionPooled:
		return "transaction pooled"
	case PreparedCarried:
		return "transaction pooled, prepared statements carried"
	}
	return fmt.Sprintf("Pooling(%d)", int(p))
}

// probeRounds is how many times ProbePooling asks two connections for their
// server sessions before it concludes that they keep them.
const probeRounds = 3

// backendPIDSQL names the server session that runs it.
const backendPIDSQL = "SELECT pg_backend_pid()"

// ProbePooling finds out whether pool reaches Postgres directly, through a
// proxy that gives each connection a session of its own, or through a
// transaction pooler, for a few statements: one on a direct connection.
//
// A connection announces a backend process ID when it logs in; a direct
// connection's server session reports the same one (pg_backend_pid), while
// a proxy answers the login itself and announces an ID of its own. Behind a
// proxy, two connections of the pool then ask for their sessions in turn,
// a few times: under session pooling each always reports its own, distinct
// session; under transaction pooling a statement runs on whichever session
// is free, and a pooler that reuses the session freed last (PgBouncer does)
// gives both the same one. So TransactionPooled is never a guess, while
// Proxied may be a transaction pooler that the probe did not catch.
//
// The statements go through the simple query protocol on the connections
// themselves (pgconn), so they prepare nothing, whatever the pool's query
// exec mode, and pgx tracers do not see them.
func ProbePooling(ctx context.Context, pool *pgxpool.Pool) (Pooling, error) {
	a, err := pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("store: probe pooling: %w", err)
	}
	defer a.Release()
	firstA, err := backendPID(ctx, a.Conn().PgConn())
	if err != nil {
		return 0, err
	}
	if firstA == a.Conn().PgConn().PID() {
		return Direct, nil
	}
	if pool.Config().MaxConns < 2 {
		// A second connection would wait for the first forever.
		return Proxied, nil
	}
	b, err := pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("store: probe pooling: %w", err)
	}
	defer b.Release()
	firstB, err := backendPID(ctx, b.Conn().PgConn())
	if err != nil {
		return 0, err
	}
	pooled := firstA == firstB
	for i := 0; i < probeRounds && !pooled; i++ {
		pa, err := backendPID(ctx, a.Conn().PgConn())
		if err != nil {
			return 0, err
		}
		pb, err := backendPID(ctx, b.Conn().PgConn())
		if err != nil {
			return 0, err
		}
		pooled = pa == pb || pa != firstA || pb != firstB
	}
	if !pooled {
		return Proxied, nil
	}
	carried, err := preparedCarried(ctx, a.Conn().PgConn(), b.Conn().PgConn())
	if err != nil {
		return 0, err
	}
	if carried {
		return PreparedCarried, nil
	}
	return TransactionPooled, nil
}

// preparedCarried finds out whether a transaction pooler carries a named
// prepared statement of connection a to the server sessions that run a's
// later statements. It prepares one inside a transaction that also names
// its session, then runs it while b holds a session in a transaction of its
// own (the one just freed, under PgBouncer), so that a runs on another
// session. The pooler carries it when it runs there, and does not when
// Postgres finds no such statement; running on the same session again tells
// nothing, and is tried again.
//
// A pooler that does not carry it leaves it on the session it was prepared
// on, under a name no one else uses, until the pooler closes that session.
func preparedCarried(ctx context.Context, a, b *pgconn.PgConn) (bool, error) {
	var random [8]byte
	_, _ = rand.Read(random[:])
	name := "atomicphase_probe_" + hex.EncodeToString(random[:])
	prepared, err := func() (uint32, error) {
		if err := exec(ctx, a, "BEGIN"); err != nil {
			return 0, err
		}
		defer exec(context.WithoutCancel(ctx), a, "COMMIT") //nolint:errcheck // the statement stays prepared either way
		if _, err := a.Prepare(ctx, name, backendPIDSQL, nil); err != nil {
			return 0, fmt.Errorf("store: probe pooling: %w", err)
		}
		return backendPID(ctx, a)
	}()
	if err != nil {
		return false, err
	}
	defer a.Deallocate(context.WithoutCancel(ctx), name) //nolint:errcheck // see the doc comment
	for range probeRounds {
		ran, found, err := runHeld(ctx, a, b, name)
		switch {
		case err != nil:
			return false, err
		case !found:
			return false, nil
		case ran != prepared:
			return true, nil
		}
	}
	return false, nil
}

// runHeld runs the statement a prepared as name while b holds a server
// session in a transaction, and returns the session it ran on, or found
// false when Postgres had no such statement there.
func runHeld(ctx context.Context, a, b *pgconn.PgConn, name string) (ran uint32, found bool, err error) {
	if err := exec(ctx, b, "BEGIN"); err != nil {
		return 0, false, err
	}
	defer exec(context.WithoutCancel(ctx), b, "ROLLBACK") //nolint:errcheck // ends a transaction that changed nothing
	if _, err := backendPID(ctx, b); err != nil {
		return 0, false, err
	}
	result := a.ExecPrepared(ctx, name, nil, nil, nil).Read()
	var pgErr *pgconn.PgError
	switch {
	case errors.As(result.Err, &pgErr) && pgErr.Code == pgerrcode.InvalidSQLStatementName:
		return 0, false, nil
	case result.Err != nil:
		return 0, false, fmt.Errorf("store: probe pooling: %w", result.Err)
	case len(result.Rows) != 1 || len(result.Rows[0]) != 1:
		return 0, false, fmt.Errorf("store: probe pooling: %s returned no single value", backendPIDSQL)
	}
	pid, err := strconv.ParseUint(string(result.Rows[0][0]), 10, 32)
	if err != nil {
		return 0, false, fmt.Errorf("store: probe pooling: %w", err)
	}
	return uint32(pid), true, nil
}

// exec runs sql, which returns no rows, on conn.
func exec(ctx context.Context, conn *pgconn.PgConn, sql string) error {
	if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("store: probe pooling: %w", err)
	}
	return nil
}

// backendPID returns the process ID of the server session that runs a
// statement sent on conn.
func backendPID(ctx context.Context, conn *pgconn.PgConn) (uint32, error) {
	results, err := conn.Exec(ctx, backendPIDSQL).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("store: probe pooling: %w", err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 1 {
		return 0, fmt.Errorf("store: probe pooling: %s returned no single value", backendPIDSQL)
	}
	pid, err := strconv.ParseUint(string(results[0].Rows[0][0]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("store: probe pooling: %w", err)
	}
	return uint32(pid), nil
}
