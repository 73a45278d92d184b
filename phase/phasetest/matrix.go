package phasetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// Recovery names a way a crashed key is brought to its end.
type Recovery string

// The recoveries CrashMatrix exercises.
const (
	// ByRetry: the client sends the same request with the same key again.
	ByRetry Recovery = "retry"
	// ByCompleter: no client comes back; the completer finishes the key.
	ByCompleter Recovery = "completer"
)

// DefaultTenant owns the matrices' keys when Config.Tenant is empty.
const DefaultTenant = "phasetest"

// Config describes the workflow under test.
type Config[Req, State any] struct {
	// Client runs the workflow, which must be registered with it. For
	// WithCompleter, build it with Completer.StuckAfter -1 (and Backoff -1),
	// so that its completer takes a key as soon as the key's lease is free.
	Client   *phase.Client
	Workflow *phase.Workflow[Req, State]
	// DB is the pool Client runs on. PairMatrix needs it, to tell a run
	// that waits on a row lock held by a paused run from one still at work;
	// CrashMatrix does not use it.
	DB *pgxpool.Pool
	// Tenant owns the keys the matrices use. Defaults to DefaultTenant.
	Tenant string
	// Request returns the request for the scenario whose key is key. Each
	// scenario uses a fresh key, so its effects can be told apart.
	Request func(key string) Req
	// WithCompleter also recovers keys by the client's completer
	// (Client.Complete): CrashMatrix recovers every crash point by it as
	// well as by a retry, and PairMatrix adds the completer as a first
	// holder and as a run that takes a key over.
	WithCompleter bool
	// Compare reports how a recovered response differs from the crash-free
	// one. Defaults to IgnoreFields(): same status, same headers, same body.
	// Use IgnoreFields("order_id") when responses carry values made per
	// key, such as generated ids.
	Compare CompareFunc
	// Check is called once each scenario has converged, to assert the
	// author's invariants (one order, one charge) for its key.
	Check func(t testing.TB, s Scenario)
}

// Scenario is one converged scenario, as Config.Check sees it.
type Scenario struct {
	// Name says what was done to the key: the name of the subtest, or
	// "crash-free" for the run that discovered the fault points.
	Name string
	// Tenant and Key identify the scenario's idempotency key.
	Tenant string
	Key    string
	// ID is the key row's id, the phase.Input.ID its phases saw: the column
	// that links the rows a workflow writes to its key.
	ID uuid.UUID
	// Response is the key's final, stored response; nil when the key ended
	// on hold for an operator (Hold).
	Response *keyrow.Response
	// Hold is set when the scenario ended with the key on hold for one of
	// the documented reasons: keyrow.HoldUnknown, when a run stopped after
	// marking a call that is not safe to repeat as about to be sent, and
	// the phase has no reconcile function (or its reconciliation could not
	// tell). The key then waits for an operator's resolution.
	Hold keyrow.Hold
}

// Points runs the workflow once, crash-free, under key and returns the
// fault points it passed, in order, with its response. key must be new to
// the database.
func Points[Req, State any](t testing.TB, cfg Config[Req, State], key string) ([]phase.Point, *keyrow.Response) {
	t.Helper()
	return points(t, cfg, key, newLedger(t, cfg.Client, tenant(cfg), key))
}

// points is Points, its run watched by l.
func points[Req, State any](t testing.TB, cfg Config[Req, State], key string, l *ledger) ([]phase.Point, *keyrow.Response) {
	t.Helper()
	var rec phase.Recorder
	ctx, _ := l.watch(context.Background(), "crash-free", cfg.Workflow.Phases(), &rec)
	out, err := cfg.Workflow.Run(ctx, cfg.Client, tenant(cfg), key, cfg.Request(key))
	if err != nil {
		t.Fatalf("crash-free run of key %q: %v", key, err)
	}
	if out.Kind != phase.OutcomeNew {
		t.Fatalf("crash-free run of key %q: the key was %s; the run needs a key this database has not seen", key, describe(out))
	}
	points := rec.Points()
	if len(points) == 0 {
		t.Fatal("crash-free run passed no fault points")
	}
	return points, out.Response
}

// CrashMatrix crashes the workflow at every fault point and checks that
// every recovery converges to the crash-free response with the invariants
// intact. Each point and recovery is a subtest named after them.
func CrashMatrix[Req, State any](t *testing.T, cfg Config[Req, State]) {
	t.Helper()
	m := newMatrix(t, cfg)
	recoveries := []Recovery{ByRetry}
	if cfg.WithCompleter {
		recoveries = append(recoveries, ByCompleter)
	}
	for i, at := range m.points {
		for _, how := range recoveries {
			m.scenario(t, fmt.Sprintf("%s/%s", at, how), fmt.Sprintf("crash-%02d-%s-%s", i, at.Stage, how), func(t *testing.T, key string) {
				ctx := m.context(t)
				crashing, _ := m.ledger(key).watch(ctx, byClient, m.cfg.Workflow.Phases(), phase.CrashAt(at))
				_, err := m.cfg.Workflow.Run(crashing, m.cfg.Client, m.tenant, key, m.cfg.Request(key))
				if !errors.Is(err, phase.ErrCrash) {
					t.Fatalf("run with a crash at %s: err = %v, want the injected crash", at, err)
				}
				// A killed process's lease would expire after its TTL; free it now.
				m.unlock(ctx, t, key)
				var answers []*keyrow.Response
				if how == ByCompleter {
					m.complete(ctx, t, key)
				} else if a := m.retry(ctx, t, key); a != nil {
					answers = append(answers, a)
				}
				m.settled(ctx, t, key, answers...)
			})
		}
	}
}

// matrix is what every scenario of one CrashMatrix or PairMatrix call
// shares.
type matrix[Req, State any] struct {
	cfg     Config[Req, State]
	tenant  string
	compare CompareFunc
	// prefix starts every key of this call, so that the matrix can run
	// again on the same database (another test, -count=2).
	prefix    string
	points    []phase.Point
	crashFree *keyrow.Response
	// ledgers watch each scenario's key, by key.
	ledgersMu sync.Mutex
	ledgers   map[string]*ledger
	// lockWaitSQL is the statement that tells whether a run waits on a
	// lock, chosen once for the database.
	lockWaitOnce sync.Once
	lockWaitSQL  string
}

func newMatrix[Req, State any](t *testing.T, cfg Config[Req, State]) *matrix[Req, State] {
	t.Helper()
	switch {
	case cfg.Client == nil:
		t.Fatal("phasetest: Config.Client is nil")
	case cfg.Workflow == nil:
		t.Fatal("phasetest: Config.Workflow is nil")
	case cfg.Request == nil:
		t.Fatal("phasetest: Config.Request is nil")
	}
	m := &matrix[Req, State]{cfg: cfg, tenant: tenant(cfg), compare: cfg.Compare, prefix: uniquePrefix(), ledgers: map[string]*ledger{}}
	if m.compare == nil {
		m.compare = IgnoreFields()
	}
	key := m.key("crash-free")
	points, crashFree := points(t, cfg, key, m.newLedger(t, key))
	// A phase re-run after a serialization failure passes its points again;
	// each is crashed or paused at the first time only.
	for _, p := range points {
		if !slices.Contains(m.points, p) {
			m.points = append(m.points, p)
		}
	}
	m.crashFree = crashFree
	row := m.inspect(context.Background(), t, key)
	m.ledger(key).settle(row)
	if cfg.Check != nil {
		cfg.Check(t, Scenario{Name: "crash-free", Tenant: m.tenant, Key: key, ID: row.ID, Response: m.crashFree})
	}
	return m
}

// noFaults overrides any Injector of the client's Config: the matrices
// inject their own faults and no others.
var noFaults = phase.InjectorFunc(func(context.Context, phase.Point) error { return nil })

// context returns the context of t's runs.
func (m *matrix[Req, State]) context(t *testing.T) context.Context {
	return phase.WithInjector(t.Context(), noFaults)
}

func (m *matrix[Req, State]) key(label string) string { return m.prefix + label }

// newLedger starts watching key for the scenario t.
func (m *matrix[Req, State]) newLedger(t testing.TB, key string) *ledger {
	l := newLedger(t, m.cfg.Client, m.tenant, key)
	m.ledgersMu.Lock()
	defer m.ledgersMu.Unlock()
	m.ledgers[key] = l
	return l
}

// ledger returns the ledger watching key.
func (m *matrix[Req, State]) ledger(key string) *ledger {
	m.ledgersMu.Lock()
	defer m.ledgersMu.Unlock()
	return m.ledgers[key]
}

// watch returns ctx for a run of the workflow under test by who, watched by
// key's ledger, consulting inner (nil for no fault) at its fault points.
func (m *matrix[Req, State]) watch(ctx context.Context, key, who string, inner phase.Injector) (context.Context, *watcher) {
	return m.ledger(key).watch(ctx, who, m.cfg.Workflow.Phases(), inner)
}

// scenario runs f as the subtest name, on a key of its own named after
// label. A failed scenario's key is then run to its end if it can be, so
// that the completer passes of later scenarios do not meet it; if it
// cannot, the matrix stops there.
func (m *matrix[Req, State]) scenario(t *testing.T, name, label string, f func(t *testing.T, key string)) {
	t.Helper()
	key := m.key(label)
	if t.Run(name, func(t *testing.T) {
		m.newLedger(t, key)
		f(t, key)
	}) {
		return
	}
	ctx := phase.WithInjector(context.Background(), noFaults)
	if _, err := m.cfg.Client.Unlock(ctx, m.tenant, key); err != nil {
		t.Fatalf("after %s failed: %v", name, err)
	}
	out, err := m.cfg.Workflow.Run(ctx, m.cfg.Client, m.tenant, key, m.cfg.Request(key))
	if err == nil && out.Kind == phase.OutcomeOnHold {
		// A key on hold waits for an operator; the completer skips it.
		return
	}
	if err != nil || out.Response == nil {
		t.Fatalf("%s failed and left key %s unfinished (%v); the matrix stops here, since the completer would take the key up in later scenarios", name, key, err)
	}
}

// run sends the scenario's request under key, as a client would.
func (m *matrix[Req, State]) run(ctx context.Context, t *testing.T, key string) *phase.Outcome {
	t.Helper()
	ctx, _ = m.watch(ctx, key, byRetry, nil)
	out, err := m.cfg.Workflow.Run(ctx, m.cfg.Client, m.tenant, key, m.cfg.Request(key))
	if held := m.heldBy(ctx, t, key, err); held != nil {
		return held
	}
	if err != nil {
		t.Fatalf("request under %s: %v", key, err)
	}
	return out
}

// heldBy returns the outcome of a run that ended with err by putting key
// on hold for an operator for a documented reason (see Scenario.Hold), or
// nil.
func (m *matrix[Req, State]) heldBy(ctx context.Context, t *testing.T, key string, err error) *phase.Outcome {
	t.Helper()
	if !errors.Is(err, phase.ErrOutcomeUnknown) {
		return nil
	}
	if row := m.inspect(ctx, t, key); m.ledger(key).heldForOperator(row) {
		return &phase.Outcome{Kind: phase.OutcomeOnHold, Hold: row.Hold}
	}
	return nil
}

// retry sends the request again after a crash and returns its answer, or
// nil when the key is on hold for an operator for a documented reason (see
// Scenario.Hold).
func (m *matrix[Req, State]) retry(ctx context.Context, t *testing.T, key string) *keyrow.Response {
	t.Helper()
	out := m.run(ctx, t, key)
	if out.Kind == phase.OutcomeOnHold && m.ledger(key).heldForOperator(m.inspect(ctx, t, key)) {
		return nil
	}
	if out.Response == nil {
		t.Fatalf("retry of %s with its lease free: the key was %s, want it run to its response", key, describe(out))
	}
	return out.Response
}

func (m *matrix[Req, State]) unlock(ctx context.Context, t *testing.T, key string) {
	t.Helper()
	if _, err := m.cfg.Client.Unlock(ctx, m.tenant, key); err != nil {
		t.Fatal(err)
	}
}

func (m *matrix[Req, State]) inspect(ctx context.Context, t testing.TB, key string) *keyrow.Row {
	t.Helper()
	row, err := m.cfg.Client.Inspect(ctx, m.tenant, key)
	if err != nil {
		t.Fatalf("inspect %s: %v", key, err)
	}
	return row
}

// complete runs the completer, which must take key since its lease is free.
func (m *matrix[Req, State]) complete(ctx context.Context, t *testing.T, key string) {
	t.Helper()
	watched, _ := m.watch(ctx, key, byCompleter, nil)
	res, err := m.cfg.Client.Complete(watched)
	if err != nil {
		t.Fatalf("completer: %v", err)
	}
	m.completerTook(ctx, t, key, res)
}

// completerTook fails t when a completer pass left key alone although it
// was free and unfinished: the client's completer waits for idle keys.
func (m *matrix[Req, State]) completerTook(ctx context.Context, t *testing.T, key string, res recovery.PassResult) {
	t.Helper()
	row := m.inspect(ctx, t, key)
	if res.Claimed > 0 || row.FinishedAt != nil || row.Hold != "" || row.LeaseLeft > 0 {
		return
	}
	stuck, err := m.cfg.Client.List(ctx, keyrow.ListFilter{Status: keyrow.StatusStuck, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(stuck.Keys, func(r keyrow.Row) bool { return r.ID == row.ID }) {
		t.Fatalf("the completer did not take key %s although its lease is free, because the key has not been idle "+
			"for the completer's StuckAfter: for WithCompleter, build the client with Config.Completer.StuckAfter = -1 "+
			"(and Backoff = -1), so that it takes a key as soon as its lease is free; the default waits %v",
			key, recovery.DefaultStuckAfter)
	}
	t.Fatalf("the completer did not take key %s although its lease is free and the key is due: "+
		"another transaction holds a lock on the key's row, which the completer skips", key)
}

// settled checks a scenario's key once every run on it has ended: it is
// finished with the crash-free answer, every answer a run gave is the stored
// one, a retry replays it byte for byte, no lease or pending mark is left
// (see ledger.settle), and Check holds. A key may instead end on hold for
// an operator for a documented reason: then a retry must leave it so.
func (m *matrix[Req, State]) settled(ctx context.Context, t *testing.T, key string, answers ...*keyrow.Response) {
	t.Helper()
	row := m.inspect(ctx, t, key)
	if m.ledger(key).settle(row) {
		t.Logf("key %s is on hold for an operator: phase %s's call may have been sent and cannot be reconciled (%s)",
			key, row.CallPending, row.LastError)
		if len(answers) > 0 {
			t.Fatalf("a run answered %d %q, but the key is on hold", answers[0].Status, answers[0].Body)
		}
		if again := m.run(ctx, t, key); again.Kind != phase.OutcomeOnHold {
			t.Fatalf("retry of a key on hold for an operator: the key was %s, want it still on hold", describe(again))
		}
		if m.cfg.Check != nil {
			m.cfg.Check(t, Scenario{Name: t.Name(), Tenant: m.tenant, Key: key, ID: row.ID, Hold: row.Hold})
		}
		return
	}
	if row.FinishedAt == nil || row.ResponseStatus == nil {
		t.Fatalf("key %s did not converge: recovery point %s, hold %q, last error %q", key, row.RecoveryPoint, row.Hold, row.LastError)
	}
	final := &keyrow.Response{Status: *row.ResponseStatus, Header: row.ResponseHeader, Body: row.ResponseBody}
	if err := m.compare(m.crashFree, final); err != nil {
		t.Fatalf("the recovered response differs from the crash-free one: %v", err)
	}
	for _, a := range answers {
		if !identical(a, final) {
			t.Fatalf("a run answered %d %q, but the key stored %d %q", a.Status, a.Body, final.Status, final.Body)
		}
	}
	// Every later retry replays the same bytes.
	if again := m.run(ctx, t, key); again.Kind != phase.OutcomeReplayed || !identical(again.Response, final) {
		t.Fatalf("retry after recovery: the key was %s, want a replay of %d %q", describe(again), final.Status, final.Body)
	}
	if m.cfg.Check != nil {
		m.cfg.Check(t, Scenario{Name: t.Name(), Tenant: m.tenant, Key: key, ID: row.ID, Response: final})
	}
}

// identical reports whether two responses are the same bytes.
func identical(a, b *keyrow.Response) bool {
	return a.Status == b.Status && string(a.Body) == string(b.Body) &&
		maps.EqualFunc(a.Header, b.Header, slices.Equal[[]string])
}

// describe says what a run found its key in, for a message.
func describe(out *phase.Outcome) string {
	switch out.Kind {
	case phase.OutcomeNew, phase.OutcomeResumed:
		return fmt.Sprintf("run to its response (%v)", out.Kind)
	case phase.OutcomeReplayed:
		return "already finished: the run replayed its stored response"
	case phase.OutcomeInFlight:
		return fmt.Sprintf("in progress: another run holds its lease (retry after %v)", out.RetryAfter)
	case phase.OutcomeMismatch:
		return "first used with another request"
	case phase.OutcomeOnHold:
		return fmt.Sprintf("on hold (%s)", out.Hold)
	case phase.OutcomeElsewhere:
		return fmt.Sprintf("left for definition %s, which the client neither runs nor adopts", out.Definition)
	}
	return string(out.Kind)
}

// uniquePrefix starts the keys of one matrix run.
func uniquePrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:]) + "-"
}

func tenant[Req, State any](cfg Config[Req, State]) string {
	if cfg.Tenant == "" {
		return DefaultTenant
	}
	return cfg.Tenant
}
