package phase

import (
	"context"
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/recovery"
)

// Hook is something a Client calls as it works, given in Config.Hooks: the
// one way to observe, trace or fault a client. A hook implements Hook and
// one or more of the interfaces below, which the client finds by type
// assertion once, in NewClient, as pgx finds a tracer's optional
// interfaces:
//
//   - [Observer] receives every event of runs, the completer and the reaper;
//   - [RunWrapper], [PhaseWrapper] and [CallWrapper] wrap each run of a key,
//     each phase, and each foreign call or reconcile function;
//   - [PassWrapper] wraps each completer pass;
//   - [Injector] decides at each fault point whether to fail there.
//
// A wrapper receives the step's context and a next function that performs
// the step. It must call next once, with that context or one derived from
// it, and should return what next returned. Whatever it puts in the
// context reaches everything the step does: a span started in WrapPhase is
// the parent of the spans of the phase's own SQL (with a tracing pgx
// tracer) and of its commit, and a span started in WrapCall is the parent
// of the foreign request's spans. Wrappers apply in the order of
// Config.Hooks, the first outermost. Package otelphase is such a hook.
//
// Hooks are called on the run's or pass's goroutine and must be safe for
// concurrent use. Embed [HookDefaults] to implement Hook.
type Hook interface {
	// IsHook marks a hook; it returns true.
	IsHook() bool
}

// HookDefaults implements Hook; embed it in a hook.
type HookDefaults struct{}

// IsHook returns true.
func (HookDefaults) IsHook() bool { return true }

// Observer is a Hook that receives every keyrow.Event of a client's runs,
// completer and reaper, with the context of the run or pass, so a tracer
// can attach the event to its span. It is called synchronously and must be
// fast; a metrics library plugs in here.
type Observer interface {
	Hook
	Observe(ctx context.Context, ev keyrow.Event)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(ctx context.Context, ev keyrow.Event)

// IsHook returns true.
func (ObserverFunc) IsHook() bool { return true }

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, ev keyrow.Event) { f(ctx, ev) }

// RunWrapper is a Hook that wraps one run of a key, from checking its
// request to its outcome: Workflow.Run, a Handler's request, or the
// completer resuming an abandoned key.
type RunWrapper interface {
	Hook
	WrapRun(ctx context.Context, run *RunInfo, next func(context.Context) (*Outcome, error)) (*Outcome, error)
}

// PhaseWrapper is a Hook that wraps one phase: its foreign call if it has
// one, its transaction and its commit, or its failure and the freeing of
// the lease.
type PhaseWrapper interface {
	Hook
	WrapPhase(ctx context.Context, phase *PhaseInfo, next func(context.Context) error) error
}

// CallWrapper is a Hook that wraps a foreign phase's call, from the lease
// check before it to its return, or its reconcile function
// (PhaseInfo.Reconcile).
type CallWrapper interface {
	Hook
	WrapCall(ctx context.Context, phase *PhaseInfo, next func(context.Context) error) error
}

// PassWrapper is a Hook that wraps one pass of the completer, the runs it
// resumes included. A run that outlasts the rest of its pass by far (see
// package recovery) goes on after the pass returns, under its context, and
// is counted by the pass during which it ends.
type PassWrapper interface {
	Hook
	WrapPass(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error)
}

// RunInfo describes a run to a RunWrapper.
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

// PhaseInfo describes a phase to a PhaseWrapper or CallWrapper.
type PhaseInfo struct {
	Workflow string
	Tenant   string
	Key      string
	// Phase is the phase's name, which is also its recovery point.
	Phase string
	// DownstreamKey is the idempotency key of the phase's foreign call
	// (Input.DownstreamKey); empty for a local phase.
	DownstreamKey string
	// Reconcile is set when WrapCall wraps the phase's reconcile function,
	// which finds out what became of a call whose outcome is unknown,
	// rather than the call itself.
	Reconcile bool
}

// hooks are a client's hooks sorted by what they implement.
type hooks struct {
	observers []Observer
	runs      []RunWrapper
	phases    []PhaseWrapper
	calls     []CallWrapper
	passes    []PassWrapper
	injectors []Injector
}

// sortHooks sorts hs by the interfaces each implements, refusing a nil
// hook and one that implements none.
func sortHooks(hs []Hook) (hooks, error) {
	var s hooks
	for i, h := range hs {
		if h == nil {
			return s, fmt.Errorf("phase: Config.Hooks[%d] is nil", i)
		}
		found := false
		if o, ok := h.(Observer); ok {
			s.observers, found = append(s.observers, o), true
		}
		if w, ok := h.(RunWrapper); ok {
			s.runs, found = append(s.runs, w), true
		}
		if w, ok := h.(PhaseWrapper); ok {
			s.phases, found = append(s.phases, w), true
		}
		if w, ok := h.(CallWrapper); ok {
			s.calls, found = append(s.calls, w), true
		}
		if w, ok := h.(PassWrapper); ok {
			s.passes, found = append(s.passes, w), true
		}
		if inj, ok := h.(Injector); ok {
			s.injectors, found = append(s.injectors, inj), true
		}
		if !found {
			return s, fmt.Errorf("phase: Config.Hooks[%d] (%T) implements none of Observer, RunWrapper, PhaseWrapper, CallWrapper, PassWrapper and Injector", i, h)
		}
	}
	return s, nil
}

// wrap returns step wrapped by hs, the first outermost; layer wraps one
// function in one hook.
func wrap[H, F any](hs []H, step F, layer func(h H, inner F) F) F {
	for i := len(hs) - 1; i >= 0; i-- {
		step = layer(hs[i], step)
	}
	return step
}

// throughRun runs step as a run described by info, through c's run
// wrappers.
func (c *Client) throughRun(ctx context.Context, info *RunInfo, step func(context.Context) (*Outcome, error)) (*Outcome, error) {
	return wrap(c.hooks.runs, step, func(h RunWrapper, inner func(context.Context) (*Outcome, error)) func(context.Context) (*Outcome, error) {
		return func(ctx context.Context) (*Outcome, error) { return h.WrapRun(ctx, info, inner) }
	})(ctx)
}

// throughPass runs a completer pass through c's pass wrappers.
func (c *Client) throughPass(ctx context.Context, pass func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error) {
	return wrap(c.hooks.passes, pass, func(h PassWrapper, inner func(context.Context) (recovery.PassResult, error)) func(context.Context) (recovery.PassResult, error) {
		return func(ctx context.Context) (recovery.PassResult, error) { return h.WrapPass(ctx, inner) }
	})(ctx)
}

// throughPhase runs step, a phase, through c's phase wrappers.
func (c *Client) throughPhase(ctx context.Context, info *PhaseInfo, step func(context.Context) error) error {
	return throughStep(ctx, c.hooks.phases, PhaseWrapper.WrapPhase, info, step)
}

// throughCall runs step, a foreign call or reconcile function, through c's
// call wrappers.
func (c *Client) throughCall(ctx context.Context, info *PhaseInfo, step func(context.Context) error) error {
	defer timeCall(ctx)()
	return throughStep(ctx, c.hooks.calls, CallWrapper.WrapCall, info, step)
}

// timeCall starts timing a foreign call or reconcile function for the
// run's callClock, and returns the function that ends it.
func timeCall(ctx context.Context) (end func()) {
	clock, ok := ctx.Value(callClockKey{}).(*callClock)
	if !ok {
		return func() {}
	}
	start := time.Now()
	return func() { clock.since(start) }
}

// throughStep runs step, described by info, through hs, each applied with
// its method m.
func throughStep[H any](ctx context.Context, hs []H, m func(H, context.Context, *PhaseInfo, func(context.Context) error) error, info *PhaseInfo, step func(context.Context) error) error {
	return wrap(hs, step, func(h H, inner func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error { return m(h, ctx, info, inner) }
	})(ctx)
}

// observe reports ev to c's observers and to the run's listener, if any.
func (c *Client) observe(ctx context.Context, ev keyrow.Event) {
	for _, o := range c.hooks.observers {
		o.Observe(ctx, ev)
	}
	if l, ok := ctx.Value(listenerKey{}).(func(keyrow.Event)); ok {
		l(ev)
	}
}
