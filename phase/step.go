package phase

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

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
	// leaseKept is set when failing the run could not free its lease.
	leaseKept bool
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
		defer timeCall(ctx)()
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
	callCtx, stop, err := x.lease.Keep(ctx, x.c.db, x.c.cfg.CallTimeout, x.rp, mark)
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
	if callCtx.Err() != nil {
		// Cut short before it began (the run's limit, or shutdown): the
		// call did not happen, and its mark goes with the lease.
		stop()
		if lost := x.lease.Err(); lost != nil {
			return nil, lost
		}
		x.callFailed = true
		return nil, x.storeError(ctx, fmt.Errorf("phase %s: call not made: %w", p.name, context.Cause(callCtx)))
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
	if errors.Is(err, keyrow.ErrLeaseLost) {
		// A fenced write matches the token and the recovery point the run
		// committed last. When freeing the lease finds the token still the
		// run's, it was the recovery point that did not match: the
		// database lost the run's last commit. The lease is freed, so the
		// next run resumes the key at once rather than when it expires.
		lost := &commitLostError{point: x.rp}
		if _, freed := x.c.release(ctx, x.row, lost.Error(), "", store.EndedIdle, false); freed {
			err, ev.Err = lost, lost
		}
	} else {
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
	var (
		pe   *PanicError
		lost *commitLostError
	)
	switch {
	case errors.As(err, &lost):
		ev.Kind = keyrow.EventLeaseLost
		x.c.observe(ctx, ev)
		log.Warn("the database lost this run's last commit; stopped without committing, lease freed", append(attrs, "err", err)...)
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
		log.Error("panic in user code; "+x.leaseState()+", recovery point kept", append(attrs, "where", pe.Where, "panic", pe.Value, "stack", string(pe.Stack))...)
	default:
		ev.Kind = keyrow.EventFailed
		x.c.observe(ctx, ev)
		level := slog.LevelError
		if transient(err) {
			// Retried by the next request or delivery: a warning, not an
			// alert.
			level = slog.LevelWarn
		}
		log.Log(ctx, level, "run stopped; "+x.leaseState()+", recovery point kept", append(attrs, "err", err)...)
	}
	return err
}

// release frees the lease, keeping the recovery point and putting the key
// on hold when hold is set, and returns cause. When the lease was no longer
// the run's, it frees nothing and returns an error wrapping
// keyrow.ErrLeaseLost instead: whatever the run met once another run had
// taken the key over (most often the rows that run already wrote) is not
// the key's failure, and the key is in progress elsewhere.
//
// A completer's run cut short because its process is stopping (its
// context cancelled, not timed out) is not the key's failure: it counts no
// attempt towards giving up, and another completer resumes the key at
// once, without waiting for it to be idle for StuckAfter; but a key cut
// in the middle of a call whose outcome is unknown (put on hold) waits
// StuckAfter before its reconciliation, as after a client's run.
func (x *execution[Req, State]) release(ctx context.Context, cause error, hold keyrow.Hold) error {
	end := failedBy(x.byCompleter)
	if x.byCompleter && errors.Is(ctx.Err(), context.Canceled) {
		end = store.EndedIdle
		if hold == "" {
			end = store.EndedCut
		}
	}
	lost, freed := x.c.release(ctx, x.row, cause.Error(), hold, end, x.callFailed)
	if lost {
		x.lease.MarkLost()
		return fmt.Errorf("%w (the run, taken over, then failed: %v)", keyrow.ErrLeaseLost, cause)
	}
	x.leaseKept = !freed
	return cause
}

// failedBy is how a failed run ends for the completer: counted when the
// run was the completer's own.
func failedBy(byCompleter bool) store.Ending {
	if byCompleter {
		return store.EndedFailed
	}
	return store.EndedIdle
}

// leaseState says, for a log, whether fail freed the run's lease: when the
// store could not be reached, the lease is kept until it expires.
func (x *execution[Req, State]) leaseState() string {
	if x.leaseKept {
		return "lease not freed (the key resumes when it expires)"
	}
	return "lease freed"
}

// transient reports whether err says a later attempt may succeed: the
// store or a lookup is down (ErrUnavailable), the run hit its time limit,
// or a provider asked to be called again later (an error with a method
// RetryAfter() time.Duration, such as a 503 or 429 with Retry-After, or a
// method Timeout() bool that returns true).
func transient(err error) bool {
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRunTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ra interface{ RetryAfter() time.Duration }
	var to interface{ Timeout() bool }
	return errors.As(err, &ra) || (errors.As(err, &to) && to.Timeout())
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
