package phase

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
)

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

// OutcomeKind says what a run found its key in, and so what it did. Its
// value is the name metrics and logs use; a refused run reports the event
// of the same name (keyrow.EventInFlight, EventOnHold, EventElsewhere,
// EventMismatch).
type OutcomeKind string

// The kinds of Outcome. New and Resumed runs executed phases; the others did
// nothing.
const (
	// OutcomeNew: the key was new and the run ran it to its response.
	OutcomeNew OutcomeKind = "new"
	// OutcomeResumed: the key was unfinished and free; the run continued it
	// after its last committed phase to its response.
	OutcomeResumed OutcomeKind = "resumed"
	// OutcomeReplayed: the key was finished; Response is its stored
	// response.
	OutcomeReplayed OutcomeKind = "replayed"
	// OutcomeInFlight: another run holds the key's lease.
	OutcomeInFlight OutcomeKind = "in_flight"
	// OutcomeMismatch: the key was first used with another request.
	OutcomeMismatch OutcomeKind = "mismatch"
	// OutcomeOnHold: the key is on hold (Outcome.Hold says why).
	OutcomeOnHold OutcomeKind = "on_hold"
	// OutcomeElsewhere: the key is unfinished under a definition of the
	// workflow that this process neither runs nor adopts, or at a
	// recovery point the adopting workflow cannot place; Definition names
	// it. Nothing was run: a process that runs that definition finishes
	// the key.
	OutcomeElsewhere OutcomeKind = "elsewhere"
)

// Outcome is the result of running a key.
type Outcome struct {
	Kind OutcomeKind
	// Response is the key's final response when it is finished (by this
	// run, or earlier for a replay).
	Response *keyrow.Response
	// RetryAfter is how long a client should wait before retrying a key in
	// progress or on hold.
	RetryAfter time.Duration
	// Hold says why a key on hold waits.
	Hold keyrow.Hold
	// Definition is the definition the key started under, for
	// OutcomeElsewhere.
	Definition string
}

// Run runs req under the key (tenant, key): it takes the key's lease with one
// statement, then replays, refuses, or runs the workflow from its stored
// recovery point. w must be registered with c.
//
// Errors: ErrNotRegistered; an error wrapping keyrow.ErrInvalidTenant,
// keyrow.ErrKeyInvalid or ErrInvalidRequest for a request that can never be
// stored; ErrStopped; ErrUnavailable (the store is unreachable or was lost:
// safe to retry); ErrTransactionPooler (see Client.Check); ErrRunTimeout;
// ErrCrash (an injected crash; the lease is kept); keyrow.ErrLeaseLost
// (another run took the key over); ErrOutcomeUnknown; a *PanicError; or the
// error of a failed phase. In every error case the recovery point of the
// last committed phase is kept and nothing is stored as the response.
//
// The request's fingerprint is taken over its JSON encoding (see
// keyrow.RequestFingerprint). The HTTP handler fingerprints the request as
// its client sent it instead, so that a change to Req cannot change it.
func (w *Workflow[Req, State]) Run(ctx context.Context, c *Client, tenant, key string, req Req) (*Outcome, error) {
	return w.runAs(ctx, c, tenant, key, req, nil)
}

// runAs is Run with the fingerprint of the request as sent, when there is
// one.
func (w *Workflow[Req, State]) runAs(ctx context.Context, c *Client, tenant, key string, req Req, fp *[32]byte) (*Outcome, error) {
	if len(c.hooks.runs) == 0 {
		var info RunInfo
		info.Tenant, info.Key = tenant, key
		return w.run(ctx, c, &info, req, fp)
	}
	info := &RunInfo{Workflow: w.name, Tenant: tenant, Key: key}
	return c.throughRun(ctx, info, func(ctx context.Context) (*Outcome, error) { return w.run(ctx, c, info, req, fp) })
}

// run is Run inside the client's run wrappers; it fills in info. Each step
// does one job: request checks what the key will store, admit lets the run
// in, acquire takes the key or answers without running, and start runs it.
func (w *Workflow[Req, State]) run(ctx context.Context, c *Client, info *RunInfo, req Req, sent *[32]byte) (*Outcome, error) {
	if err := c.registered(w); err != nil {
		return nil, err
	}
	kreq, err := w.request(c, info.Tenant, info.Key, req, sent)
	if err != nil {
		return nil, err
	}
	ctx, cancel, stop, err := c.admit(ctx, w.name, info.Tenant, info.Key)
	if err != nil {
		return nil, err
	}
	defer c.leave(cancel, stop)
	// Known once admit has checked the pool.
	kreq.Distributed = c.distributed.Load()
	taken, out, err := w.acquire(ctx, c, info, &kreq)
	if out != nil || err != nil {
		return out, err
	}
	return w.start(ctx, c, info, taken, req, kreq.Params)
}

// request checks that req can be stored under (tenant, key) and returns
// what taking the key stores: req's JSON, and the fingerprint of the
// request as sent, or else of that JSON.
func (w *Workflow[Req, State]) request(c *Client, tenant, key string, req Req, sent *[32]byte) (store.Request, error) {
	if err := keyrow.CheckTenant(tenant); err != nil {
		return store.Request{}, err
	}
	if err := keyrow.CheckKey(key); err != nil {
		return store.Request{}, err
	}
	var params []byte
	if err := protect("encoding the request", "", func() (err error) {
		params, err = json.Marshal(req)
		return err
	}); err != nil {
		return store.Request{}, fmt.Errorf("phase: encode request: %w", err)
	}
	if hasNUL(params) {
		return store.Request{}, fmt.Errorf("%w: a string in the request holds a NUL character (\\u0000)", ErrInvalidRequest)
	}
	var fp [32]byte
	if sent != nil {
		fp = *sent
	} else {
		var err error
		if fp, err = keyrow.RequestFingerprint("", "application/json", params); err != nil {
			return store.Request{}, fmt.Errorf("phase: fingerprint request: %w", err)
		}
	}
	return store.Request{Tenant: tenant, Key: key, Workflow: w.name, Definition: w.definition,
		Fingerprint: fp, Params: params, TTL: c.cfg.LeaseTTL,
		Retention: cmp.Or(w.store.retention, c.cfg.Reaper.Retention)}, nil
}

// admit lets a run in unless the client is stopping, bounds it by
// RunTimeout and by Stop giving up on it, and checks the pool (once per
// client); leave, given cancel and stop, ends the run.
func (c *Client) admit(ctx context.Context, workflow, tenant, key string) (_ context.Context, cancel context.CancelFunc, stop func() bool, err error) {
	if !c.enter() {
		return nil, nil, nil, ErrStopped
	}
	ctx, cancel, stop = c.bound(ctx)
	if err := c.ready(ctx); err != nil {
		if !errors.Is(err, ErrTransactionPooler) {
			err = c.acquireFailed(ctx, workflow, tenant, key, err)
		}
		c.leave(cancel, stop)
		return nil, nil, nil, err
	}
	return ctx, cancel, stop, nil
}

// leave ends a run that admit let in.
func (c *Client) leave(cancel context.CancelFunc, stop func() bool) {
	stop()
	cancel()
	c.inflight.Done()
}

// taken is a key whose lease a run took.
type taken struct {
	row *store.Row
	// resumed is set for a key that was unfinished; rerouted for one that
	// runs under the definition it started with, another of the workflow's.
	resumed, rerouted bool
}

// acquire takes the key's lease with one statement, or returns the outcome
// of a run that runs nothing (a key that may be resumed is read by one
// statement and taken over by a second). A key is looked up at most twice
// more: under the fingerprint keys stored before definitions hold, and
// under the definition it started with. A key another run holds is waited
// for, up to WaitForInFlight.
func (w *Workflow[Req, State]) acquire(ctx context.Context, c *Client, info *RunInfo, kreq *store.Request) (taken, *Outcome, error) {
	legacyTried, rerouted := false, false
	var waitUntil time.Time
	if c.cfg.WaitForInFlight > 0 {
		waitUntil = time.Now().Add(c.cfg.WaitForInFlight)
	}
	pause := 10 * time.Millisecond
	for {
		kind, row, err := store.Acquire(ctx, c.pool, *kreq)
		if err != nil {
			return taken{}, nil, c.acquireFailed(ctx, w.name, kreq.Tenant, kreq.Key, err)
		}
		info.RecoveryPoint = row.RecoveryPoint
		ev := keyrow.Event{Workflow: w.name, Tenant: kreq.Tenant, Key: kreq.Key, RecoveryPoint: row.RecoveryPoint}
		switch found := outcomeOf(kind); found {
		case OutcomeNew, OutcomeResumed:
			info.Attempt = row.Attempts
			return taken{row: row, resumed: found == OutcomeResumed, rerouted: rerouted}, nil, nil
		case OutcomeReplayed:
			ev.Status = row.Response.Status
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found, Response: w.store.replayed(row.Response)}), nil
		case OutcomeMismatch:
			if !legacyTried {
				// The key may hold the earlier kind of fingerprint, of its
				// workflow's name and the re-encoded request.
				legacyTried = true
				if legacy, err := keyrow.Fingerprint(row.Workflow, kreq.Params); err == nil && legacy != kreq.Fingerprint {
					kreq.Fingerprint = legacy
					continue
				}
			}
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found}), nil
		case OutcomeElsewhere:
			rt, ok := c.routes[defKey{row.Workflow, row.Definition}]
			switch {
			case ok && rt.w.Name() == w.name && !rerouted:
				// Another definition of this workflow that this process
				// runs or adopts: take the key under it.
				rerouted = true
				kreq.Workflow, kreq.Definition = row.Workflow, row.Definition
				continue
			case row.Workflow != w.name && (!ok || rt.w.Name() != w.name):
				// Another workflow's key, which this one does not adopt.
				return taken{}, c.refuse(ctx, ev, &Outcome{Kind: OutcomeMismatch}), nil
			}
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found, Definition: row.Definition, RetryAfter: lockttl.RetryAfter(0)}), nil
		case OutcomeOnHold:
			ev.Hold = row.Hold
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found, Hold: row.Hold, RetryAfter: lockttl.RetryAfter(0)}), nil
		case OutcomeInFlight:
			if left := time.Until(waitUntil); left > 0 {
				t := time.NewTimer(min(pause, left, row.LeaseLeft))
				select {
				case <-ctx.Done():
					t.Stop()
					return taken{}, nil, c.acquireFailed(ctx, w.name, kreq.Tenant, kreq.Key, ctx.Err())
				case <-t.C:
				}
				pause = min(2*pause, 500*time.Millisecond)
				continue
			}
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found, RetryAfter: lockttl.RetryAfter(row.LeaseLeft)}), nil
		default:
			return taken{}, nil, fmt.Errorf("phase: acquire: the store found the key %v, which this release does not know", kind)
		}
	}
}

// start runs a key the run took: the workflow's phases after its recovery
// point with req, or, for a key rerouted to the definition it started
// with, that definition's phases with the stored request.
func (w *Workflow[Req, State]) start(ctx context.Context, c *Client, info *RunInfo, k taken, req Req, params []byte) (*Outcome, error) {
	row := k.row
	var (
		resp *keyrow.Response
		err  error
	)
	if k.rerouted {
		if row.Params == nil {
			row.Params = params
		}
		rt := c.routes[defKey{row.Workflow, row.Definition}]
		resp, err = rt.w.resume(ctx, c, row, rt, false)
		if errors.Is(err, ErrDefinitionElsewhere) {
			return &Outcome{Kind: OutcomeElsewhere, Definition: row.Definition, RetryAfter: lockttl.RetryAfter(0)}, nil
		}
	} else {
		ev := keyrow.Event{Kind: keyrow.EventNew, Workflow: w.name, Tenant: info.Tenant, Key: info.Key, RecoveryPoint: row.RecoveryPoint}
		if k.resumed {
			ev.Kind = keyrow.EventResumed
		}
		c.observe(ctx, ev)
		row.Params = params
		in := &Input[Req, State]{Req: req, Tenant: info.Tenant, Key: info.Key, ID: row.ID, Attempt: row.Attempts,
			Resumed: k.resumed, downstreamOf: c.downstreamOf(row)}
		resp, err = w.execute(ctx, c, in, row, false)
	}
	if err != nil {
		return nil, err
	}
	out := &Outcome{Kind: OutcomeNew, Response: resp}
	if k.resumed {
		out.Kind = OutcomeResumed
	}
	return out, nil
}

// outcomeOf names what the store found when a run took a key: the one place
// the store's outcomes map to those a user sees.
func outcomeOf(found store.Outcome) OutcomeKind {
	switch found {
	case store.New:
		return OutcomeNew
	case store.Resumed:
		return OutcomeResumed
	case store.Replay:
		return OutcomeReplayed
	case store.Held:
		return OutcomeInFlight
	case store.Mismatch:
		return OutcomeMismatch
	case store.Parked:
		return OutcomeOnHold
	case store.Elsewhere:
		return OutcomeElsewhere
	}
	return ""
}

// refusedEvents are the events of the outcomes in which a run ran nothing,
// each spelled as its outcome.
var refusedEvents = map[OutcomeKind]keyrow.EventKind{
	OutcomeReplayed:  keyrow.EventReplayed,
	OutcomeInFlight:  keyrow.EventInFlight,
	OutcomeOnHold:    keyrow.EventOnHold,
	OutcomeElsewhere: keyrow.EventElsewhere,
	OutcomeMismatch:  keyrow.EventMismatch,
}

// refuse ends a run that ran nothing with out, reporting ev as the event of
// out's kind.
func (c *Client) refuse(ctx context.Context, ev keyrow.Event, out *Outcome) *Outcome {
	ev.Kind = refusedEvents[out.Kind]
	c.observe(ctx, ev)
	return out
}

// acquireFailed classifies an error of taking the lease. Nothing was done.
func (c *Client) acquireFailed(ctx context.Context, workflow, tenant, key string, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrRunTimeout, err)
	case storeDown(err) || ctx.Err() != nil:
		c.cfg.Logger.Warn("idempotency key store unavailable", "workflow", workflow, "tenant", tenant, "key", key, "err", err)
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case preparedStatementLost(err):
		err = fmt.Errorf("%w: %w", ErrTransactionPooler, err)
	}
	c.cfg.Logger.Error("taking the key's lease failed", "workflow", workflow, "tenant", tenant, "key", key, "err", err)
	return fmt.Errorf("phase: acquire: %w", err)
}

// runContext bounds a run by RunTimeout and by Stop giving up on it.
func (c *Client) runContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel, stop := c.bound(ctx)
	return ctx, func() {
		stop()
		cancel()
	}
}

// bound returns ctx bounded by RunTimeout and cancelled when Stop gives up
// on runs; stop undoes the latter.
func (c *Client) bound(ctx context.Context) (_ context.Context, cancel context.CancelFunc, stop func() bool) {
	if c.cfg.RunTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RunTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	return ctx, cancel, context.AfterFunc(c.halt, cancel)
}

// downstreamOf is what the row's downstream keys are made of.
func (c *Client) downstreamOf(row *store.Row) downstreamOf {
	return downstreamOf{prefix: c.cfg.DownstreamKeyPrefix, tenant: row.Tenant, key: row.Key, fingerprint: row.Fingerprint}
}

func (w *Workflow[Req, State]) adopted() []adoption { return w.adoptions }

func (w *Workflow[Req, State]) retention() time.Duration { return w.store.retention }

// resume continues a key whose lease the caller holds, from its stored
// request: one the completer claimed, or one a request found under another
// definition. rt says how w runs the key's definition; byCompleter is set
// for the completer's runs.
func (w *Workflow[Req, State]) resume(ctx context.Context, c *Client, row *store.Row, rt route, byCompleter bool) (*keyrow.Response, error) {
	ctx, cancel := c.runContext(ctx)
	defer cancel()
	run := &Input[Req, State]{Tenant: row.Tenant, Key: row.Key, ID: row.ID, Attempt: row.Attempts,
		Resumed: true, downstreamOf: c.downstreamOf(row)}
	if err := json.Unmarshal(row.Params, &run.Req); err != nil {
		err = fmt.Errorf("phase: decode stored request: %w", err)
		c.release(ctx, row, err.Error(), row.Hold, byCompleter, false)
		return nil, err
	}
	if rt.adopted {
		if err := w.adopt(ctx, c, row, rt.moves); err != nil {
			return nil, err
		}
	}
	c.observe(ctx, keyrow.Event{Kind: keyrow.EventResumed, Workflow: w.name, Tenant: row.Tenant, Key: row.Key, RecoveryPoint: row.RecoveryPoint})
	return w.execute(ctx, c, run, row, byCompleter)
}

// adopt moves a key of an adopted definition, whose lease the caller holds,
// to w's definition: its recovery point through moves, in one fenced write.
// A key at a point w cannot place is handed back untouched, with
// ErrDefinitionElsewhere, for a process that runs its definition.
func (w *Workflow[Req, State]) adopt(ctx context.Context, c *Client, row *store.Row, moves map[string]string) error {
	from, point := row.Definition, row.RecoveryPoint
	if to, ok := moves[point]; ok {
		point = to
	}
	if _, err := w.next(point); err != nil {
		err = fmt.Errorf("%w: definition %s at recovery point %q", ErrDefinitionElsewhere, from, row.RecoveryPoint)
		c.release(ctx, row, err.Error(), row.Hold, false, false)
		c.cfg.Logger.Warn("key left for a process that runs its definition", "workflow", row.Workflow,
			"tenant", row.Tenant, "key", row.Key, "definition", from, "recovery_point", row.RecoveryPoint)
		return err
	}
	if err := store.Adopt(ctx, c.pool, row.Holder(), w.definition, point); err != nil {
		if !errors.Is(err, keyrow.ErrLeaseLost) {
			c.release(ctx, row, err.Error(), row.Hold, false, false)
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	c.cfg.Logger.Info("key adopted by a newer definition", "workflow", w.name, "tenant", row.Tenant, "key", row.Key,
		"from_definition", from, "definition", w.definition, "from_recovery_point", row.RecoveryPoint, "recovery_point", point)
	row.Definition, row.RecoveryPoint = w.definition, point
	return nil
}

// execute runs the phases after row's recovery point while holding its lease.
func (w *Workflow[Req, State]) execute(ctx context.Context, c *Client, in *Input[Req, State], row *store.Row, byCompleter bool) (*keyrow.Response, error) {
	x := &execution[Req, State]{w: w, c: c, run: in, row: row, byCompleter: byCompleter,
		lease: store.NewLease(row.Holder(), c.cfg.LeaseTTL), rp: row.RecoveryPoint}
	x.lease.Proven(row.TakenAt)
	if len(row.State) > 0 && !bytes.Equal(row.State, []byte("null")) {
		if err := json.Unmarshal(row.State, &in.State); err != nil {
			return nil, x.fail(ctx, fmt.Errorf("phase: decode stored state: %w", err))
		}
		x.committed = row.State
	}
	start, err := w.next(row.RecoveryPoint)
	if err != nil {
		return nil, x.fail(ctx, err)
	}
	if row.Hold == keyrow.HoldUnknown || row.CallPending != "" {
		// A call that is not safe to repeat may have been sent by a run
		// that then stopped: find out what became of it first.
		return x.reconcile(ctx, start)
	}
	return x.from(ctx, start, nil)
}

// errForOperator ends a run that left its key on hold for an operator: only
// a person can tell whether the call happened.
var errForOperator = errors.New("an operator must resolve it")

// execution is one run's progress through a workflow.
type execution[Req, State any] struct {
	w     *Workflow[Req, State]
	c     *Client
	run   *Input[Req, State]
	row   *store.Row
	lease *store.Lease
	// byCompleter is set for the completer's runs, whose failures count
	// towards giving up on the key.
	byCompleter bool
	// committed is the state as last committed, restored when a phase
	// fails; nil for the zero State, before a phase committed one.
	committed []byte
	rp        string
	// callFailed is set when a foreign call failed for sure: its provider
	// refused it, so it did not happen.
	callFailed bool
	// next is the first phase that applies after the last one committed,
	// found before its commit (see settle); -1 before a phase commits.
	next int
	// held, when set, is the connection on which the last phase's
	// transaction is open, its commit (heldBack) held back to travel with
	// the next phase's first statement (see commitOnce). priorAt is that
	// phase's index and priorRec its record, to run it again if the commit
	// fails; heldBegan, heldStarted and heldState are what committedAt
	// needs once the commit is known.
	held                   *pgxpool.Conn
	heldBack               priorCommit
	priorAt                int
	priorRec               recordFn[Req, State]
	heldBegan, heldStarted time.Time
	heldState              []byte
	// priorRetries counts the runs of phases again after their held-back
	// commit failed with a serialization failure or deadlock.
	priorRetries int
	// started is when the phase running began.
	started time.Time
}

// from runs the applicable phases from index i on, until one responds or
// fails. A non-nil rec is the reconciled outcome of the foreign phase at i,
// recorded instead of making its call.
func (x *execution[Req, State]) from(ctx context.Context, i int, rec recordFn[Req, State]) (*keyrow.Response, error) {
	if rec == nil {
		var err error
		if i, err = x.applicable(i); err != nil {
			return nil, x.fail(ctx, err)
		}
	}
	for {
		if i == len(x.w.phases) {
			return nil, x.fail(ctx, ErrNoResponse)
		}
		x.next = -1
		resp, err := x.throughPhase(ctx, i, rec)
		if prior := asPriorCommit(err); prior != nil {
			if i, rec, err = x.again(ctx, prior.err); err != nil {
				return nil, x.fail(ctx, err)
			}
			continue
		}
		if err != nil || resp != nil {
			return resp, err
		}
		if x.next < 0 {
			return nil, x.fail(ctx, fmt.Errorf("phase %s: a hook ended the phase without its commit or an error", x.w.phases[i].name))
		}
		i, rec = x.next, nil
	}
}

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

// applicable returns the index of the first phase from i on that applies to
// this run (its When predicate holds), or len(phases) when none does.
func (x *execution[Req, State]) applicable(i int) (int, error) {
	for ; i < len(x.w.phases); i++ {
		p := &x.w.phases[i]
		if p.when == nil {
			return i, nil
		}
		var ok bool
		if err := protect("When of phase", p.name, func() error {
			ok = p.when(x.run)
			return nil
		}); err != nil {
			return 0, err
		}
		if ok {
			return i, nil
		}
	}
	return i, nil
}

// reconcile resolves the unknown outcome of the first applicable phase at
// or after i, a foreign phase, and goes on from there.
func (x *execution[Req, State]) reconcile(ctx context.Context, i int) (*keyrow.Response, error) {
	i, err := x.applicable(i)
	if err != nil {
		return nil, x.fail(ctx, err)
	}
	// An operator's resolution, when there is one, decides instead.
	if resp, done, err := x.resolved(ctx, i); done {
		return resp, err
	}
	switch {
	case x.row.CallPending != "" && (i == len(x.w.phases) || x.w.phases[i].identity() != x.row.CallPending):
		return nil, x.release(ctx, fmt.Errorf("%w: the call of phase %q may have been sent, and it is not the next phase to run: %w",
			ErrOutcomeUnknown, x.row.CallPending, errForOperator), keyrow.HoldUnknown)
	case i == len(x.w.phases) || x.w.phases[i].foreign == nil || x.w.phases[i].foreign.reconcile == nil:
		// Nobody can tell what happened: keep the hold for an operator.
		return nil, x.release(ctx, fmt.Errorf("%w, and the phase has no reconcile function: %w",
			ErrOutcomeUnknown, errForOperator), keyrow.HoldUnknown)
	}
	p := &x.w.phases[i]
	x.run.phase = p.identity()
	var (
		rec recordFn[Req, State]
		res Verdict
	)
	err = x.c.throughCall(ctx, x.phaseInfo(i, true), func(ctx context.Context) error {
		return protect("reconcile of phase", p.name, func() (err error) {
			rec, res, err = p.foreign.reconcile(ctx, x.run)
			return err
		})
	})
	var pe *PanicError
	switch {
	case err != nil:
		// Whatever went wrong, the call's outcome is still unknown: the key
		// stays on hold, so the call is never repeated blindly.
		if errors.As(err, &pe) {
			x.c.cfg.Logger.Error("panic in reconcile; the key stays on hold", "workflow", x.w.name, "tenant", x.run.Tenant,
				"key", x.run.Key, "phase", p.name, "panic", pe.Value, "stack", string(pe.Stack))
		}
		return nil, x.release(ctx, fmt.Errorf("phase: reconcile %s: %w", p.name, err), keyrow.HoldUnknown)
	case res == NotHappened:
		// The call provably did not happen: run the phase normally, which
		// clears the hold when it commits.
		return x.from(ctx, i, nil)
	case res != Happened:
		return nil, x.release(ctx, errors.New("phase: reconciliation pending"), keyrow.HoldUnknown)
	}
	return x.from(ctx, i, rec)
}

// throughPhase runs the phase at index i through the client's phase
// wrappers.
func (x *execution[Req, State]) throughPhase(ctx context.Context, i int, rec recordFn[Req, State]) (*keyrow.Response, error) {
	if len(x.c.hooks.phases) == 0 {
		return x.phase(ctx, i, rec)
	}
	var resp *keyrow.Response
	err := x.c.throughPhase(ctx, x.phaseInfo(i, false), func(ctx context.Context) (err error) {
		resp, err = x.phase(ctx, i, rec)
		return err
	})
	return resp, err
}

// throughCall makes the call of the foreign phase at index i through the
// client's call wrappers.
func (x *execution[Req, State]) throughCall(ctx context.Context, i int) (recordFn[Req, State], error) {
	p := &x.w.phases[i]
	if len(x.c.hooks.calls) == 0 {
		return x.call(ctx, p)
	}
	// Declared here, not as named results, so that only runs with call
	// wrappers pay for the closure's captures.
	var rec recordFn[Req, State]
	err := x.c.throughCall(ctx, x.phaseInfo(i, false), func(ctx context.Context) (err error) {
		rec, err = x.call(ctx, p)
		return err
	})
	return rec, err
}

// phaseInfo describes the phase at index i to the client's wrappers.
func (x *execution[Req, State]) phaseInfo(i int, reconcile bool) *PhaseInfo {
	p := &x.w.phases[i]
	info := &PhaseInfo{Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key, Phase: p.name, Reconcile: reconcile}
	if p.foreign != nil {
		info.DownstreamKey = x.run.downstreamBase() + p.identity()
	}
	return info
}

// phase runs the phase at index i. For a foreign phase, a non-nil rec is the
// reconciled outcome to record instead of making the call.
func (x *execution[Req, State]) phase(ctx context.Context, i int, rec recordFn[Req, State]) (*keyrow.Response, error) {
	p := &x.w.phases[i]
	x.run.phase = p.identity()
	x.started = time.Now()
	body := p.local
	if p.foreign != nil {
		if rec == nil {
			var err error
			if rec, err = x.throughCall(ctx, i); err != nil {
				return nil, x.fail(ctx, err)
			}
		}
		body = LocalFunc[Req, State](rec)
	}
	res, err := x.commit(ctx, i, body, rec)
	switch {
	case asPriorCommit(err) != nil:
		// The phase before failed to commit, not this one: from runs it again.
		return nil, err
	case err != nil:
		return nil, x.fail(ctx, err)
	case res.response != nil:
		ev := keyrow.Event{Kind: keyrow.EventFinished, Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key, Phase: p.name,
			Duration: time.Since(x.started), RecoveryPoint: keyrow.Finished, Status: res.response.Status}
		x.c.observe(ctx, ev)
		if x.debugging(ctx) {
			x.debug(ctx, "key finished", "recovery_point", keyrow.Finished, "status", res.response.Status)
		}
		if err := x.inject(ctx, Point{p.name, BeforeResponse}); err != nil {
			return nil, x.fail(ctx, err)
		}
		return res.response, nil
	}
	return nil, nil
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

// call makes a foreign phase's call outside any transaction. Before it, the
// run makes sure by the database clock that the key is still its own: the
// commit it sent just before proves it (store.ProofWindow), or else it renews
// its lease. While the call runs, the lease is renewed every third of the
// TTL, until the call returns or its time limit passes.
func (x *execution[Req, State]) call(ctx context.Context, p *Phase[Req, State]) (rec recordFn[Req, State], err error) {
	if err := x.inject(ctx, Point{p.name, BeforeCall}); err != nil {
		return nil, err
	}
	// The renewals stop with the call's limit: a call that outlives it no
	// longer keeps the key, which expires and resumes elsewhere.
	// A call that is not safe to repeat is marked as possibly under way
	// first, so that a run after a crash reconciles it. The mark is made
	// right before the call, not with the commit before it, so that a run
	// that stalls or stops in between leaves nothing to reconcile.
	var mark string
	if !p.foreign.repeatable {
		mark = p.identity()
	}
	callCtx, stop, err := x.lease.Keep(ctx, x.c.pool, x.c.cfg.CallTimeout, mark)
	if err != nil {
		if errors.Is(err, keyrow.ErrLeaseLost) {
			return nil, err
		}
		return nil, x.storeError(ctx, fmt.Errorf("phase %s: renew lease before the call: %w", p.name, err))
	}
	defer stop()
	if err := x.inject(callCtx, Point{p.name, InCall}); err != nil {
		return nil, err
	}
	err = protect("foreign call of phase", p.name, func() (err error) {
		rec, err = p.foreign.call(callCtx, x.run)
		return err
	})
	// Whether the call was cut short must be read before stop cancels
	// callCtx.
	cut := callCtx.Err() != nil
	stop()
	if lost := x.lease.Err(); lost != nil {
		return nil, lost
	}
	var pe *PanicError
	switch {
	case err == nil:
	case errors.As(err, &pe):
		return nil, err
	case cut && !errors.Is(err, ErrOutcomeUnknown):
		// The call was cut short by its limit, the run's, or shutdown: it
		// may have reached the provider.
		return nil, MaybeHappened(fmt.Errorf("phase %s: call stopped: %w", p.name, err))
	default:
		x.callFailed = true
		return nil, fmt.Errorf("phase %s: %w", p.name, err)
	}
	if err := x.inject(ctx, Point{p.name, AfterCall}); err != nil {
		return nil, err
	}
	return rec, nil
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
	w, err := x.fencedWrite(p, res, state)
	if err != nil {
		return Result{}, x.endPrior(ctx, tx, err)
	}
	// Only an open, healthy transaction is held back: one the phase ended
	// on its own, or in which a statement failed, fails its commit now.
	if res.response == nil && tx.tx != nil && tx.err == nil && conn.Conn().PgConn().TxStatus() == 'T' && x.holdsBack(i, next) {
		x.heldBack = priorCommit{write: w, done: x,
			chain: !x.lease.Distributed && x.w.phases[next].isolation == p.isolation}
		x.heldBegan, x.heldStarted, x.heldState = began, x.started, state
		x.held, x.priorAt, x.priorRec, x.next = conn, i, rec, next
		kept = true
		return res, nil
	}
	if err := tx.commit(ctx, w); err != nil {
		if errors.Is(err, keyrow.ErrLeaseLost) {
			x.lease.MarkLost()
		}
		if errors.Is(err, keyrow.ErrLeaseLost) || asPriorCommit(err) != nil || tx.priorErr != nil {
			return Result{}, err
		}
		return Result{}, fmt.Errorf("phase %s: commit: %w", p.name, err)
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
// to p, or the finish with res's response.
func (x *execution[Req, State]) fencedWrite(p *Phase[Req, State], res Result, state []byte) (store.Write, error) {
	var (
		w   store.Write
		err error
	)
	if res.response != nil {
		w, err = x.lease.Finish(state, x.w.store.stored(*res.response))
	} else {
		w, err = x.lease.Advance(p.identity(), state)
	}
	if err != nil {
		return store.Write{}, fmt.Errorf("phase %s: %w", p.name, err)
	}
	return w, nil
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

// fail ends a run that met err, freeing the lease unless the run crashed or
// lost it, and returns err, or an error wrapping keyrow.ErrLeaseLost when
// freeing the lease showed that the run had been taken over.
func (x *execution[Req, State]) fail(ctx context.Context, err error) error {
	x.dropHeld(ctx)
	x.restoreState()
	ev := keyrow.Event{Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key, RecoveryPoint: x.rp, Phase: x.run.phase, Err: err}
	log := x.c.cfg.Logger
	attrs := []any{"workflow", x.w.name, "tenant", x.run.Tenant, "key", x.run.Key, "recovery_point", x.rp, "phase", x.run.phase}
	if errors.Is(err, ErrCrash) {
		ev.Kind = keyrow.EventCrashed
		x.c.observe(ctx, ev)
		log.Warn("run crashed by fault injection; lease kept", attrs...)
		return err
	}
	if !errors.Is(err, keyrow.ErrLeaseLost) {
		hold := keyrow.Hold("")
		if errors.Is(err, ErrOutcomeUnknown) {
			hold = keyrow.HoldUnknown
			if i, ok := x.w.index[x.run.phase]; ok && x.w.phases[i].foreign != nil && x.w.phases[i].foreign.repeatable {
				hold = ""
			}
			attrs = append(attrs, "hold", hold)
		}
		err = x.release(ctx, err, hold)
		ev.Err = err
	}
	var pe *PanicError
	switch {
	case errors.Is(err, keyrow.ErrLeaseLost):
		ev.Kind = keyrow.EventLeaseLost
		x.c.observe(ctx, ev)
		log.Warn("lease lost; stopped without committing", append(attrs, "err", err)...)
	case errors.Is(err, ErrOutcomeUnknown):
		ev.Kind = keyrow.EventUnknown
		x.c.observe(ctx, ev)
		log.Warn("foreign call outcome unknown", append(attrs, "err", err)...)
	case errors.As(err, &pe):
		ev.Kind = keyrow.EventFailed
		x.c.observe(ctx, ev)
		log.Error("panic in user code; lease freed, recovery point kept", append(attrs, "where", pe.Where, "panic", pe.Value, "stack", string(pe.Stack))...)
	default:
		ev.Kind = keyrow.EventFailed
		x.c.observe(ctx, ev)
		level := slog.LevelError
		if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRunTimeout) {
			level = slog.LevelWarn
		}
		log.Log(ctx, level, "run stopped; lease freed, recovery point kept", append(attrs, "err", err)...)
	}
	return err
}

// release frees the lease, keeping the recovery point and putting the key
// on hold when hold is set, and returns cause. When the lease was no longer
// the run's, it frees nothing and returns an error wrapping
// keyrow.ErrLeaseLost instead: whatever the run met once another run had
// taken the key over (most often the rows that run already wrote) is not
// the key's failure, and the key is in progress elsewhere.
func (x *execution[Req, State]) release(ctx context.Context, cause error, hold keyrow.Hold) error {
	if x.c.release(ctx, x.row, cause.Error(), hold, x.byCompleter, x.callFailed) {
		x.lease.MarkLost()
		return fmt.Errorf("%w (the run, taken over, then failed: %v)", keyrow.ErrLeaseLost, cause)
	}
	return cause
}

// debugging reports whether debug logs; callers ask first, so that a run
// that does not log builds no arguments.
func (x *execution[Req, State]) debugging(ctx context.Context) bool {
	return x.c.cfg.Logger.Enabled(ctx, slog.LevelDebug)
}

func (x *execution[Req, State]) debug(ctx context.Context, msg string, args ...any) {
	x.c.cfg.Logger.Debug(msg, append(args, "workflow", x.w.name, "tenant", x.run.Tenant, "key", x.run.Key)...)
}

func (x *execution[Req, State]) inject(ctx context.Context, at Point) error {
	if inj, _ := ctx.Value(injectorKey{}).(Injector); inj != nil {
		return inj.Inject(ctx, at)
	}
	for _, inj := range x.c.hooks.injectors {
		if err := inj.Inject(ctx, at); err != nil {
			return err
		}
	}
	return nil
}

// hasNUL reports whether encoding/json output holds an escaped NUL
// character, which jsonb refuses (SQLSTATE 22P05). encoding/json escapes
// every control character, so a NUL can only appear as \u0000, preceded by
// an odd number of backslashes.
func hasNUL(js []byte) bool {
	for i := bytes.Index(js, []byte(`\u0000`)); i >= 0; {
		n := 0
		for j := i - 1; j >= 0 && js[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return true
		}
		next := bytes.Index(js[i+1:], []byte(`\u0000`))
		if next < 0 {
			return false
		}
		i += 1 + next
	}
	return false
}
