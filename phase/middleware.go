package phase

import (
	"context"

	"github.com/atomicphase/atomicphase/recovery"
)

// Middleware wraps the steps of a client's work: each run of a key, each
// phase, each foreign call, and each completer pass. Each method receives
// the step's context and a next function that performs the step. It must
// call next once, with that context or one derived from it, and should
// return what next returned.
//
// Whatever a method puts in the context reaches everything the step does:
// a span started in Phase is the parent of the spans of the phase's own SQL
// (with a tracing pgx tracer) and of its transaction's commit, and a span
// started in Call is the parent of the foreign request's spans. Package
// otelphase is an OpenTelemetry Middleware.
//
// Methods are called on the run's goroutine and must be safe for concurrent
// use. Embed MiddlewareDefaults to implement only some of them.
type Middleware interface {
	// Run wraps one run of a key, from checking its request to its
	// outcome: Workflow.Run, or the completer resuming an abandoned key.
	Run(ctx context.Context, run *RunInfo, next func(context.Context) (*Outcome, error)) (*Outcome, error)
	// Phase wraps one phase: its foreign call if it has one, its
	// transaction and its commit, or its failure and the freeing of the
	// lease.
	Phase(ctx context.Context, phase *PhaseInfo, next func(context.Context) error) error
	// Call wraps a foreign phase's call, from the lease check before it
	// to its return, or its reconcile function (PhaseInfo.Reconcile).
	Call(ctx context.Context, phase *PhaseInfo, next func(context.Context) error) error
	// Pass wraps one pass of the completer, the runs it resumes included.
	Pass(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error)
}

// MiddlewareDefaults implements every Middleware method by calling next;
// embed it to implement only some.
type MiddlewareDefaults struct{}

// Run calls next.
func (MiddlewareDefaults) Run(ctx context.Context, _ *RunInfo, next func(context.Context) (*Outcome, error)) (*Outcome, error) {
	return next(ctx)
}

// Phase calls next.
func (MiddlewareDefaults) Phase(ctx context.Context, _ *PhaseInfo, next func(context.Context) error) error {
	return next(ctx)
}

// Call calls next.
func (MiddlewareDefaults) Call(ctx context.Context, _ *PhaseInfo, next func(context.Context) error) error {
	return next(ctx)
}

// Pass calls next.
func (MiddlewareDefaults) Pass(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error) {
	return next(ctx)
}

// RunInfo describes a run to Middleware.Run.
type RunInfo struct {
	Workflow string
	Tenant   string
	Key      string
	// ByCompleter is true for the completer's runs of abandoned keys.
	ByCompleter bool
	// RecoveryPoint is the key's recovery point when the run read it: where
	// the run resumes, keyrow.Finished for a replay. Set once the run has
	// read the key, before next returns; empty if it never did.
	RecoveryPoint string
	// Attempt counts the runs that took the key's lease, this one
	// included; zero for a run that did not take it. Set with
	// RecoveryPoint.
	Attempt int
}

// PhaseInfo describes a phase to Middleware.Phase and Middleware.Call.
type PhaseInfo struct {
	Workflow string
	Tenant   string
	Key      string
	// Phase is the phase's name, which is also its recovery point.
	Phase string
	// DownstreamKey is the idempotency key of the phase's foreign call
	// (Input.DownstreamKey); empty for a local phase.
	DownstreamKey string
	// Reconcile is set when Call wraps the phase's reconcile function,
	// which finds out what became of a call whose outcome is unknown,
	// rather than the call itself.
	Reconcile bool
}

// wrap returns step wrapped by mws, the first outermost; layer wraps one
// function in one middleware.
func wrap[F any](mws []Middleware, step F, layer func(m Middleware, inner F) F) F {
	for i := len(mws) - 1; i >= 0; i-- {
		step = layer(mws[i], step)
	}
	return step
}

// throughRun runs step as a run described by info, through c's middleware.
func (c *Client) throughRun(ctx context.Context, info *RunInfo, step func(context.Context) (*Outcome, error)) (*Outcome, error) {
	return wrap(c.cfg.Middleware, step, func(m Middleware, inner func(context.Context) (*Outcome, error)) func(context.Context) (*Outcome, error) {
		return func(ctx context.Context) (*Outcome, error) { return m.Run(ctx, info, inner) }
	})(ctx)
}

// throughPass runs a completer pass through c's middleware.
func (c *Client) throughPass(ctx context.Context, pass func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error) {
	return wrap(c.cfg.Middleware, pass, func(m Middleware, inner func(context.Context) (recovery.PassResult, error)) func(context.Context) (recovery.PassResult, error) {
		return func(ctx context.Context) (recovery.PassResult, error) { return m.Pass(ctx, inner) }
	})(ctx)
}

// through runs step, a phase or a call as call says, through c's middleware.
func (c *Client) through(ctx context.Context, info *PhaseInfo, call bool, step func(context.Context) error) error {
	return wrap(c.cfg.Middleware, step, func(m Middleware, inner func(context.Context) error) func(context.Context) error {
		if call {
			return func(ctx context.Context) error { return m.Call(ctx, info, inner) }
		}
		return func(ctx context.Context) error { return m.Phase(ctx, info, inner) }
	})(ctx)
}
