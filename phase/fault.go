package phase

import (
	"context"
	"sync"
)

// Stage is where in a phase's life a fault point sits.
type Stage string

// The stages at which a runner consults its Injector.
const (
	// BeforeTx: before the phase's transaction begins. When the commit of
	// the local phase before travels with this phase's first statement,
	// it is not sent yet: a crash here loses it, and the key resumes
	// before that phase.
	BeforeTx Stage = "before_tx"
	// BeforeCall: before a foreign call, and before the run makes sure
	// the key is still its own (renewing its lease, unless the commit
	// before was sent within a third of the TTL, at most a second).
	BeforeCall Stage = "before_call"
	// InCall: the lease was just proven the run's own for a foreign call,
	// which is about to be sent. A run paused here stands for a call in flight when its
	// lease runs out: another run may take the key over and send the same
	// call first.
	InCall Stage = "in_call"
	// AfterCall: after a foreign call returned, before its outcome is recorded.
	AfterCall Stage = "after_call"
	// BeforeCommit: the phase's work is done in its transaction, not committed.
	BeforeCommit Stage = "before_commit"
	// AfterCommit: the phase is committed, the next has not begun. When
	// the commit travelled with the next local phase's first statement
	// (see the package documentation), that phase's Go code has run up to
	// that statement, which has run too, uncommitted: the point is reached
	// when the commit is known.
	AfterCommit Stage = "after_commit"
	// BeforeResponse: the response is stored, not yet written to the client.
	BeforeResponse Stage = "before_response"
)

// Point names one fault point: a stage of a phase.
type Point struct {
	Phase string
	Stage Stage
}

func (p Point) String() string { return p.Phase + "/" + string(p.Stage) }

// Injector is a Hook that decides, at each fault point of a run, whether
// to fail there. Returning ErrCrash (or an error wrapping it) crashes the
// run; any other error fails the phase as an unexpected error would. The
// client consults its injectors in order, and the first error wins.
type Injector interface {
	Hook
	Inject(ctx context.Context, at Point) error
}

// InjectorFunc adapts a function to Injector.
type InjectorFunc func(ctx context.Context, at Point) error

// IsHook returns true.
func (InjectorFunc) IsHook() bool { return true }

// Inject calls f.
func (f InjectorFunc) Inject(ctx context.Context, at Point) error { return f(ctx, at) }

// CrashAt returns an Injector that crashes the first run that reaches at,
// once, and lets every other point pass.
func CrashAt(at Point) Injector {
	var once sync.Once
	return InjectorFunc(func(_ context.Context, p Point) error {
		crash := false
		if p == at {
			once.Do(func() { crash = true })
		}
		if crash {
			return ErrCrash
		}
		return nil
	})
}

// Recorder is an Injector that records every point reached, in order, and
// never fails. Running a workflow once with it discovers its fault points.
type Recorder struct {
	mu     sync.Mutex
	points []Point
}

// IsHook returns true.
func (*Recorder) IsHook() bool { return true }

// Inject records at.
func (r *Recorder) Inject(_ context.Context, at Point) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.points = append(r.points, at)
	return nil
}

// Points returns the points reached so far.
func (r *Recorder) Points() []Point {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Point(nil), r.points...)
}

type injectorKey struct{}

// WithInjector returns a context whose runs consult inj at every fault
// point, instead of the client's injectors (Config.Hooks). It lets one test, or one
// simulated request, crash without affecting concurrent runs.
func WithInjector(ctx context.Context, inj Injector) context.Context {
	return context.WithValue(ctx, injectorKey{}, inj)
}
