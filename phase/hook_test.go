package phase_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

type pathKey struct{}

// pathOf returns the steps the wrappers entered to reach ctx.
func pathOf(ctx context.Context) string {
	s, _ := ctx.Value(pathKey{}).(string)
	return s
}

// recorder is a hook that wraps runs, phases, calls and passes: it extends
// the context's path on every step and records each step when it ends,
// innermost first.
type recorder struct {
	phase.HookDefaults
	name string
	mu   sync.Mutex
	log  []string
}

func (m *recorder) enter(ctx context.Context, step string) context.Context {
	return context.WithValue(ctx, pathKey{}, pathOf(ctx)+"/"+m.name+"."+step)
}

func (m *recorder) record(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log = append(m.log, fmt.Sprintf(format, args...))
}

func (m *recorder) steps() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.log)
}

func (m *recorder) WrapRun(ctx context.Context, run *phase.RunInfo, next func(context.Context) (*phase.Outcome, error)) (*phase.Outcome, error) {
	out, err := next(m.enter(ctx, "run"))
	result := "error"
	if err == nil {
		result = string(out.Kind)
	}
	m.record("run %s %s/%s completer=%t from=%s attempt=%d: %s", run.Workflow, run.Tenant, run.Key,
		run.ByCompleter, run.RecoveryPoint, run.Attempt, result)
	return out, err
}

func (m *recorder) WrapPhase(ctx context.Context, p *phase.PhaseInfo, next func(context.Context) error) error {
	err := next(m.enter(ctx, "phase"))
	m.record("phase %s downstream=%t err=%t", p.Phase, p.DownstreamKey != "", err != nil)
	return err
}

func (m *recorder) WrapCall(ctx context.Context, p *phase.PhaseInfo, next func(context.Context) error) error {
	err := next(m.enter(ctx, "call"))
	m.record("call %s %s reconcile=%t err=%t", p.Phase, p.DownstreamKey, p.Reconcile, err != nil)
	return err
}

func (m *recorder) WrapPass(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error) {
	res, err := next(m.enter(ctx, "pass"))
	m.record("pass claimed=%d completed=%d", res.Claimed, res.Completed)
	return res, err
}

// stepsEnv runs a three-phase workflow whose phases record the context path
// they see: what a tracer's spans would be parented to.
type stepsEnv struct {
	c         *phase.Client
	w         *phase.Workflow[int, string]
	outer     *recorder
	inner     *recorder
	mu        sync.Mutex
	seen      []string
	failFinal atomic.Bool
}

func (e *stepsEnv) saw(ctx context.Context, what string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen = append(e.seen, what+" "+pathOf(ctx))
}

func (e *stepsEnv) takeSeen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.seen
	e.seen = nil
	return s
}

func setupSteps(t *testing.T) *stepsEnv {
	t.Helper()
	e := &stepsEnv{outer: &recorder{name: "a"}, inner: &recorder{name: "b"}}
	w, err := phase.NewWorkflow("steps",
		phase.Local("first", func(ctx context.Context, tx pgx.Tx, in *phase.Input[int, string]) (phase.Result, error) {
			e.saw(ctx, "first")
			_, err := tx.Exec(ctx, `SELECT 1`)
			return phase.Next(), err
		}),
		phase.Foreign("charged",
			func(ctx context.Context, in *phase.Input[int, string]) (string, error) {
				e.saw(ctx, "call "+in.DownstreamKey())
				return "ch_1", nil
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[int, string], id string) (phase.Result, error) {
				e.saw(ctx, "record")
				in.State = id
				return phase.Next(), nil
			}),
		phase.Local("final", func(ctx context.Context, tx pgx.Tx, in *phase.Input[int, string]) (phase.Result, error) {
			e.saw(ctx, "final")
			if e.failFinal.Load() {
				return phase.Result{}, errors.New("final phase failed")
			}
			return phase.JSON(http.StatusCreated, in.State), nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
	e.c, err = phase.NewClient(pgtest.Pool(t), &phase.Config{
		Logger:    quiet,
		Hooks:     []phase.Hook{e.outer, e.inner},
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1},
	}, w)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestHooksWrapRunPhasesAndCallsAndCarriesTheirContext(t *testing.T) {
	t.Parallel()
	e := setupSteps(t)
	ctx := context.Background()
	out, err := e.w.Run(ctx, e.c, "acme", "k1", 1)
	if err != nil || out.Kind != phase.OutcomeNew {
		t.Fatalf("run: %v, %v", out, err)
	}
	dk := ""
	seen := e.takeSeen()
	if len(seen) == 4 && len(strings.Fields(seen[1])) == 3 {
		dk = strings.Fields(seen[1])[1]
	}
	phaseOf, call := "/a.run/b.run/a.phase/b.phase", "/a.run/b.run/a.phase/b.phase/a.call/b.call"
	want := []string{"first " + phaseOf, "call " + dk + " " + call, "record " + phaseOf, "final " + phaseOf}
	if !slices.Equal(seen, want) || dk == "" {
		t.Errorf("phases saw the contexts\n%q\nwant\n%q", seen, want)
	}
	for _, m := range []*recorder{e.outer, e.inner} {
		want := []string{
			"phase first downstream=false err=false",
			"call charged " + dk + " reconcile=false err=false",
			"phase charged downstream=true err=false",
			"phase final downstream=false err=false",
			"run steps acme/k1 completer=false from=started attempt=1: new",
		}
		if got := m.steps(); !slices.Equal(got, want) {
			t.Errorf("hook %s recorded\n%q\nwant\n%q", m.name, got, want)
		}
	}

	// A replay runs no phase; its run ends with the outcome and the
	// recovery point it found.
	if out, err := e.w.Run(ctx, e.c, "acme", "k1", 1); err != nil || out.Kind != phase.OutcomeReplayed {
		t.Fatalf("replay: %v, %v", out, err)
	}
	if got, want := e.inner.steps()[5:], []string{"run steps acme/k1 completer=false from=finished attempt=0: replayed"}; !slices.Equal(got, want) {
		t.Errorf("replay recorded %q, want %q", got, want)
	}
	// A request that can never run still ends its run, with its error.
	if _, err := e.w.Run(ctx, e.c, "acme", "", 1); !errors.Is(err, keyrow.ErrKeyMissing) && !errors.Is(err, keyrow.ErrKeyInvalid) {
		t.Fatalf("run without a key: %v", err)
	}
	if got, want := e.inner.steps()[6:], []string{"run steps acme/ completer=false from= attempt=0: error"}; !slices.Equal(got, want) {
		t.Errorf("invalid request recorded %q, want %q", got, want)
	}
}

func TestHooksWrapCompleterPassesAndTheRunsTheyResume(t *testing.T) {
	t.Parallel()
	e := setupSteps(t)
	ctx := context.Background()
	e.failFinal.Store(true)
	if _, err := e.w.Run(ctx, e.c, "acme", "k1", 1); err == nil {
		t.Fatal("the run whose final phase fails succeeded")
	}
	if got, want := e.inner.steps()[3:], []string{
		"phase final downstream=false err=true",
		"run steps acme/k1 completer=false from=started attempt=1: error",
	}; !slices.Equal(got, want) {
		t.Errorf("failed run recorded %q, want %q", got, want)
	}
	e.takeSeen()

	e.failFinal.Store(false)
	res, err := e.c.Complete(ctx)
	if err != nil || res.Completed != 1 {
		t.Fatalf("complete: %+v, %v", res, err)
	}
	if seen, want := e.takeSeen(), []string{"final /a.pass/b.pass/a.run/b.run/a.phase/b.phase"}; !slices.Equal(seen, want) {
		t.Errorf("resumed phase saw %q, want %q", seen, want)
	}
	// Complete drains: a second pass finds nothing.
	if got, want := e.inner.steps()[5:], []string{
		"phase final downstream=false err=false",
		"run steps acme/k1 completer=true from=charged attempt=2: resumed",
		"pass claimed=1 completed=1",
		"pass claimed=0 completed=0",
	}; !slices.Equal(got, want) {
		t.Errorf("completer recorded\n%q\nwant\n%q", got, want)
	}
}

func TestNewClientRefusesANilHookAndOneThatDoesNothing(t *testing.T) {
	t.Parallel()
	w, err := phase.NewWorkflow("one", phase.Local("only", func(context.Context, pgx.Tx, *phase.Input[int, int]) (phase.Result, error) {
		return phase.JSON(http.StatusOK, 1), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = phase.NewClient(pgtest.Pool(t), &phase.Config{Hooks: []phase.Hook{&recorder{}, nil}}, w)
	if err == nil {
		t.Fatal("NewClient accepted a nil hook")
	}
	// A hook that implements none of the hook interfaces, such as one
	// whose method was misnamed, would silently do nothing.
	_, err = phase.NewClient(pgtest.Pool(t), &phase.Config{Hooks: []phase.Hook{phase.HookDefaults{}}}, w)
	if err == nil || !strings.Contains(err.Error(), "implements none") {
		t.Fatalf("NewClient accepted a hook that implements nothing: %v", err)
	}
}

func TestHooksWrapTheReconcileOfAnUnknownCall(t *testing.T) {
	t.Parallel()
	m := &recorder{name: "a"}
	var reconciledIn string
	w, err := phase.NewWorkflow("payouts", phase.Reconciled(
		phase.Foreign("sent",
			func(ctx context.Context, in *phase.Input[int, string]) (string, error) {
				return "", phase.MaybeHappened(errors.New("provider timed out"))
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[int, string], id string) (phase.Result, error) {
				return phase.JSON(http.StatusOK, id), nil
			}),
		func(ctx context.Context, in *phase.Input[int, string]) (string, phase.Verdict, error) {
			reconciledIn = pathOf(ctx)
			return "po_1", phase.Happened, nil
		},
		func(ctx context.Context, tx pgx.Tx, in *phase.Input[int, string], id string) (phase.Result, error) {
			return phase.JSON(http.StatusOK, id), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pgtest.Pool(t), &phase.Config{Logger: quiet, Hooks: []phase.Hook{m},
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Run(ctx, c, "acme", "k1", 1); !errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("run: %v, want ErrOutcomeUnknown", err)
	}
	if res, err := c.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("complete: %+v, %v", res, err)
	}
	steps := m.steps()
	if len(steps) != 8 {
		t.Fatalf("recorded %q", steps)
	}
	dk := strings.Fields(steps[0])[2]
	want := []string{
		"call sent " + dk + " reconcile=false err=true",
		"phase sent downstream=true err=true",
		"run payouts acme/k1 completer=false from=started attempt=1: error",
		"call sent " + dk + " reconcile=true err=false",
		"phase sent downstream=true err=false",
		"run payouts acme/k1 completer=true from=started attempt=2: resumed",
		"pass claimed=1 completed=1",
		"pass claimed=0 completed=0",
	}
	if !slices.Equal(steps, want) {
		t.Errorf("recorded\n%q\nwant\n%q", steps, want)
	}
	if want := "/a.pass/a.run/a.call"; reconciledIn != want {
		t.Errorf("reconcile ran in %q, want %q", reconciledIn, want)
	}
}
