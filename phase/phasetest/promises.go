package phasetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// readTimeout bounds each read of a scenario's key by the promise checks.
// A read that waits that long found no free connection in the client's
// pool: every one is held by a paused run.
const readTimeout = waitTimeout

// ledger watches every run of one scenario's key at its fault points and
// checks, as the runs go, the promises the runner makes on the way to the
// outcome, which a provider that deduplicates, or a check of the outcome
// alone, would hide:
//
//   - a foreign call is sent again only if no record of it committed: when a
//     run is about to send a phase's call, the key's recovery point is still
//     before that phase;
//   - a recorded call is never lost: once a run's call returned, nothing of
//     a later phase begins before the call's record committed (a crash there
//     would send the call again, or leave it to be reconciled);
//   - a committed phase never runs again: no run passes a point of a phase,
//     before its commit, at which the key's recovery point is that phase or
//     later;
//   - after_commit means committed: at a phase's after_commit point the
//     key's recovery point is that phase, or the key is finished;
//   - a run whose lease was taken over commits nothing.
//
// A violation fails the scenario with its phase and the counts so far. The
// key's end (finished, or held for an operator for a documented reason,
// with no pending mark or lease left) is checked by settle.
type ledger struct {
	t      testing.TB
	client *phase.Client
	tenant string
	key    string

	mu sync.Mutex
	// sends counts, per phase, the calls sent under the key's downstream
	// key for that phase, and senders names the runs that sent them.
	sends   map[string]int
	senders map[string][]string
	// marked holds the phases whose call a run was about to send: a run
	// stopped there leaves the call's outcome unknown.
	marked map[string]bool
	runs   int
}

func newLedger(t testing.TB, client *phase.Client, tenant, key string) *ledger {
	return &ledger{t: t, client: client, tenant: tenant, key: key,
		sends: map[string]int{}, senders: map[string][]string{}, marked: map[string]bool{}}
}

// watch returns ctx for a run by who of a workflow whose phases, in order,
// are phases: its runs consult inner at every fault point (nil for no
// fault) and are watched by l.
func (l *ledger) watch(ctx context.Context, who string, phases []string, inner phase.Injector) (context.Context, *watcher) {
	l.mu.Lock()
	l.runs++
	name := fmt.Sprintf("%s run #%d", who, l.runs)
	l.mu.Unlock()
	if inner == nil {
		inner = noFaults
	}
	order := make(map[string]int, len(phases)+2)
	order[keyrow.Started] = -1
	for i, p := range phases {
		order[p] = i
	}
	w := &watcher{l: l, name: name, inner: inner, order: order, called: map[string]bool{}}
	return phase.WithInjector(ctx, w), w
}

// watcher is the Injector of one run of a scenario.
type watcher struct {
	phase.HookDefaults
	l     *ledger
	name  string
	inner phase.Injector
	// order is each phase's index in the run's workflow.
	order map[string]int
	mu    sync.Mutex
	// stale is set once the run's lease was taken from it (a holder that
	// stalled past its lease): it may still send a call it was about to
	// send (see PairMatrix), but must commit nothing.
	stale bool
	// called holds the foreign phases whose call returned in this run and
	// whose record is not yet known to have committed.
	called map[string]bool
}

// takenOver marks the run as one whose lease was taken from it.
func (w *watcher) takenOver() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stale = true
}

// Inject consults the run's own injector first: the checks apply to what
// the run does next, once it goes on past the point.
func (w *watcher) Inject(ctx context.Context, at phase.Point) error {
	if at.Stage == phase.InCall {
		w.l.mu.Lock()
		w.l.marked[at.Phase] = true
		w.l.mu.Unlock()
	}
	// A commit reported at after_commit was made before the run reached
	// the point, where it may then be paused and taken over.
	staleAtCommit := w.isStale()
	if err := w.inner.Inject(ctx, at); err != nil {
		return err
	}
	w.check(ctx, at, staleAtCommit)
	return nil
}

func (w *watcher) isStale() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stale
}

// check checks the promises that bind the run going on from at.
func (w *watcher) check(ctx context.Context, at phase.Point, staleAtCommit bool) {
	stale := w.isStale()
	l := w.l
	row := l.read(ctx)
	if row == nil {
		return
	}
	recorded := func(name string) (bool, bool) {
		i, ok := w.order[name]
		if row.FinishedAt != nil {
			return true, ok
		}
		rp, known := w.order[row.RecoveryPoint]
		return ok && known && rp >= i, ok && known
	}
	// Each phase's record whose call returned earlier in this run must
	// have committed once the run reaches another phase.
	for name := range w.called {
		if name == at.Phase {
			continue
		}
		if done, known := recorded(name); known && !done && !stale {
			l.t.Errorf("%s: the %s reached %s before the record of phase %s's call committed (recovery point %s): "+
				"a crash there loses the record, and the call (sent %d time(s) so far) goes out again or is reconciled",
				l.key, w.name, at, name, row.RecoveryPoint, l.sendCount(name))
		}
		delete(w.called, name)
	}
	done, known := recorded(at.Phase)
	switch at.Stage {
	case phase.InCall:
		n := l.sent(at.Phase, w.name)
		if done && !stale {
			l.t.Errorf("%s: the %s sent phase %s's call again though its record had committed (recovery point %s): "+
				"send %d under the phase's downstream key, by %s", l.key, w.name, at.Phase, row.RecoveryPoint, n,
				strings.Join(l.sendersOf(at.Phase), ", "))
		}
	case phase.AfterCall:
		w.called[at.Phase] = true
	case phase.AfterCommit:
		switch {
		case staleAtCommit:
			l.t.Errorf("%s: the %s, whose lease had been taken over, committed phase %s", l.key, w.name, at.Phase)
		case known && !done && !stale:
			l.t.Errorf("%s: the %s reached %s with the phase not committed: recovery point %s", l.key, w.name, at, row.RecoveryPoint)
		}
	case phase.BeforeResponse:
	default:
		if done && known && !stale {
			l.t.Errorf("%s: the %s ran phase %s again (at %s) though it had committed: recovery point %s%s",
				l.key, w.name, at.Phase, at, row.RecoveryPoint, finishedNote(row))
		}
	}
}

func finishedNote(row *keyrow.Row) string {
	if row.FinishedAt != nil {
		return ", key finished"
	}
	return ""
}

// read returns the key's row as committed, or nil when it cannot be read
// (the test has failed then).
func (l *ledger) read(ctx context.Context) *keyrow.Row {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
	defer cancel()
	row, err := l.client.Inspect(ctx, l.tenant, l.key)
	if err != nil {
		l.t.Errorf("%s: read the key to check the runner's promises: %v (the matrices read the key while a run is paused: "+
			"give the client's pool a connection more than its runs hold)", l.key, err)
		return nil
	}
	return row
}

// sent counts a call of phase name sent by who and returns how many the
// scenario sent.
func (l *ledger) sent(name, who string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sends[name]++
	l.senders[name] = append(l.senders[name], who)
	return l.sends[name]
}

func (l *ledger) sendCount(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sends[name]
}

func (l *ledger) sendersOf(name string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.senders[name]...)
}

// heldForOperator reports whether row is a key on hold for one of the
// documented reasons a scenario may end with: the outcome of a call that
// is not safe to repeat is unknown, since a run stopped after marking it
// as about to be sent, and the phase has no reconcile function (or its
// reconciliation could not tell). The mark names that phase, and no
// lease is left.
func (l *ledger) heldForOperator(row *keyrow.Row) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return row.FinishedAt == nil && row.Hold == keyrow.HoldUnknown && row.CallPending != "" && l.marked[row.CallPending]
}

// settle checks a scenario's key once every run on it has ended: no lease
// is left, and a finished key holds no pending mark; a key on hold is held
// for a documented reason (heldForOperator), with the call it waits on
// sent at most once.
func (l *ledger) settle(row *keyrow.Row) (held bool) {
	l.t.Helper()
	if row.LeaseLeft > 0 {
		l.t.Errorf("%s: a lease (%v left) is held although every run on the key has ended", l.key, row.LeaseLeft)
	}
	if row.FinishedAt != nil {
		if row.CallPending != "" {
			l.t.Errorf("%s: the key is finished with phase %s's call still marked pending", l.key, row.CallPending)
		}
		return false
	}
	if !l.heldForOperator(row) {
		return false
	}
	if n := l.sendCount(row.CallPending); n > 1 {
		l.t.Errorf("%s: on hold for an operator, phase %s's call was sent %d times (by %s); want at most once",
			l.key, row.CallPending, n, strings.Join(l.sendersOf(row.CallPending), ", "))
	}
	return true
}
