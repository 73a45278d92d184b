package phase

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// phaseTx is the transaction a local phase runs in: a pgx.Tx whose BEGIN is
// not sent on its own but in one batch with the phase's first statement
// (pgx's Batch.BeginTx), and whose COMMIT is sent in one batch with the
// phase's fenced write. A phase therefore costs its own statements plus one
// round trip, and a phase that sends nothing costs the fenced write alone.
//
// The phase sees an ordinary transaction at the phase's isolation level:
// Exec, Query, QueryRow and SendBatch begin it with their statements;
// CopyFrom, Begin (a savepoint), LargeObjects and Conn begin it first, with
// a round trip of its own, since what follows them cannot share a batch with
// BEGIN or may bypass the transaction (statements sent on Conn directly).
// Statements that pass a pgx.QueryExecMode or result-format option do the
// same, since a batch cannot carry those options.
//
// A phaseTx may carry the commit of the phase before it (prior), still
// unsent, on the same connection: that commit then travels in front of
// BEGIN, in the same batch, so that passing from one local phase to the
// next costs no round trip of its own, and when the two may chain, COMMIT
// and BEGIN are one statement, COMMIT AND CHAIN (see priorCommit).
type phaseTx struct {
	// ctx is the run's context, for the begins of methods that take none.
	ctx  context.Context
	conn *pgx.Conn
	opts pgx.TxOptions
	// config is the pool's configuration (see Config).
	config *pgxpool.Config
	// tx is the transaction once BEGIN was sent; it reports its own state
	// (a failed BEGIN leaves it closed).
	tx pgx.Tx
	// err is why BEGIN could not be sent, if it could not.
	err error
	// ended is set when the phase committed or rolled back before sending
	// anything.
	ended bool
	// prior is the commit of the phase before, until it is sent; priorErr
	// is set when it failed (a *priorCommitError), or when its done did.
	// chained is set when the batch that carries it begins this
	// transaction with COMMIT AND CHAIN (see firstBatch).
	prior    *priorCommit
	priorErr error
	chained  bool

	// rows are the rows of the first statement, when it is a query.
	rows firstRows
	// first and last are the batches that begin and commit the
	// transaction, with room for their queries, so that building them
	// allocates nothing: first holds the prior commit (its write and
	// COMMIT), BEGIN and the phase's first statement; last the fenced
	// write and COMMIT.
	first, last  pgx.Batch
	firstQueued  [4]*pgx.QueuedQuery
	lastQueued   [2]*pgx.QueuedQuery
	firstQueries [3]pgx.QueuedQuery
	lastQueries  [2]pgx.QueuedQuery
}

// firstBatch returns the transaction's first batch: the prior commit, if
// any, then with begin BEGIN, then queries. BEGIN is queued by
// Batch.BeginTx, so that the batch's results carry the transaction;
// BeginTx requires it to be queued first only so that its result is the
// batch's first one for the caller, and the server runs the batch in
// order either way.
//
// When the prior commit may chain (see priorCommit), its COMMIT and BEGIN
// are one statement, COMMIT AND CHAIN, queued in BEGIN's place: the batch
// is then the prior's write, COMMIT AND CHAIN and queries, and t.chained
// is set.
func (t *phaseTx) firstBatch(begin bool, queries ...*pgx.QueuedQuery) *pgx.Batch {
	b := &t.first
	*b = pgx.Batch{QueuedQueries: t.firstQueued[:0]}
	if begin {
		b.BeginTx(t.opts)
	}
	t.chained = false
	if t.prior != nil {
		rest := b.QueuedQueries // BEGIN, or nothing
		var beginQuery *pgx.QueuedQuery
		if len(rest) > 0 {
			beginQuery = rest[0]
		}
		t.firstQueries[0] = t.prior.write.QueuedQuery()
		b.QueuedQueries = append(t.firstQueued[:0], &t.firstQueries[0])
		switch {
		case beginQuery != nil && t.prior.chain:
			beginQuery.SQL = commitAndChain
			b.QueuedQueries = append(b.QueuedQueries, beginQuery)
			t.chained = true
		default:
			t.firstQueries[1] = pgx.QueuedQuery{SQL: "COMMIT"}
			b.QueuedQueries = append(b.QueuedQueries, &t.firstQueries[1])
			if beginQuery != nil {
				b.QueuedQueries = append(b.QueuedQueries, beginQuery)
			}
		}
	}
	b.QueuedQueries = append(b.QueuedQueries, queries...)
	return b
}

// firstQuery returns sql and args as the query of the first batch.
func (t *phaseTx) firstQuery(sql string, args []any) *pgx.QueuedQuery {
	t.firstQueries[2] = pgx.QueuedQuery{SQL: sql, Arguments: args}
	return &t.firstQueries[2]
}

var _ pgx.Tx = (*phaseTx)(nil)

// closedTx returns a transaction that fails every call with
// pgx.ErrTxClosed, for a phaseTx whose transaction could not begin.
func closedTx() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}

// open returns the error a statement meets before the transaction began,
// if any.
func (t *phaseTx) open() error {
	switch {
	case t.err != nil:
		return t.err
	case t.ended:
		return pgx.ErrTxClosed
	}
	return nil
}

// begin sends BEGIN on its own (after the prior commit, if any), unless the
// transaction has begun already.
func (t *phaseTx) begin(ctx context.Context) error {
	if t.tx != nil {
		return t.err
	}
	if err := t.open(); err != nil {
		return err
	}
	if t.prior == nil {
		tx, err := t.conn.BeginTx(ctx, t.opts)
		if err != nil {
			t.err, t.tx = err, closedTx()
			return err
		}
		t.tx = tx
		return nil
	}
	br, err := t.sendFirst(ctx)
	if err != nil {
		return err
	}
	if err := br.Close(); err != nil {
		t.err = err
		return err
	}
	return nil
}

// batchable reports whether a statement with these arguments can be queued
// in a batch: batches take no query execution mode or result format option.
func batchable(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// sendFirst sends BEGIN and queries after it in one batch, the prior
// commit, if any, in front, and reads the results of the prior commit and
// of BEGIN. The caller reads the rest and closes the results. On an error
// nothing began, and the results are closed.
func (t *phaseTx) sendFirst(ctx context.Context, queries ...*pgx.QueuedQuery) (pgx.BatchResults, error) {
	br := t.conn.SendBatch(ctx, t.firstBatch(true, queries...))
	// Closing br marks this transaction closed if BEGIN never ran; when
	// the prior commit failed, it is the earlier phase's aborted
	// transaction that stays open, which the runner rolls back. A
	// chained commit's result, read with the prior's, is BEGIN's too.
	t.tx = br.Tx()
	err := t.settlePrior(br)
	if err == nil && !t.chained {
		_, err = br.Exec()
	}
	if err != nil {
		_ = br.Close()
		t.err = err
		return nil, err
	}
	return br, nil
}

func (t *phaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.tx == nil && batchable(args) {
		if err := t.open(); err != nil {
			return pgconn.CommandTag{}, err
		}
		br, err := t.sendFirst(ctx, t.firstQuery(sql, args))
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return tag, err
	}
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, args...)
}

func (t *phaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.tx == nil && batchable(args) {
		if err := t.open(); err != nil {
			return errRows(err), err
		}
		br, err := t.sendFirst(ctx, t.firstQuery(sql, args))
		if err != nil {
			return errRows(err), err
		}
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return rows, err
		}
		t.rows = firstRows{Rows: rows, br: br}
		return &t.rows, nil
	}
	if err := t.begin(ctx); err != nil {
		return errRows(err), err
	}
	return t.tx.Query(ctx, sql, args...)
}

func (t *phaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.tx != nil && t.err == nil {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	rows, _ := t.Query(ctx, sql, args...)
	return &firstRow{rows}
}

func (t *phaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.tx != nil {
		if t.err != nil {
			return pgx.FailedBatchResults(b, t.err)
		}
		return t.tx.SendBatch(ctx, b)
	}
	if err := t.open(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	// A batch that begins a transaction of its own reports a non-nil Tx
	// from FailedBatchResults; inside a transaction pgx refuses it.
	if pgx.FailedBatchResults(b, nil).Tx() != nil {
		return pgx.FailedBatchResults(b, errors.New("Batch.BeginTx cannot be used within a transaction"))
	}
	br, err := t.sendFirst(ctx, b.QueuedQueries...)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return firstBatch{br}
}

func (t *phaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

func (t *phaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.tx != nil {
		if t.err != nil {
			return nil, t.err
		}
		return t.tx.Prepare(ctx, name, sql)
	}
	if err := t.open(); err != nil {
		return nil, err
	}
	// Prepared statements belong to the connection, not the transaction;
	// the prior commit goes first, so that a failed Parse cannot abort
	// the earlier phase's transaction.
	if err := t.flushPrior(ctx); err != nil {
		t.err = err
		return nil, err
	}
	return t.conn.Prepare(ctx, name, sql)
}

// Begin starts a pseudo nested transaction (a savepoint).
func (t *phaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

func (t *phaseTx) LargeObjects() pgx.LargeObjects {
	if err := t.begin(t.ctx); err != nil && t.tx == nil {
		return closedTx().LargeObjects()
	}
	return t.tx.LargeObjects()
}

// Conn returns the connection the transaction runs on, having begun the
// transaction, so that statements sent on the connection directly run in it.
// If BEGIN fails, the connection is closed rather than left to run
// statements outside any transaction.
func (t *phaseTx) Conn() *pgx.Conn {
	if t.tx == nil && t.open() == nil {
		if err := t.begin(t.ctx); err != nil {
			_ = t.conn.Close(context.WithoutCancel(t.ctx))
		}
	}
	return t.conn
}

// Config returns the configuration of the pool the transaction's connection
// came from, which must not be modified. A driver that reads its settings
// from it, as River's pgx driver reads the query exec mode before each
// statement, then need not ask for Conn, which would send BEGIN on its own.
func (t *phaseTx) Config() *pgxpool.Config { return t.config }

// Commit commits the transaction. The runner commits the phase itself,
// with its fenced write; a phase that commits on its own fails.
func (t *phaseTx) Commit(ctx context.Context) error {
	if t.err != nil {
		return t.err
	}
	if t.tx == nil {
		if err := t.open(); err != nil {
			return err
		}
		t.ended = true
		return nil
	}
	return t.tx.Commit(ctx)
}

// Rollback rolls the transaction back.
func (t *phaseTx) Rollback(ctx context.Context) error {
	if t.tx == nil {
		if err := t.open(); err != nil {
			return err
		}
		t.ended = true
		return nil
	}
	return t.tx.Rollback(ctx)
}

// firstRows are the rows of a query sent in one batch with BEGIN: closing
// them closes the batch, which frees the connection.
type firstRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *firstRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *firstRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *firstRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// firstRow is QueryRow's row over firstRows, scanned as pgx scans a row.
type firstRow struct{ rows pgx.Rows }

func (r *firstRow) Scan(dest ...any) error {
	rows := r.rows
	defer rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// firstBatch are the results of a phase's batch sent with BEGIN, whose
// result was already read: the caller sees its own queries' results only.
type firstBatch struct{ pgx.BatchResults }

// Tx returns nil: the caller's batch did not begin the transaction.
func (firstBatch) Tx() pgx.Tx { return nil }

// errRows returns closed rows that report err.
func errRows(err error) pgx.Rows { return &closedRows{err: err} }

// closedRows are rows of a query that was never sent.
type closedRows struct{ err error }

func (r *closedRows) Close()                                       {}
func (r *closedRows) Err() error                                   { return r.err }
func (r *closedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *closedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *closedRows) Next() bool                                   { return false }
func (r *closedRows) Scan(...any) error                            { return r.err }
func (r *closedRows) Values() ([]any, error)                       { return nil, r.err }
func (r *closedRows) RawValues() [][]byte                          { return nil }
func (r *closedRows) Conn() *pgx.Conn                              { return nil }
func (r *closedRows) TypeMap() *pgtype.Map                         { return nil }
