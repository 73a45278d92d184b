package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/pgschema"
)

// Schema is the Postgres schema that holds the library's tables and
// functions, for a client whose tables are not where the connection's
// search_path finds them. Every statement in this package is written
// against the unqualified names; a Schema turns each one into the
// statement for its schema (pgschema.Qualify) the first time it is sent,
// and keeps the result, so that each statement is rewritten once per
// client.
//
// A nil *Schema is the connection's search_path: its statements go out
// byte for byte as written, through the Querier they were given.
type Schema struct {
	name string
	// statements maps each statement as written to its qualified form.
	statements sync.Map
	// cached counts them, up to maxCached.
	cached atomic.Int64
}

// maxCached bounds the statements a Schema keeps. The fixed statements
// are a few dozen; the listings and bulk actions build theirs from the
// filters set, a few hundred at most. Past the bound a statement is
// rewritten every time it is sent.
const maxCached = 2048

// NewSchema returns the Schema named name, nil for the empty name, or the
// error of pgschema.Check.
func NewSchema(name string) (*Schema, error) {
	if err := pgschema.Check(name); err != nil {
		return nil, err
	}
	if name == "" {
		return nil, nil
	}
	return &Schema{name: name}, nil
}

// Name returns the schema's name, empty for the search_path.
func (s *Schema) Name() string {
	if s == nil {
		return ""
	}
	return s.name
}

// SQL returns stmt, a statement written against the unqualified names,
// for s.
func (s *Schema) SQL(stmt string) string {
	if s == nil {
		return stmt
	}
	if q, ok := s.statements.Load(stmt); ok {
		return q.(string)
	}
	q := pgschema.Qualify(s.name, stmt)
	if s.cached.Add(1) <= maxCached {
		s.statements.Store(stmt, q)
	}
	return q
}

// Querier returns q, through which every statement goes out for s: q
// itself when s is nil.
func (s *Schema) Querier(q Querier) Querier {
	if s == nil {
		return q
	}
	return qualified{q: q, s: s}
}

// In returns w with its statement for s, to send on a connection that is
// not one of s's Queriers: the phase runner queues a lease's writes in
// batches on its own connection.
func (w Write) In(s *Schema) Write {
	w.sql = s.SQL(w.sql)
	return w
}

// qualified is a Querier whose statements go out for its schema. It
// begins transactions whose statements do too, which actDistributed needs.
type qualified struct {
	q Querier
	s *Schema
}

func (x qualified) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return x.q.Exec(ctx, x.s.SQL(sql), args...)
}

func (x qualified) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return x.q.Query(ctx, x.s.SQL(sql), args...)
}

func (x qualified) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return x.q.QueryRow(ctx, x.s.SQL(sql), args...)
}

func (x qualified) Begin(ctx context.Context) (pgx.Tx, error) {
	b, ok := x.q.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return nil, errors.New("store: begin: the querier cannot begin a transaction")
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return qualifiedTx{Tx: tx, s: x.s}, nil
}

// qualifiedTx is a transaction begun by a qualified Querier.
type qualifiedTx struct {
	pgx.Tx
	s *Schema
}

func (x qualifiedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return x.Tx.Exec(ctx, x.s.SQL(sql), args...)
}

func (x qualifiedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return x.Tx.Query(ctx, x.s.SQL(sql), args...)
}

func (x qualifiedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return x.Tx.QueryRow(ctx, x.s.SQL(sql), args...)
}

func (x qualifiedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return qualified{q: x.Tx, s: x.s}.Begin(ctx)
}
