package phase

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/store"
)

// checkPool refuses, without touching the database, pool settings under
// which pgx cannot run the client's statements at all.
func checkPool(cfg *pgx.ConnConfig) error {
	switch mode := cfg.DefaultQueryExecMode; mode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		// Both send every parameter as text of a type guessed from its Go
		// type: the client's uuid ([16]byte) and jsonb ([]byte) parameters
		// cannot be sent that way.
		return fmt.Errorf("phase: the pool's query exec mode %q cannot send the client's uuid and jsonb parameters; "+
			"use cache_statement (pgx's default) or, behind a transaction pooler such as PgBouncer, cache_describe", mode)
	case pgx.QueryExecModeCacheStatement:
		if cfg.StatementCacheCapacity <= 0 {
			return errors.New("phase: the pool's statement cache is disabled (statement_cache_capacity=0), which makes pgx refuse " +
				"every statement in its default query exec mode; behind a transaction pooler such as PgBouncer, " +
				"set default_query_exec_mode=cache_describe instead")
		}
	case pgx.QueryExecModeCacheDescribe:
		if cfg.DescriptionCacheCapacity <= 0 {
			return errors.New("phase: the pool's description cache is disabled (description_cache_capacity=0), which makes pgx refuse " +
				"every statement in query exec mode cache_describe")
		}
	}
	return nil
}

// Check verifies that the client can run its statements through its pool,
// and returns an error saying what to change when it cannot: an error
// wrapping ErrTransactionPooler when the pool's query exec mode
// (cache_statement or describe_exec) needs server sessions that a
// transaction pooler hands from connection to connection, or the error that
// kept it from finding out. In cache_describe it has nothing to find out.
//
// It tells a transaction pooler by the server session behind a connection:
// a direct connection's is the one announced when it logged in (one
// statement in all); behind a proxy, two connections ask for theirs a few
// times, and a transaction pooler shows by giving both the same session, or
// one of them another. It then prepares a statement on one session and runs
// it on another: a pooler that prepares it there too can run
// cache_statement. A proxy that keeps each connection on its own session (a
// session pooler, or a transaction pooler that happened not to show) passes,
// with a warning in the log.
//
// Start, Complete, Reap and the first Run check by themselves; a process
// that only uses the operations (Inspect, List, Counts...) calls Check
// itself. Once it has passed, or found a transaction pooler, Check returns
// the same answer without asking again.
func (c *Client) Check(ctx context.Context) error {
	c.checkMu.Lock()
	defer c.checkMu.Unlock()
	if c.checked {
		return c.checkErr
	}
	distributed, err := store.IsDistributed(ctx, c.db)
	if err != nil {
		return fmt.Errorf("phase: check: %w", err)
	}
	c.distributed.Store(distributed)
	err = c.checkPooling(ctx)
	if err == nil || errors.Is(err, ErrTransactionPooler) {
		c.checked, c.checkErr = true, err
		c.checkPassed.Store(err == nil)
	}
	return err
}

// ready checks the pool once, as Check does, at almost no cost afterwards.
func (c *Client) ready(ctx context.Context) error {
	if c.checkPassed.Load() {
		return nil
	}
	return c.Check(ctx)
}

func (c *Client) checkPooling(ctx context.Context) error {
	mode := c.pool.Config().ConnConfig.DefaultQueryExecMode
	if mode != pgx.QueryExecModeCacheStatement && mode != pgx.QueryExecModeDescribeExec {
		// cache_describe prepares nothing a session keeps: it works
		// directly and through any pooler.
		return nil
	}
	pooling, err := store.ProbePooling(ctx, c.pool)
	if err != nil {
		return fmt.Errorf("phase: check: %w", err)
	}
	switch {
	case pooling == store.TransactionPooled,
		pooling == store.PreparedCarried && mode == pgx.QueryExecModeDescribeExec:
		err := fmt.Errorf("%w (the pool's query exec mode is %q)", ErrTransactionPooler, mode)
		c.cfg.Logger.Error("the pool cannot run the client's statements", "query_exec_mode", mode.String(), "err", err)
		return err
	case pooling == store.Proxied:
		c.cfg.Logger.Warn("the pool reaches Postgres through a proxy; if it pools transactions (PgBouncer pool_mode = transaction), "+
			"set default_query_exec_mode=cache_describe in the database URL", "query_exec_mode", mode.String())
	}
	return nil
}

// preparedStatementLost reports whether err is Postgres not finding a
// prepared statement, or finding one of the same name already there: what
// the statements of a pool that prepares them meet behind a transaction
// pooler.
func preparedStatementLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) &&
		(pgErr.Code == pgerrcode.InvalidSQLStatementName || pgErr.Code == pgerrcode.DuplicatePreparedStatement)
}
