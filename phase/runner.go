package phase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
	"github.com/atomicphase/atomicphase/recovery"
)

// Defaults for Config's zero values.
const (
	// DefaultMaxPhaseRetries is how many times a phase is run again after a
	// serialization failure or deadlock before the run fails.
	DefaultMaxPhaseRetries = 5
	// DefaultRetryBackoff is the first pause before such a retry; it doubles,
	// with jitter, on each further one.
	DefaultRetryBackoff = 5 * time.Millisecond
	// DefaultDownstreamKeyPrefix starts every downstream idempotency key.
	DefaultDownstreamKeyPrefix = "atomicphase"
)

// ErrUnavailable is returned when the key store cannot be reached before the
// run took its lease. Nothing was done: the run fails closed, and the HTTP
// adapter answers 503.
var ErrUnavailable = errors.New("phase: idempotency key store unavailable")

// ErrNoResponse is returned when a workflow ran out of phases without any
// phase responding: a bug in the workflow, reported instead of committed.
var ErrNoResponse = errors.New("phase: workflow ended without a response")

// Config configures a Runner. Zero values mean the documented default.
type Config struct {
	// Pool is the database holding idempotency_keys and the workflows' own
	// tables. Required.
	Pool *pgxpool.Pool
	// LockTTL is the lease length (default lockttl.DefaultTTL). Every phase
	// commit renews it; a foreign call longer than a third of it renews it
	// while it runs.
	LockTTL time.Duration
	// MaxPhaseRetries bounds the re-runs of a phase after a serialization
	// failure or deadlock (default DefaultMaxPhaseRetries; negative: none).
	MaxPhaseRetries int
	// RetryBackoff is the first pause before such a re-run (default
	// DefaultRetryBackoff).
	RetryBackoff time.Duration
	// WaitForInFlight, when positive, makes a request whose key is held by
	// another live run wait up to this long for that run to finish and
	// replay its response, instead of answering a conflict at once. Off by
	// default.
	WaitForInFlight time.Duration
	// DownstreamKeyPrefix starts every downstream idempotency key (default
	// DefaultDownstreamKeyPrefix).
	DownstreamKeyPrefix string
	// Logger receives the runner's logs (default slog.Default()).
	Logger *slog.Logger
	// Observer, when set, receives every Event.
	Observer Observer
	// Injector, when set, is consulted at every fault point (see Point).
	// A context from WithInjector overrides it for one run.
	Injector Injector
}

func (c *Config) validate() error {
	if c.Pool == nil {
		return errors.New("phase: Config.Pool is required")
	}
	if c.LockTTL < 0 || c.RetryBackoff < 0 || c.WaitForInFlight < 0 {
		return errors.New("phase: Config durations must not be negative")
	}
	if c.LockTTL == 0 {
		c.LockTTL = lockttl.DefaultTTL
	}
	if c.LockTTL < time.Second {
		return fmt.Errorf("phase: Config.LockTTL %v is shorter than a second", c.LockTTL)
	}
	if c.MaxPhaseRetries == 0 {
		c.MaxPhaseRetries = DefaultMaxPhaseRetries
	}
	if c.MaxPhaseRetries < 0 {
		c.MaxPhaseRetries = 0
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.DownstreamKeyPrefix == "" {
		c.DownstreamKeyPrefix = DefaultDownstreamKeyPrefix
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Registered is a workflow a Runner can resume from its stored row. Every
// *Workflow is one.
type Registered interface {
	Name() string
	resume(ctx context.Context, rn *Runner, row *keyrow.Row) (*Outcome, error)
}

// Runner runs workflows under idempotency keys. It is safe for concurrent
// use; one Runner serves every request of a process.
type Runner struct {
	cfg       Config
	workflows map[string]Registered
}

// NewRunner returns a runner configured by cfg that can resume the given
// workflows (the completer needs them by name).
func NewRunner(cfg Config, workflows ...Registered) (*Runner, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rn := &Runner{cfg: cfg, workflows: make(map[string]Registered, len(workflows))}
	for _, w := range workflows {
		if _, dup := rn.workflows[w.Name()]; dup {
			return nil, fmt.Errorf("phase: workflow %q registered twice", w.Name())
		}
		rn.workflows[w.Name()] = w
	}
	return rn, nil
}

// Pool returns the runner's database pool.
func (rn *Runner) Pool() *pgxpool.Pool { return rn.cfg.Pool }

// LockTTL returns the lease length the runner uses.
func (rn *Runner) LockTTL() time.Duration { return rn.cfg.LockTTL }

// Resume continues the key in row, whose lease the caller already holds
// (row.LockToken), with its registered workflow: the completer's way to
// finish a key no client is waiting for. A key on hold for an unknown
// outcome is reconciled first. A workflow not registered with the runner
// gives recovery.ErrUnknownWorkflow.
func (rn *Runner) Resume(ctx context.Context, row *keyrow.Row) error {
	w, ok := rn.workflows[row.Workflow]
	if !ok {
		return fmt.Errorf("%w %q", recovery.ErrUnknownWorkflow, row.Workflow)
	}
	_, err := w.resume(ctx, rn, row)
	return err
}

// Outcome is the result of running a key.
type Outcome struct {
	// Kind says what the key was found in: New and Resumed runs executed
	// phases; Replay, Held, Mismatch and Parked did nothing.
	Kind keyrow.Outcome
	// Response is the key's final response when it is finished (by this
	// run, or earlier for a replay).
	Response *keyrow.Response
	// RetryAfter is the seconds a client should wait before retrying a Held
	// or Parked key.
	RetryAfter int
	// Hold says why a Parked key waits.
	Hold string
}

// Run runs req under the key (tenant, key): it takes the key's lease with one
// statement, then replays, refuses, or runs the workflow from its stored
// recovery point.
//
// Errors: ErrUnavailable (store unreachable; nothing done), ErrCrash (an
// injected crash; the lease is kept), keyrow.ErrLeaseLost (another run took
// the key over), ErrOutcomeUnknown, or the error of a failed phase. In every
// error case the recovery point of the last committed phase is kept and
// nothing is stored as the response.
func (w *Workflow[Req, State]) Run(ctx context.Context, rn *Runner, tenant, key string, req Req) (*Outcome, error) {
	params, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("phase: encode request: %w", err)
	}
	fp, err := keyrow.Fingerprint(w.name, params)
	if err != nil {
		return nil, fmt.Errorf("phase: fingerprint request: %w", err)
	}
	kreq := keyrow.Request{Tenant: tenant, Key: key, Workflow: w.name, Fingerprint: fp, Params: params, TTL: rn.cfg.LockTTL}
	log := rn.cfg.Logger.With("workflow", w.name, "tenant", tenant, "key", key)
	var waitUntil time.Time
	if rn.cfg.WaitForInFlight > 0 {
		waitUntil = time.Now().Add(rn.cfg.WaitForInFlight)
	}
	pause := 10 * time.Millisecond
	for {
		kind, row, err := keyrow.Acquire(ctx, rn.cfg.Pool, kreq)
		if err != nil {
			log.Warn("idempotency key store unavailable", "err", err)
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		ev := Event{Workflow: w.name, Tenant: tenant, Key: key, RecoveryPoint: row.RecoveryPoint}
		switch kind {
		case keyrow.Replay:
			ev.Kind, ev.Status = EventReplayed, row.Response.Status
			rn.observe(ev)
			return &Outcome{Kind: kind, Response: row.Response}, nil
		case keyrow.Mismatch:
			ev.Kind = EventMismatch
			rn.observe(ev)
			return &Outcome{Kind: kind}, nil
		case keyrow.Parked:
			ev.Kind = EventConflict
			rn.observe(ev)
			return &Outcome{Kind: kind, Hold: row.Hold, RetryAfter: lockttl.RetryAfter(0)}, nil
		case keyrow.Held:
			if left := time.Until(waitUntil); left > 0 {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(min(pause, left, row.LeaseLeft)):
				}
				pause = min(2*pause, 500*time.Millisecond)
				continue
			}
			ev.Kind = EventConflict
			rn.observe(ev)
			return &Outcome{Kind: kind, RetryAfter: lockttl.RetryAfter(row.LeaseLeft)}, nil
		}
		run := &Run[Req, State]{Req: req, Tenant: tenant, Key: key, ID: row.ID, Attempt: row.Attempts,
			Resumed: kind == keyrow.Resumed, prefix: rn.cfg.DownstreamKeyPrefix}
		if kind == keyrow.Resumed {
			if err := json.Unmarshal(row.State, &run.State); err != nil {
				return nil, rn.release(ctx, log, w.name, row, fmt.Errorf("phase: decode stored state: %w", err))
			}
			ev.Kind = EventResumed
		} else {
			ev.Kind = EventAcquired
		}
		rn.observe(ev)
		resp, err := w.execute(ctx, rn, log, run, row)
		if err != nil {
			return nil, err
		}
		return &Outcome{Kind: kind, Response: resp}, nil
	}
}

// resume continues a key claimed by the completer.
func (w *Workflow[Req, State]) resume(ctx context.Context, rn *Runner, row *keyrow.Row) (*Outcome, error) {
	log := rn.cfg.Logger.With("workflow", w.name, "tenant", row.Tenant, "key", row.Key)
	run := &Run[Req, State]{Tenant: row.Tenant, Key: row.Key, ID: row.ID, Attempt: row.Attempts,
		Resumed: true, prefix: rn.cfg.DownstreamKeyPrefix}
	if err := json.Unmarshal(row.Params, &run.Req); err != nil {
		return nil, rn.release(ctx, log, w.name, row, fmt.Errorf("phase: decode stored request: %w", err))
	}
	if err := json.Unmarshal(row.State, &run.State); err != nil {
		return nil, rn.release(ctx, log, w.name, row, fmt.Errorf("phase: decode stored state: %w", err))
	}
	rn.observe(Event{Kind: EventResumed, Workflow: w.name, Tenant: row.Tenant, Key: row.Key, RecoveryPoint: row.RecoveryPoint})
	resp, err := w.execute(ctx, rn, log, run, row)
	if err != nil {
		return nil, err
	}
	return &Outcome{Kind: keyrow.Resumed, Response: resp}, nil
}

// execute runs the phases after row's recovery point while holding its lease.
func (w *Workflow[Req, State]) execute(ctx context.Context, rn *Runner, log *slog.Logger, run *Run[Req, State], row *keyrow.Row) (*keyrow.Response, error) {
	lease := lockttl.New(row.ID, row.LockToken, rn.cfg.LockTTL)
	start, err := w.next(row.RecoveryPoint)
	if err != nil {
		return nil, rn.release(ctx, log, w.name, row, err)
	}
	committed := row.State
	if len(committed) == 0 {
		if committed, err = json.Marshal(run.State); err != nil {
			return nil, rn.release(ctx, log, w.name, row, fmt.Errorf("phase: encode state: %w", err))
		}
	}
	x := &execution[Req, State]{w: w, rn: rn, log: log, run: run, lease: lease, committed: committed, rp: row.RecoveryPoint}
	if row.Hold == keyrow.HoldUnknown {
		if resp, done, err := x.reconcile(ctx, start); err != nil || done {
			return resp, err
		}
	}
	for i := start; i < len(w.phases); i++ {
		p := &w.phases[i]
		if p.when != nil && !p.when(run) {
			continue
		}
		resp, err := x.phase(ctx, i, nil)
		if err != nil || resp != nil {
			return resp, err
		}
	}
	return nil, x.fail(ctx, ErrNoResponse)
}

// execution is one run's progress through a workflow.
type execution[Req, State any] struct {
	w     *Workflow[Req, State]
	rn    *Runner
	log   *slog.Logger
	run   *Run[Req, State]
	lease *lockttl.Lease
	// committed is the state as last committed, restored when a phase fails.
	committed []byte
	rp        string
}

// reconcile resolves the unknown outcome of the foreign phase at index i.
// done reports that the run ended (with resp or err).
func (x *execution[Req, State]) reconcile(ctx context.Context, i int) (resp *keyrow.Response, done bool, err error) {
	if i >= len(x.w.phases) || x.w.phases[i].foreign == nil || x.w.phases[i].foreign.reconcile == nil {
		// Nobody can tell what happened: keep the hold for an operator.
		return nil, true, x.release(ctx, errors.New("phase: outcome unknown and the phase has no reconcile function"), keyrow.HoldUnknown)
	}
	p := &x.w.phases[i]
	x.run.phase = p.name
	rec, res, err := p.foreign.reconcile(ctx, x.run)
	switch {
	case err != nil:
		return nil, true, x.release(ctx, fmt.Errorf("phase: reconcile %s: %w", p.name, err), keyrow.HoldUnknown)
	case res == Pending:
		return nil, true, x.release(ctx, errors.New("phase: reconciliation pending"), keyrow.HoldUnknown)
	case res == Retry:
		// The call provably did not happen: run the phase normally, which
		// clears the hold when it commits.
		return nil, false, nil
	}
	resp, err = x.phase(ctx, i, rec)
	if err != nil || resp != nil {
		return resp, true, err
	}
	for j := i + 1; j < len(x.w.phases); j++ {
		if q := &x.w.phases[j]; q.when == nil || q.when(x.run) {
			resp, err := x.phase(ctx, j, nil)
			if err != nil || resp != nil {
				return resp, true, err
			}
		}
	}
	return nil, true, x.fail(ctx, ErrNoResponse)
}

// phase runs the phase at index i. For a foreign phase, a non-nil rec is the
// reconciled outcome to record instead of making the call.
func (x *execution[Req, State]) phase(ctx context.Context, i int, rec recordFn[Req, State]) (*keyrow.Response, error) {
	p := &x.w.phases[i]
	x.run.phase = p.name
	start := time.Now()
	body := p.local
	if p.foreign != nil {
		if rec == nil {
			var err error
			if rec, err = x.call(ctx, p); err != nil {
				return nil, x.fail(ctx, err)
			}
		}
		body = LocalFunc[Req, State](rec)
	}
	res, err := x.commit(ctx, i, body)
	if err != nil {
		return nil, x.fail(ctx, err)
	}
	ev := Event{Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key, Phase: p.name, Duration: time.Since(start)}
	if res.response != nil {
		ev.Kind, ev.RecoveryPoint, ev.Status = EventFinished, keyrow.Finished, res.response.Status
		x.rn.observe(ev)
		x.log.Debug("key finished", "recovery_point", keyrow.Finished, "status", res.response.Status)
		if err := x.inject(ctx, Point{p.name, BeforeResponse}); err != nil {
			return nil, x.fail(ctx, err)
		}
		return res.response, nil
	}
	x.rp = p.name
	ev.Kind, ev.RecoveryPoint = EventPhaseCommitted, p.name
	x.rn.observe(ev)
	x.log.Debug("phase committed", "recovery_point", p.name)
	return nil, nil
}

// call makes a foreign phase's call outside any transaction, renewing the
// lease while it runs.
func (x *execution[Req, State]) call(ctx context.Context, p *Phase[Req, State]) (recordFn[Req, State], error) {
	if err := x.inject(ctx, Point{p.name, BeforeCall}); err != nil {
		return nil, err
	}
	callCtx, stop := x.lease.Keep(ctx, x.rn.cfg.Pool)
	rec, err := p.foreign.call(callCtx, x.run)
	stop()
	if lost := x.lease.Err(); lost != nil {
		return nil, lost
	}
	if err != nil {
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
func (x *execution[Req, State]) commit(ctx context.Context, i int, body LocalFunc[Req, State]) (Result, error) {
	p := &x.w.phases[i]
	backoff := x.rn.cfg.RetryBackoff
	for attempt := 0; ; attempt++ {
		res, err := x.commitOnce(ctx, i, body)
		if err == nil {
			return res, nil
		}
		x.restoreState()
		if !retryable(err) || attempt >= x.rn.cfg.MaxPhaseRetries {
			return Result{}, err
		}
		x.rn.observe(Event{Kind: EventRetried, Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key,
			RecoveryPoint: x.rp, Phase: p.name, Err: err})
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(backoff/2 + rand.N(backoff)):
		}
		backoff *= 2
	}
}

// commitOnce costs the phase's own statements plus two round trips: BEGIN,
// and the fenced advance pipelined with COMMIT. If the lease was lost, the
// advance raises and the COMMIT is skipped, so nothing of the phase persists.
func (x *execution[Req, State]) commitOnce(ctx context.Context, i int, body LocalFunc[Req, State]) (res Result, err error) {
	p := &x.w.phases[i]
	if err := x.inject(ctx, Point{p.name, BeforeTx}); err != nil {
		return Result{}, err
	}
	conn, err := x.rn.cfg.Pool.Acquire(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("phase %s: %w", p.name, err)
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: p.isolation})
	if err != nil {
		return Result{}, fmt.Errorf("phase %s: begin: %w", p.name, err)
	}
	defer func() {
		// A successful pipelined COMMIT leaves the connection idle; only a
		// failed or unfinished transaction needs the rollback round trip.
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	res, err = body(ctx, tx, x.run)
	if err == nil {
		err = res.err
	}
	if err != nil {
		return Result{}, fmt.Errorf("phase %s: %w", p.name, err)
	}
	if res.response == nil && !x.more(i) {
		return Result{}, fmt.Errorf("phase %s: %w", p.name, ErrNoResponse)
	}
	state, err := json.Marshal(x.run.State)
	if err != nil {
		return Result{}, fmt.Errorf("phase %s: encode state: %w", p.name, err)
	}
	if err := x.inject(ctx, Point{p.name, BeforeCommit}); err != nil {
		return Result{}, err
	}
	b := &pgx.Batch{}
	if res.response != nil {
		if err := keyrow.QueueFinish(b, x.run.ID, x.lease.Token, state, *res.response); err != nil {
			return Result{}, err
		}
	} else {
		keyrow.QueueAdvance(b, x.run.ID, x.lease.Token, p.name, state, x.lease.TTL)
	}
	b.Queue("COMMIT")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		err = keyrow.AsLeaseLost(err)
		if errors.Is(err, keyrow.ErrLeaseLost) {
			x.lease.MarkLost()
			return Result{}, err
		}
		return Result{}, fmt.Errorf("phase %s: commit: %w", p.name, err)
	}
	x.committed = state
	if err := x.inject(ctx, Point{p.name, AfterCommit}); err != nil {
		return Result{}, err
	}
	return res, nil
}

// more reports whether a phase after i applies to this run.
func (x *execution[Req, State]) more(i int) bool {
	for j := i + 1; j < len(x.w.phases); j++ {
		if q := &x.w.phases[j]; q.when == nil || q.when(x.run) {
			return true
		}
	}
	return false
}

func (x *execution[Req, State]) restoreState() {
	var zero State
	x.run.State = zero
	// committed was produced by json.Marshal of State, so it decodes.
	_ = json.Unmarshal(x.committed, &x.run.State)
}

// fail ends a run that met err, freeing the lease unless the run crashed or
// lost it, and returns err.
func (x *execution[Req, State]) fail(ctx context.Context, err error) error {
	x.restoreState()
	ev := Event{Workflow: x.w.name, Tenant: x.run.Tenant, Key: x.run.Key, RecoveryPoint: x.rp, Phase: x.run.phase, Err: err}
	switch {
	case errors.Is(err, ErrCrash):
		ev.Kind = EventCrashed
		x.rn.observe(ev)
		x.log.Warn("run crashed by fault injection; lease kept", "recovery_point", x.rp, "phase", x.run.phase)
		return err
	case errors.Is(err, keyrow.ErrLeaseLost):
		ev.Kind = EventLeaseLost
		x.rn.observe(ev)
		x.log.Warn("lease lost; stopped without committing", "recovery_point", x.rp, "phase", x.run.phase)
		return err
	case errors.Is(err, ErrOutcomeUnknown):
		ev.Kind = EventUnknown
		x.rn.observe(ev)
		hold := keyrow.HoldUnknown
		if p := &x.w.phases[x.w.index[x.run.phase]]; p.foreign != nil && p.foreign.repeatable {
			hold = ""
		}
		x.log.Warn("foreign call outcome unknown", "recovery_point", x.rp, "phase", x.run.phase, "hold", hold, "err", err)
		return x.release(ctx, err, hold)
	}
	ev.Kind = EventFailed
	x.rn.observe(ev)
	x.log.Error("phase failed; lease freed, recovery point kept", "recovery_point", x.rp, "phase", x.run.phase, "err", err)
	return x.release(ctx, err, "")
}

func (x *execution[Req, State]) release(ctx context.Context, cause error, hold string) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := keyrow.Release(rctx, x.rn.cfg.Pool, x.run.ID, x.lease.Token, cause.Error(), hold); err != nil && !errors.Is(err, keyrow.ErrLeaseLost) {
		x.log.Error("freeing the lease failed; the key resumes when it expires", "err", err)
	}
	return cause
}

// release frees the lease of a run that could not start.
func (rn *Runner) release(ctx context.Context, log *slog.Logger, workflow string, row *keyrow.Row, cause error) error {
	rn.observe(Event{Kind: EventFailed, Workflow: workflow, Tenant: row.Tenant, Key: row.Key, RecoveryPoint: row.RecoveryPoint, Err: cause})
	log.Error("run could not start; lease freed", "recovery_point", row.RecoveryPoint, "err", cause)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := keyrow.Release(rctx, rn.cfg.Pool, row.ID, row.LockToken, cause.Error(), row.Hold); err != nil && !errors.Is(err, keyrow.ErrLeaseLost) {
		log.Error("freeing the lease failed; the key resumes when it expires", "err", err)
	}
	return cause
}

func (x *execution[Req, State]) inject(ctx context.Context, at Point) error {
	inj, _ := ctx.Value(injectorKey{}).(Injector)
	if inj == nil {
		inj = x.rn.cfg.Injector
	}
	if inj == nil {
		return nil
	}
	return inj.Inject(ctx, at)
}

func (rn *Runner) observe(ev Event) {
	if rn.cfg.Observer != nil {
		rn.cfg.Observer(ev)
	}
}

// retryable reports a serialization failure or deadlock, after which the
// phase's transaction can simply run again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) &&
		(pgErr.Code == pgerrcode.SerializationFailure || pgErr.Code == pgerrcode.DeadlockDetected)
}
