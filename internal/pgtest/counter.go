package pgtest

import (
	"context"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
)

// StatementCounter is a pgx tracer that records the statements a connection
// sends, so a test can assert what an operation costs. Set it as the Tracer
// of a pgx.ConnConfig (for a pool, of pgxpool.Config.ConnConfig). Its zero
// value is ready to use, and it is safe for concurrent use.
//
// It counts calls, not network messages, so counts do not depend on pgx's
// statement cache: a statement pgx first prepares still counts once. Begin,
// Commit and Rollback are statements like any other. CopyFrom and explicit
// Prepare calls are not counted.
type StatementCounter struct {
	mu         sync.Mutex
	sql        []string
	roundTrips int
}

var (
	_ pgx.QueryTracer = (*StatementCounter)(nil)
	_ pgx.BatchTracer = (*StatementCounter)(nil)
)

// Statements returns how many statements were sent: one per Exec, Query or
// QueryRow, and one per query queued in a batch.
func (c *StatementCounter) Statements() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sql)
}

// RoundTrips returns how many times a caller waited on the server: one per
// Exec, Query or QueryRow, and one per batch however many queries it holds.
func (c *StatementCounter) RoundTrips() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.roundTrips
}

// SQL returns the text of the statements sent, in the order they were sent.
func (c *StatementCounter) SQL() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sql)
}

// Reset forgets everything counted so far.
func (c *StatementCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sql, c.roundTrips = nil, 0
}

// TraceQueryStart counts an Exec, Query or QueryRow.
func (c *StatementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sql = append(c.sql, data.SQL)
	c.roundTrips++
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *StatementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch and every query queued in it. Counting here,
// rather than as results are read, counts queries whose results the caller
// never reads, which the server runs all the same.
func (c *StatementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range data.Batch.QueuedQueries {
		c.sql = append(c.sql, q.SQL)
	}
	c.roundTrips++
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (c *StatementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *StatementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
