package phasetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// EnvPairs names the environment variable that makes PairMatrix
// exhaustive: set to "all", every run that takes a key over is paused at
// every point it passes; otherwise at one point per scenario (see
// PairMatrix).
const EnvPairs = "ATOMICPHASE_PAIRS"

// Who runs a key in a pair scenario.
const (
	byClient    = "client"    // the first request
	byRetry     = "retry"     // the same request again, same key
	byCompleter = "completer" // a completer pass (Client.Complete)
)

// waitTimeout bounds each wait of a pair scenario for a run to pause, end or
// block. It is a watchdog for a run that hangs, not a pause that the
// scenario's outcome depends on.
const waitTimeout = time.Minute

// PairMatrix proves that the workflow converges when two things happen to a
// key at once, as in real incidents. For every fault point P, a first run
// (the client's request, and with WithCompleter also the completer's) is
// paused at P while it holds the key's lease, and then one of these
// happens, each a subtest:
//
//   - duplicate-then-crash, duplicate-then-continue: a duplicate request
//     arrives (and with WithCompleter a completer pass runs) while the
//     first run holds the lease; the duplicate must be told the key is in
//     progress, or be replayed the stored answer, and the pass must leave
//     the key alone. Then the first run crashes at P, or goes on.
//   - retry-takes-over, completer-takes-over: the first run's lease runs out
//     while it is paused (Client.Unlock, what expiry would do) and a retry,
//     or the completer, takes the key over and is itself paused at a point
//     Q. The first run then wakes up, as a stalled holder does, and must be
//     fenced out; then the taker goes on and finishes the key. A first run
//     paused at a foreign phase's in_call point stands for a call still in
//     flight when its lease ran out: the taker may send the same call first.
//     So does one paused at before_call right after its commit: its pause
//     lasts far less than a lease, so when it wakes the commit still
//     proves its lease (see phase's # Fencing) and it sends the call, whose
//     record is then fenced out.
//
// When the taker's name has no pause point, it runs to its end before the
// first run wakes up; that scenario also finds the points the taker
// passes, from which Q is chosen, so that no scenario pauses a taker at a
// point it cannot reach (a run that takes over a call not safe to repeat
// reconciles it, or leaves it to an operator, and never passes the call's
// in_call or after_call). By default Q is P itself when the taker passes
// it (both runs at the same step), or else the taker's first point; with
// EnvPairs set to "all", Q is every point the taker passes.
//
// Each scenario then converges as production would (a crashed run's lease
// is freed and the client retries) and is checked as CrashMatrix checks
// its scenarios: the crash-free answer, one stored answer given to every
// run that answered, replays byte for byte, the runner's promises on the
// way (see CrashMatrix), and Config.Check. A first run whose lease was
// taken over must commit nothing; it may still send the call it was about
// to send, which its lease covered when it checked (see phase's
// # Fencing), and which the taker may also send: such a call goes out at
// most twice, under one downstream key.
//
// The interleavings are deterministic: runs are paused and released at
// their fault points through channels, never by sleeping. When one run is
// paused inside a transaction (before_commit; or before_tx and
// after_commit, where a local phase's commit travels with the next local
// phase's first statement) and the other waits on a row lock it holds,
// the wait is seen in pg_stat_activity, through
// Config.DB, and the paused run is released. PairMatrix therefore needs
// the workflow's database to itself while it runs, and real Postgres:
// testing/synctest cannot tell a run waiting on the database from one that
// is working. A paused run's time limits keep running; pauses last
// milliseconds, far inside the default LeaseTTL and CallTimeout, but a client
// built with limits of a second or two may see a paused run cut short.
func PairMatrix[Req, State any](t *testing.T, cfg Config[Req, State]) {
	t.Helper()
	if cfg.DB == nil {
		t.Fatal("phasetest: PairMatrix needs Config.DB, the pool the client runs on")
	}
	m := newMatrix(t, cfg)
	all := os.Getenv(EnvPairs) == "all"
	firsts, takers := []string{byClient}, []string{byRetry}
	if cfg.WithCompleter {
		firsts, takers = append(firsts, byCompleter), append(takers, byCompleter)
	}
	scenarios := 0
	for _, first := range firsts {
		for _, p := range m.points {
			for _, crash := range []bool{true, false} {
				fate := "continue"
				if crash {
					fate = "crash"
				}
				scenarios++
				m.scenario(t, fmt.Sprintf("%s@%s/duplicate-then-%s", first, dotted(p), fate), fmt.Sprintf("pair-%03d", scenarios),
					func(t *testing.T, key string) { m.held(t, key, first, p, crash) })
			}
			for _, taker := range takers {
				// The scenario without a pause finds the points the
				// taker passes.
				var passed []phase.Point
				scenarios++
				m.scenario(t, fmt.Sprintf("%s@%s/%s-takes-over", first, dotted(p), taker), fmt.Sprintf("pair-%03d", scenarios),
					func(t *testing.T, key string) { passed = m.takeover(t, key, first, p, taker, phase.Point{}) })
				for _, q := range takerPauses(passed, p, all) {
					scenarios++
					m.scenario(t, fmt.Sprintf("%s@%s/%s-takes-over@%s", first, dotted(p), taker, dotted(q)), fmt.Sprintf("pair-%03d", scenarios),
						func(t *testing.T, key string) { m.takeover(t, key, first, p, taker, q) })
				}
			}
		}
	}
	t.Logf("%d pair scenarios over %d fault points (%s=%q)", scenarios, len(m.points), EnvPairs, os.Getenv(EnvPairs))
}

// takerPauses returns where a run that takes the key over from a first run
// paused at p is paused, chosen from the points passed by such a run that
// was not paused: p itself when it passes it, or else its first point;
// with all, every point it passes, once each.
func takerPauses(passed []phase.Point, p phase.Point, all bool) []phase.Point {
	var pauses []phase.Point
	for _, q := range passed {
		if q.Stage == phase.BeforeResponse || slices.Contains(pauses, q) {
			continue
		}
		if !all && q == p {
			return []phase.Point{q}
		}
		pauses = append(pauses, q)
	}
	if !all && len(pauses) > 0 {
		return pauses[:1]
	}
	return pauses
}

// held runs a duplicate request, and a completer pass, against a key whose
// first run is paused at p, then crashes the first run or lets it go on.
func (m *matrix[Req, State]) held(t *testing.T, key, first string, p phase.Point, crash bool) {
	s := m.newPair(t, key)
	defer s.end()
	a := s.first(first, p)

	out := m.run(s.ctx, t, s.key)
	switch {
	case out.Kind == phase.OutcomeInFlight && out.RetryAfter > 0:
	case out.Kind == phase.OutcomeReplayed:
		s.answers = append(s.answers, out.Response)
	default:
		t.Fatalf("a duplicate request while the %s run holds the key at %s: the key was %s, want in progress with a Retry-After, or a replay",
			first, p, describe(out))
	}
	if m.cfg.WithCompleter {
		before := m.inspect(s.ctx, t, s.key).Attempts
		if _, err := m.cfg.Client.Complete(s.ctx); err != nil {
			t.Fatalf("completer: %v", err)
		}
		if after := m.inspect(s.ctx, t, s.key).Attempts; after != before {
			t.Fatalf("a completer pass took the key while the %s run held its lease", first)
		}
	}

	var fate error
	if crash {
		fate = phase.ErrCrash
	}
	s.release(a, fate)
	if st := s.wait(a, nil); st != stateDone {
		t.Fatalf("the %s run, let go at %s, did not end", first, p)
	}
	switch {
	case crash && first == byClient && !errors.Is(a.err, phase.ErrCrash):
		t.Fatalf("the client run crashed at %s: err = %v, want the injected crash", p, a.err)
	case !crash:
		s.finished(a)
	}
	s.converge()
}

// takeover lets the lease of a first run paused at p run out, has taker
// take the key over and pause at q (the zero Point: not at all), lets the
// first run go on, and then the taker. It returns the points the taker
// passed.
func (m *matrix[Req, State]) takeover(t *testing.T, key, first string, p phase.Point, taker string, q phase.Point) []phase.Point {
	s := m.newPair(t, key)
	defer s.end()
	a := s.first(first, p)
	// The first run stalls past its lease.
	m.unlock(s.ctx, t, s.key)
	a.watch.takenOver()
	b := s.start(taker, q)
	stB := s.wait(b, a)
	// The first run wakes up; the taker is paused, done, or waiting on a
	// row lock the first run holds.
	s.release(a, nil)
	s.wait(a, b)
	if stB == stateBlocked {
		stB = s.wait(b, a)
	}
	if stB == statePaused {
		s.release(b, nil)
	}
	s.waitDone(a)
	s.waitDone(b)
	if q != (phase.Point{}) && !b.gate.reached() {
		t.Fatalf("the %s run that took the key over never reached %s, which it passed when it was not paused: %s",
			taker, q, b.gate.passedPoints())
	}
	if first == byClient {
		switch {
		case a.err == nil:
			s.answers = append(s.answers, a.out.Response)
		case !errors.Is(a.err, keyrow.ErrLeaseLost):
			t.Errorf("the client run taken over at %s ended with %v, want keyrow.ErrLeaseLost", p, a.err)
		}
	}
	s.finished(b)
	s.converge()
	return b.gate.passedPoints()
}

// pair is one scenario of PairMatrix: one key and the runs on it.
type pair[Req, State any] struct {
	m       *matrix[Req, State]
	t       *testing.T
	ctx     context.Context
	key     string
	abort   chan struct{}
	runs    []*pausable
	answers []*keyrow.Response
}

func (m *matrix[Req, State]) newPair(t *testing.T, key string) *pair[Req, State] {
	return &pair[Req, State]{m: m, t: t, ctx: m.context(t), key: key, abort: make(chan struct{})}
}

// pausable is one run of a pair scenario, paused at its gate.
type pausable struct {
	who      string
	gate     *gate
	watch    *watcher
	done     chan struct{}
	released bool
	out      *phase.Outcome      // a client run's outcome
	pass     recovery.PassResult // a completer's
	err      error
}

// first creates the key and returns its first run, paused at p.
func (s *pair[Req, State]) first(who string, p phase.Point) *pausable {
	s.t.Helper()
	if who == byCompleter {
		// The key is unfinished and free, as a client that crashed at
		// once leaves it when its lease has run out.
		crashing, _ := s.m.watch(s.ctx, s.key, byClient, phase.CrashAt(s.m.points[0]))
		_, err := s.m.cfg.Workflow.Run(crashing, s.m.cfg.Client, s.m.tenant, s.key, s.m.cfg.Request(s.key))
		if !errors.Is(err, phase.ErrCrash) {
			s.t.Fatalf("run with a crash at %s: err = %v, want the injected crash", s.m.points[0], err)
		}
		s.m.unlock(s.ctx, s.t, s.key)
	}
	a := s.start(who, p)
	if st := s.wait(a, nil); st != statePaused {
		if who == byCompleter {
			s.m.completerTook(s.ctx, s.t, s.key, a.pass)
		}
		s.t.Fatalf("the %s run ended without reaching %s: %v", who, p, a.err)
	}
	return a
}

// start starts a run of the key by who, to be paused at at.
func (s *pair[Req, State]) start(who string, at phase.Point) *pausable {
	x := &pausable{who: who, gate: newGate(at, s.abort), done: make(chan struct{})}
	s.runs = append(s.runs, x)
	var ctx context.Context
	ctx, x.watch = s.m.watch(s.ctx, s.key, who, x.gate)
	c, w, req := s.m.cfg.Client, s.m.cfg.Workflow, s.m.cfg.Request(s.key)
	go func() {
		defer close(x.done)
		if who == byCompleter {
			x.pass, x.err = c.Complete(ctx)
			return
		}
		x.out, x.err = w.Run(ctx, c, s.m.tenant, s.key, req)
	}()
	return x
}

// release lets a paused run go on (fate nil) or crash there (phase.ErrCrash).
func (s *pair[Req, State]) release(x *pausable, fate error) {
	x.released = true
	x.gate.resume <- fate
}

type state int

const (
	statePaused  state = iota + 1 // at its gate
	stateDone                     // the run returned
	stateBlocked                  // waiting on a row lock that the other, paused, run holds
)

// wait returns once x is paused at its gate, has returned, or, when other
// is paused inside its transaction, waits on a lock.
func (s *pair[Req, State]) wait(x, other *pausable) state {
	s.t.Helper()
	var poll <-chan time.Time
	if other != nil && other.inTransaction() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		poll = tick.C
	}
	paused := x.gate.paused
	if x.released {
		paused = nil
	}
	watchdog := time.NewTimer(waitTimeout)
	defer watchdog.Stop()
	for {
		select {
		case <-paused:
			return statePaused
		case <-x.done:
			return stateDone
		case <-poll:
			if s.lockWaiting() {
				return stateBlocked
			}
		case <-watchdog.C:
			s.t.Fatalf("the %s run neither reached %s nor ended within %v", x.who, x.gate.at, waitTimeout)
		}
	}
}

func (s *pair[Req, State]) waitDone(x *pausable) {
	s.t.Helper()
	select {
	case <-x.done:
	case <-time.After(waitTimeout):
		s.t.Fatalf("the %s run did not end within %v", x.who, waitTimeout)
	}
	if x.err != nil && x.who == byCompleter {
		s.t.Fatalf("completer: %v", x.err)
	}
}

// inTransaction reports whether x may be paused with a phase's transaction
// open, holding the row locks its phase took: before its commit, and, when
// the commit of a local phase travels with the next local phase's first
// statement, before that phase's transaction and after that commit (then
// the next phase's transaction is open).
func (x *pausable) inTransaction() bool {
	if x.released || !x.gate.reached() {
		return false
	}
	switch x.gate.at.Stage {
	case phase.BeforeCommit, phase.BeforeTx, phase.AfterCommit:
		return true
	}
	return false
}

// lockWaitSQL tells whether a session of the workflow's database waits on
// a lock.
const lockWaitSQL = `
SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock')`

// citusLockWaitSQL is lockWaitSQL on a Citus cluster, where a statement on
// a distributed table waits on the node that holds its shard:
// citus_stat_activity shows the sessions of every node. The statements a
// node runs for the coordinator name the shards of the workflow's schema,
// which tells them from those of other schemas in the same database; on
// the coordinator itself a wait may be another schema's, which only makes
// the matrix look once more before it goes on.
const citusLockWaitSQL = `
SELECT EXISTS (SELECT 1 FROM citus_stat_activity
WHERE wait_event_type = 'Lock' AND datname = current_database()
  AND (NOT is_worker_query OR position(current_schema() || '.' IN query) > 0))`

// lockWaiting reports whether a session of the workflow's database waits on
// a lock.
func (s *pair[Req, State]) lockWaiting() bool {
	s.t.Helper()
	s.m.lockWaitOnce.Do(func() {
		var citus bool
		err := s.m.cfg.DB.QueryRow(s.ctx, `SELECT to_regclass('citus_stat_activity') IS NOT NULL`).Scan(&citus)
		if err != nil {
			s.t.Fatalf("look for lock waits: %v", err)
		}
		s.m.lockWaitSQL = lockWaitSQL
		if citus {
			s.m.lockWaitSQL = citusLockWaitSQL
		}
	})
	var waiting bool
	err := s.m.cfg.DB.QueryRow(s.ctx, s.m.lockWaitSQL).Scan(&waiting)
	if err != nil {
		s.t.Fatalf("look for lock waits: %v", err)
	}
	return waiting
}

// finished fails the test unless the run x finished the key itself, or
// left it on hold for an operator for a documented reason (see
// Scenario.Hold).
func (s *pair[Req, State]) finished(x *pausable) {
	s.t.Helper()
	if x.who != byCompleter {
		if held := s.m.heldBy(s.ctx, s.t, s.key, x.err); held != nil {
			x.out, x.err = held, nil
		}
	}
	if s.m.ledger(s.key).heldForOperator(s.m.inspect(s.ctx, s.t, s.key)) && x.err == nil &&
		(x.who == byCompleter || x.out.Kind == phase.OutcomeOnHold) {
		return
	}
	if x.who == byCompleter {
		s.m.completerTook(s.ctx, s.t, s.key, x.pass)
		if row := s.m.inspect(s.ctx, s.t, s.key); row.FinishedAt == nil {
			s.t.Fatalf("the completer's run did not finish the key: recovery point %s, last error %q", row.RecoveryPoint, row.LastError)
		}
		return
	}
	if x.err != nil {
		s.t.Fatalf("the %s run: %v", x.who, x.err)
	}
	if x.out.Response == nil {
		s.t.Fatalf("the %s run: the key was %s, want it run to its response", x.who, describe(x.out))
	}
	s.answers = append(s.answers, x.out.Response)
}

// converge finishes the key as production would, then checks it.
func (s *pair[Req, State]) converge() {
	s.t.Helper()
	if row := s.m.inspect(s.ctx, s.t, s.key); row.FinishedAt == nil && !s.m.ledger(s.key).heldForOperator(row) {
		// A crashed run's lease would run out; the client retries.
		s.m.unlock(s.ctx, s.t, s.key)
		if a := s.m.retry(s.ctx, s.t, s.key); a != nil {
			s.answers = append(s.answers, a)
		}
	}
	s.m.settled(s.ctx, s.t, s.key, s.answers...)
}

// end crashes every run still paused and waits for all of them, so that a
// failed scenario leaves nothing running.
func (s *pair[Req, State]) end() {
	close(s.abort)
	for _, x := range s.runs {
		select {
		case <-x.done:
		case <-time.After(waitTimeout):
			s.t.Errorf("the %s run did not end within %v of the scenario", x.who, waitTimeout)
		}
	}
}

// gate is an Injector that pauses a run the first time it reaches a point,
// until the test lets it go on or crash there.
type gate struct {
	phase.HookDefaults
	at     phase.Point
	mu     sync.Mutex
	passed []phase.Point // every point the run reached, in order
	once   sync.Once
	paused chan struct{} // closed when the run reaches at
	resume chan error    // what the paused run returns: nil, or phase.ErrCrash
	abort  <-chan struct{}
}

func newGate(at phase.Point, abort <-chan struct{}) *gate {
	return &gate{at: at, paused: make(chan struct{}), resume: make(chan error, 1), abort: abort}
}

// Inject pauses at g.at, once. It ignores ctx: a paused run stands for a
// stalled process, which notices nothing until it wakes.
func (g *gate) Inject(_ context.Context, p phase.Point) error {
	g.mu.Lock()
	g.passed = append(g.passed, p)
	g.mu.Unlock()
	if p != g.at {
		return nil
	}
	first := false
	g.once.Do(func() { first = true })
	if !first {
		return nil
	}
	close(g.paused)
	select {
	case err := <-g.resume:
		return err
	case <-g.abort:
		return phase.ErrCrash
	}
}

// passedPoints returns the points the run reached, in order.
func (g *gate) passedPoints() []phase.Point {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]phase.Point(nil), g.passed...)
}

func (g *gate) reached() bool {
	select {
	case <-g.paused:
		return true
	default:
		return false
	}
}

// dotted writes a point without a slash, for a subtest name.
func dotted(p phase.Point) string { return p.Phase + "." + string(p.Stage) }
