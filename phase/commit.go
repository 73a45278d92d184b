package phase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// asPriorCommit returns the *priorCommitError in err's chain, if any.
func asPriorCommit(err error) *priorCommitError {
	if err == nil {
		return nil
	}
	var prior *priorCommitError
	if errors.As(err, &prior) {
		return prior
	}
	return nil
}

// again handles the failure of the commit held back from the phase at
// x.priorAt, which travelled with the next phase's first statement and
// failed (see commitOnce): neither phase committed anything, so the run
// goes back to that phase, with its state as committed before it, and runs
// it again after a serialization failure or deadlock, as commit would;
// any other failure ends the run as that phase's.
func (x *execution[Req, State]) again(ctx context.Context, err error) (int, recordFn[Req, State], error) {
	i, rec := x.priorAt, x.priorRec
	x.priorRec = nil
	x.restoreState()
	p := &x.w.phases[i]
	x.run.phase = p.identity()
	if errors.Is(err, keyrow.ErrLeaseLost) {
		x.lease.MarkLost()
		return 0, nil, err
	}
	if !retryable(err) || x.priorRetries >= x.c.cfg.MaxPhaseRetries {
		return 0, nil, x.storeError(ctx, fmt.Errorf("phase %s: commit: %w", p.name, err))
	}
	x.c.observe(ctx, keyrow.Event{Kind: keyrow.EventRetried, Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key,
		RecoveryPoint: x.rp, Phase: p.name, Err: err})
	backoff := x.c.cfg.RetryBackoff << x.priorRetries
	x.priorRetries++
	t := time.NewTimer(backoff/2 + rand.N(backoff))
	select {
	case <-ctx.Done():
		t.Stop()
		return 0, nil, x.storeError(ctx, ctx.Err())
	case <-t.C:
	}
	return i, rec, nil
}

// committedAt records that the phase at index i committed, its advance sent
// at began, with state: the lease is proven from began, and the run's
// state and recovery point move on. It returns the error of an injected
// fault after the commit.
func (x *execution[Req, State]) committedAt(ctx context.Context, i int, began, started time.Time, state []byte) error {
	p := &x.w.phases[i]
	// The advance found the lease the run's own and extended it to a TTL
	// from its transaction's start, which is after began.
	x.lease.Proven(began)
	x.committed = state
	if err := x.inject(ctx, Point{p.name, AfterCommit}); err != nil {
		return err
	}
	x.rp = p.identity()
	x.c.observe(ctx, keyrow.Event{Kind: keyrow.EventPhaseCommitted, Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key,
		Phase: p.name, Duration: time.Since(started), RecoveryPoint: x.rp})
	if x.debugging(ctx) {
		x.debug(ctx, "phase committed", "recovery_point", x.rp)
	}
	return nil
}

// commit runs body in the phase's transaction and commits it together with
// the advance (or the finish, when body responds), re-running it after a
// serialization failure or deadlock.
func (x *execution[Req, State]) commit(ctx context.Context, i int, body LocalFunc[Req, State], rec recordFn[Req, State]) (Result, error) {
	p := &x.w.phases[i]
	backoff := x.c.cfg.RetryBackoff
	for attempt := 0; ; attempt++ {
		res, err := x.commitOnce(ctx, i, body, rec)
		if err == nil || asPriorCommit(err) != nil {
			return res, err
		}
		x.restoreState()
		if !retryable(err) || attempt >= x.c.cfg.MaxPhaseRetries {
			return Result{}, x.storeError(ctx, err)
		}
		x.c.observe(ctx, keyrow.Event{Kind: keyrow.EventRetried, Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key,
			RecoveryPoint: x.rp, Phase: p.name, Err: err})
		t := time.NewTimer(backoff/2 + rand.N(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return Result{}, x.storeError(ctx, ctx.Err())
		case <-t.C:
		}
		backoff *= 2
	}
}

// storeError marks an error of the store, or of the run's own time limit,
// so the caller is told to retry: nothing of the phase was committed.
func (x *execution[Req, State]) storeError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrCrash), errors.Is(err, keyrow.ErrLeaseLost):
		return err
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", ErrRunTimeout, err)
	case errors.Is(ctx.Err(), context.Canceled) && (x.byCompleter || x.c.halt.Err() != nil):
		return &cutShortError{err: err}
	case storeDown(err) || ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case preparedStatementLost(err):
		return fmt.Errorf("%w: %w", ErrTransactionPooler, err)
	}
	return err
}

// commitOnce costs the phase's own statements plus one round trip: BEGIN
// travels with the phase's first statement, and the fenced advance (or
// finish) with COMMIT; a phase that sends nothing costs the fenced write
// alone (see phaseTx). If the lease was lost, the fenced write raises and
// the COMMIT is skipped, so nothing of the phase persists.
//
// The advance of a local phase to a local phase is held back instead (see
// holdsBack): the phase's transaction stays open on its connection, and its fenced write
// and COMMIT travel in front of the next phase's BEGIN and first
// statement, which saves a round trip per local phase; when the two phases
// run at the same isolation level on a single Postgres, COMMIT and BEGIN
// are one COMMIT AND CHAIN (see priorCommit). That phase's Go
// code then runs before the commit of the phase before it is known: when
// that commit fails (the fence found the lease lost, or the commit met a
// serialization failure), the server runs none of the next phase's
// statements, and the runner discards whatever the next phase returned,
// restores the state, and runs the earlier phase again or ends the run as
// that phase's failure. So a local phase must keep its effects inside its
// transaction, as it always had to; its Go code may run more than once.
//
// On a key table distributed with Citus the fenced write is a call of a
// function that runs the plain UPDATE, which Citus plans on its fast path,
// and raises when it matched no row (see store's committingByID): the same
// pipeline, with the same failure paths.
func (x *execution[Req, State]) commitOnce(ctx context.Context, i int, body LocalFunc[Req, State], rec recordFn[Req, State]) (res Result, err error) {
	p := &x.w.phases[i]
	// A commit held back from the phase before is this phase's to send, on
	// the connection its transaction is open on.
	conn := x.held
	x.held = nil
	var prior *priorCommit
	if conn != nil {
		prior = &x.heldBack
	} else {
		if err := x.inject(ctx, Point{p.name, BeforeTx}); err != nil {
			return Result{}, err
		}
		if conn, err = x.c.pool.Acquire(ctx); err != nil {
			return Result{}, fmt.Errorf("phase %s: %w", p.name, err)
		}
	}
	kept := false
	defer func() {
		if kept {
			return
		}
		// A successful pipelined COMMIT leaves the connection idle; only a
		// failed or unfinished transaction (this phase's, or the phase
		// before's if its commit was never sent) needs the rollback.
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Conn().Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		conn.Release()
	}()
	tx := &phaseTx{ctx: ctx, conn: conn.Conn(), opts: pgx.TxOptions{IsoLevel: p.isolation}, config: x.c.poolConfig, prior: prior}
	if prior != nil {
		if err := x.inject(ctx, Point{p.name, BeforeTx}); err != nil {
			return Result{}, x.endPrior(ctx, tx, err)
		}
	}
	// The advance extends the lease from now() in Postgres, the start of
	// the phase's transaction, which comes after this.
	began := time.Now()
	err = protect("phase", p.name, func() (err error) {
		res, err = body(ctx, tx, x.run)
		return err
	})
	if tx.priorErr != nil {
		// The commit of the phase before failed: whatever this phase
		// returned, none of its statements ran.
		return Result{}, tx.priorErr
	}
	if err == nil {
		err = res.err
	}
	if err != nil {
		return Result{}, x.endPrior(ctx, tx, fmt.Errorf("phase %s: %w", p.name, err))
	}
	next, state, err := x.settle(i, res)
	if err != nil {
		return Result{}, x.endPrior(ctx, tx, err)
	}
	if err := x.inject(ctx, Point{p.name, BeforeCommit}); err != nil {
		return Result{}, x.endPrior(ctx, tx, err)
	}
	// The write matches the recovery point the key is at once the commit
	// before it has been made: the held-back phase's when it travels with
	// this one.
	from := x.rp
	if prior != nil {
		from = x.w.phases[x.priorAt].identity()
	}
	w, err := x.fencedWrite(p, from, res, state)
	if err != nil {
		return Result{}, x.endPrior(ctx, tx, err)
	}
	// Only an open, healthy transaction is held back: one the phase ended
	// on its own, or in which a statement failed, fails its commit now.
	if res.response == nil && tx.tx != nil && tx.err == nil && conn.Conn().PgConn().TxStatus() == 'T' &&
		x.holdsBack(i, next) {
		x.heldBack = priorCommit{write: w, done: x,
			chain: x.w.phases[next].isolation == p.isolation}
		x.heldBegan, x.heldStarted, x.heldState = began, x.started, state
		x.held, x.priorAt, x.priorRec, x.next = conn, i, rec, next
		kept = true
		return res, nil
	}
	if err := tx.commit(ctx, w); err != nil {
		if asPriorCommit(err) != nil || tx.priorErr != nil {
			return Result{}, err
		}
		return Result{}, x.commitFailed(p, err)
	}
	if res.response == nil {
		x.next = next
		return res, x.committedAt(ctx, i, began, x.started, state)
	}
	x.committed = state
	if err := x.inject(ctx, Point{p.name, AfterCommit}); err != nil {
		return Result{}, err
	}
	return res, nil
}

// commitFailed returns the error of phase p's commit, err, having marked
// the lease lost when the fence found it so.
func (x *execution[Req, State]) commitFailed(p *Phase[Req, State], err error) error {
	if errors.Is(err, keyrow.ErrLeaseLost) {
		x.lease.MarkLost()
		return err
	}
	return fmt.Errorf("phase %s: commit: %w", p.name, err)
}

// priorCommitted is committedAt for the phase whose commit was held back
// (see priorCommit).
func (x *execution[Req, State]) priorCommitted(ctx context.Context) error {
	return x.committedAt(ctx, x.priorAt, x.heldBegan, x.heldStarted, x.heldState)
}

// holdsBack reports whether the commit of the phase at index i, followed by
// the phase at index next, is held back to travel with next's first
// statement (see commitOnce). Both must be local: the record of a foreign
// call commits before anything after it runs, since a crash that lost it
// would send the call again, or leave it to be reconciled, though its
// outcome was known; and a foreign call must follow a commit it knows of.
// No PhaseWrapper may be installed either, since a wrapper's phase includes
// its commit.
func (x *execution[Req, State]) holdsBack(i, next int) bool {
	return x.w.phases[i].foreign == nil && x.w.phases[next].foreign == nil && len(x.c.hooks.phases) == 0
}

// endPrior returns err, the error of a phase that was to carry the commit
// of the phase before it. A commit still unsent is sent first, alone,
// unless the run crashed: the phase before stays committed, as it would
// have been had its commit not been held back.
func (x *execution[Req, State]) endPrior(ctx context.Context, tx *phaseTx, err error) error {
	if tx.priorErr != nil {
		return tx.priorErr
	}
	if tx.prior == nil || errors.Is(err, ErrCrash) {
		return err
	}
	if ferr := tx.flushPrior(ctx); ferr != nil {
		return ferr
	}
	return err
}

// dropHeld rolls back and frees a transaction held back for a commit that
// will not be sent.
func (x *execution[Req, State]) dropHeld(ctx context.Context) {
	if x.held == nil {
		return
	}
	if x.held.Conn().PgConn().TxStatus() != 'I' {
		_, _ = x.held.Conn().Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	x.held.Release()
	x.held = nil
}

// settle decides what the phase at index i, ended with res, commits: the
// state's JSON and, unless res responds, the index of the next phase that
// applies. That phase is found before the commit, in the phase's open
// transaction, because its When reads the state the phase just set, and a
// workflow with no phase left to respond must fail rather than commit an
// advance that nothing can follow.
func (x *execution[Req, State]) settle(i int, res Result) (next int, state []byte, err error) {
	p := &x.w.phases[i]
	if res.response == nil {
		if next, err = x.applicable(i + 1); err != nil {
			return 0, nil, err
		}
		if next == len(x.w.phases) {
			return 0, nil, fmt.Errorf("phase %s: %w", p.name, ErrNoResponse)
		}
	}
	if err := protect("encoding the state", "", func() (err error) {
		state, err = json.Marshal(x.run.State)
		return err
	}); err != nil {
		return 0, nil, fmt.Errorf("phase %s: encode state: %w", p.name, err)
	}
	if hasNUL(state) {
		return 0, nil, fmt.Errorf("phase %s: the state holds a NUL character (\\u0000), which cannot be stored", p.name)
	}
	return next, state, nil
}

// fencedWrite is the lease's fenced write that commits phase p: the advance
// from recovery point from to p, or the finish with res's response.
func (x *execution[Req, State]) fencedWrite(p *Phase[Req, State], from string, res Result, state []byte) (store.Write, error) {
	var (
		w   store.Write
		err error
	)
	if res.response != nil {
		w, err = x.lease.Finish(from, state, x.w.store.stored(*res.response))
	} else {
		w, err = x.lease.Advance(from, p.identity(), state)
	}
	if err != nil {
		return store.Write{}, fmt.Errorf("phase %s: %w", p.name, err)
	}
	// The write goes out on the phase's own connection, not through the
	// client's Querier, so it is put in the client's schema here.
	return w.In(x.c.schema), nil
}

func (x *execution[Req, State]) restoreState() {
	var zero State
	x.run.State = zero
	// committed was produced by json.Marshal of State, so it decodes; nil
	// is the zero State a key starts with.
	if x.committed != nil {
		_ = json.Unmarshal(x.committed, &x.run.State)
	}
}

// priorCommit is the commit of a phase held back to travel with the next
// phase's first statement: its fenced write and COMMIT, queued in front of
// the next phase's BEGIN. In one batch the server runs the write, then
// COMMIT, then BEGIN and the next phase's statements, and skips everything
// after the first error: when the fence finds the lease lost, or the commit
// fails, nothing of either phase is committed and the next phase's
// statements never run.
type priorCommit struct {
	write store.Write
	// chain is set when the next phase's transaction may begin with
	// COMMIT AND CHAIN, which commits this one and begins the next with the
	// same characteristics in one statement: the two phases run at the
	// same isolation level.
	chain bool
	// done is told once the commit succeeded; an error from it (an
	// injected fault) ends the phase that carried the commit.
	done interface {
		priorCommitted(ctx context.Context) error
	}
}

// commitAndChain commits a transaction and begins the next with the same
// isolation level and access mode (PostgreSQL 12 and later).
const commitAndChain = "COMMIT AND CHAIN"

// priorCommitError is the error a phase's statement meets when the commit
// of the phase before it, which travelled with that statement, failed:
// neither phase committed anything, and the runner takes the failure as
// the earlier phase's.
type priorCommitError struct{ err error }

func (e *priorCommitError) Error() string {
	return "phase: the commit of the phase before failed: " + e.err.Error()
}

func (e *priorCommitError) Unwrap() error { return e.err }

// settlePrior reads the results of the prior commit queued at the front of
// br, its write and its COMMIT (or COMMIT AND CHAIN), and forgets it. It
// returns a *priorCommitError when the commit failed, or the error of the
// prior's done.
func (t *phaseTx) settlePrior(br pgx.BatchResults) error {
	p := t.prior
	if p == nil {
		return nil
	}
	t.prior = nil
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err != nil {
		t.priorErr = &priorCommitError{store.AsLeaseLost(err)}
	} else {
		t.priorErr = p.done.priorCommitted(t.ctx)
	}
	return t.priorErr
}

// flushPrior sends the prior commit on its own, if it is still unsent.
func (t *phaseTx) flushPrior(ctx context.Context) error {
	if t.prior == nil {
		return nil
	}
	br := t.conn.SendBatch(ctx, t.firstBatch(false))
	err := t.settlePrior(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = &priorCommitError{store.AsLeaseLost(cerr)}
		t.priorErr = err
	}
	return err
}

// commit ends the phase with w, the fenced write that advances or finishes
// the key: pipelined with COMMIT when the phase sent statements, or sent on
// its own, as a transaction of its own, when it sent none (after the prior
// commit, if any, in a round trip of its own). Either way it is one round
// trip.
func (t *phaseTx) commit(ctx context.Context, w store.Write) error {
	if t.tx == nil {
		if err := t.open(); err != nil {
			return err
		}
		t.ended = true
		// The prior commit goes alone first: in one batch with w, w would
		// commit before the prior's done learnt of the prior commit, and
		// a fault injected after that commit could not stop w.
		if err := t.flushPrior(ctx); err != nil {
			return err
		}
		return w.Exec(ctx, t.conn)
	}
	if t.err != nil {
		return t.err
	}
	t.lastQueries = [2]pgx.QueuedQuery{w.QueuedQuery(), {SQL: "COMMIT"}}
	t.lastQueued = [2]*pgx.QueuedQuery{&t.lastQueries[0], &t.lastQueries[1]}
	t.last = pgx.Batch{QueuedQueries: t.lastQueued[:]}
	return store.AsLeaseLost(t.tx.SendBatch(ctx, &t.last).Close())
}
