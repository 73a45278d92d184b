package store

import (
	"context"
	"fmt"
	"strconv"

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
	// pooler does.
	TransactionPooled
)

func (p Pooling) String() string {
	switch p {
	case Direct:
		return "direct"
	case Proxied:
		return "proxied"
	case TransactionPooled:
		return "transaction pooled"
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
	if firstA == firstB {
		return TransactionPooled, nil
	}
	for range probeRounds {
		pa, err := backendPID(ctx, a.Conn().PgConn())
		if err != nil {
			return 0, err
		}
		pb, err := backendPID(ctx, b.Conn().PgConn())
		if err != nil {
			return 0, err
		}
		if pa == pb || pa != firstA || pb != firstB {
			return TransactionPooled, nil
		}
	}
	return Proxied, nil
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
