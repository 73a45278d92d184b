package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type job struct {
	N int `json:"n"`
}

// effectsWorkflow records one effect row per run of its first phase, so a
// key run twice shows up as two rows.
func effectsWorkflow(t testing.TB, db *pgxpool.Pool) *phase.Workflow[job, struct{}] {
	t.Helper()
	if _, err := db.Exec(context.Background(), `CREATE TABLE effects (ikey text NOT NULL, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	w, err := phase.NewWorkflow("effects",
		phase.Local("effect_recorded", func(ctx context.Context, tx pgx.Tx, in *phase.Input[job, struct{}]) (phase.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, in.Key, in.Req.N)
			return phase.Next(), err
		}),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[job, struct{}]) (phase.Result, error) {
			return phase.JSON(201, in.Req), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// client returns a client for ws whose completer takes keys at once and
// retries them without backoff; mutate adjusts the config further.
func client(t testing.TB, db *pgxpool.Pool, mutate func(*phase.Config), ws ...phase.Registered) *phase.Client {
	t.Helper()
	cfg := phase.Config{Logger: quiet, Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := phase.NewClient(db, &cfg, ws...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// abandon stores a key that a request started and left without finishing.
func abandon(t testing.TB, db *pgxpool.Pool, workflow, key string, req string) {
	t.Helper()
	ctx := context.Background()
	fp, err := keyrow.Fingerprint(workflow, []byte(req))
	if err != nil {
		t.Fatal(err)
	}
	out, row, err := store.Acquire(ctx, db, store.Request{Distributed: pgtest.OnCitus(), Tenant: "acme", Key: key, Workflow: workflow,
		Fingerprint: fp, Params: []byte(req), TTL: time.Minute})
	if err != nil || out != store.New {
		t.Fatalf("acquire %s: %v %v", key, out, err)
	}
	if err := store.Release(ctx, db, row.Holder(), "client went away", "", store.EndedIdle, false); err != nil {
		t.Fatal(err)
	}
}

func TestTwoCompletersRacingOver1000AbandonedKeysFinishEachOnce(t *testing.T) {
	t.Parallel()
	for _, route := range pgtest.Routes() {
		t.Run(route.Name, func(t *testing.T) {
			t.Parallel()
			twoCompletersRacing(t, route.PoolWith(t, func(cfg *pgxpool.Config) {
				cfg.MaxConns = 20
			}))
		})
	}
}

// twoCompletersRacing abandons 1000 keys and checks that two completers
// draining them at once run each exactly once.
func twoCompletersRacing(t *testing.T, db *pgxpool.Pool) {
	ctx := context.Background()
	w := effectsWorkflow(t, db)
	const keys = 1000
	abandonMany(t, db, w.Name(), keys)

	var (
		wg      sync.WaitGroup
		results [2]recovery.PassResult
		errs    [2]error
	)
	for i := range 2 {
		c := client(t, db, func(c *phase.Config) { c.Completer.BatchSize = 50; c.Completer.Concurrency = 4 }, w)
		wg.Go(func() { results[i], errs[i] = c.Complete(ctx) })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if got := results[0].Completed + results[1].Completed; got != keys || results[0].Failed+results[1].Failed != 0 {
		t.Fatalf("completed %d+%d (failed %d+%d), want %d in all", results[0].Completed, results[1].Completed,
			results[0].Failed, results[1].Failed, keys)
	}
	if results[0].Completed == 0 || results[1].Completed == 0 {
		t.Logf("one completer did all the work: %+v", results)
	}
	var rows, distinct, unfinished int
	if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT ikey), (SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished') FROM effects`).
		Scan(&rows, &distinct, &unfinished); err != nil {
		t.Fatal(err)
	}
	if rows != keys || distinct != keys || unfinished != 0 {
		t.Fatalf("%d effects over %d keys, %d unfinished; want each of %d keys run exactly once", rows, distinct, unfinished, keys)
	}
}

func TestCompleterLeavesKeysAClientMayStillRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	w := effectsWorkflow(t, db)
	abandon(t, db, w.Name(), "fresh", `{"n":1}`)
	c := client(t, db, func(c *phase.Config) { c.Completer.StuckAfter = time.Hour }, w)
	res, err := c.Complete(ctx)
	if err != nil || res.Claimed != 0 {
		t.Fatalf("pass over a key idle for less than StuckAfter: %+v %v, want nothing claimed", res, err)
	}
}

func TestCompleterSkipsKeysUnderALiveLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	w := effectsWorkflow(t, db)
	fp, _ := keyrow.Fingerprint(w.Name(), []byte(`{"n":1}`))
	if _, _, err := store.Acquire(ctx, db, store.Request{Distributed: pgtest.OnCitus(), Tenant: "acme", Key: "busy", Workflow: w.Name(),
		Fingerprint: fp, Params: []byte(`{"n":1}`), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	res, err := client(t, db, nil, w).Complete(ctx)
	if err != nil || res.Claimed != 0 {
		t.Fatalf("pass: %+v %v, want the leased key left alone", res, err)
	}
}

func TestCompleterLeavesKeysOfWorkflowsItDoesNotKnow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	w := effectsWorkflow(t, db)
	// A key of a workflow that only a newer (or older) deployment runs.
	abandon(t, db, "next-release-workflow", "k1", `{}`)
	var events []keyrow.Event
	var mu sync.Mutex
	c := client(t, db, func(c *phase.Config) {
		c.Completer.MaxAttempts = 1
		c.Hooks = []phase.Hook{phase.ObserverFunc(func(_ context.Context, ev keyrow.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		})}
	}, w)
	for range 3 {
		res, err := c.Complete(ctx)
		if err != nil || res != (recovery.PassResult{}) {
			t.Fatalf("pass: %+v %v, want the unknown workflow's key left alone", res, err)
		}
	}
	if len(events) != 0 {
		t.Fatalf("events %+v, want none", events)
	}
	info, err := c.Inspect(ctx, "acme", "k1")
	if err != nil || info.Attempts != 1 || info.Hold != "" || info.Failures != 0 || info.LeaseExpiresAt != nil {
		t.Fatalf("key %+v %v; want it untouched: one attempt, not held, not leased", info, err)
	}
	counts, err := c.Counts(ctx)
	if err != nil || counts.Stuck+counts.Waiting != 1 {
		t.Fatalf("counts %+v %v; want the key counted as waiting or stuck", counts, err)
	}
	// A process that knows the workflow finishes it.
	next, err := phase.NewWorkflow("next-release-workflow", phase.Local("done", func(ctx context.Context, tx pgx.Tx, in *phase.Input[struct{}, struct{}]) (phase.Result, error) {
		return phase.JSON(200, "ok"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := client(t, db, nil, next).Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("pass of a process that knows the workflow: %+v %v", res, err)
	}
}

func TestRunningAnUnregisteredWorkflowIsAnError(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	w := effectsWorkflow(t, db)
	other, err := phase.NewWorkflow("other", phase.Local("done", func(ctx context.Context, tx pgx.Tx, in *phase.Input[job, struct{}]) (phase.Result, error) {
		return phase.JSON(200, "ok"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, db, nil, other)
	if _, err := phase.Handler(c, w, phase.HTTPConfig[job]{Tenant: func(*http.Request) (string, error) { return "acme", nil }}); !errors.Is(err, phase.ErrNotRegistered) {
		t.Fatalf("Handler of an unregistered workflow: %v, want ErrNotRegistered", err)
	}
	if _, err := w.Run(context.Background(), c, "acme", "k1", job{N: 1}); !errors.Is(err, phase.ErrNotRegistered) {
		t.Fatalf("Run of an unregistered workflow: %v, want ErrNotRegistered", err)
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d keys stored, %v; want none", n, err)
	}
}

// mailer is a foreign service whose outcome can be lost.
type mailer struct {
	mu    sync.Mutex
	calls int
	sent  map[string]bool
	// lose makes the next call send the mail and then lose the answer.
	lose bool
	// refuse makes the next call fail without sending.
	refuse bool
}

func (m *mailer) send(key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.refuse {
		m.refuse = false
		return phase.MaybeHappened(errors.New("connection reset before the server read the message"))
	}
	m.sent[key] = true
	if m.lose {
		m.lose = false
		return phase.MaybeHappened(errors.New("timeout waiting for the server's answer"))
	}
	return nil
}

func (m *mailer) wasSent(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sent[key]
}

func mailWorkflow(t testing.TB, m *mailer) *phase.Workflow[job, struct{ Sent bool }] {
	t.Helper()
	type run = phase.Input[job, struct{ Sent bool }]
	record := func(ctx context.Context, tx pgx.Tx, in *run, sent bool) (phase.Result, error) {
		in.State.Sent = sent
		return phase.JSON(200, map[string]bool{"sent": sent}), nil
	}
	send := phase.Foreign("mailed",
		func(ctx context.Context, in *run) (bool, error) { return true, m.send(in.DownstreamKey()) },
		record)
	// The mail provider can be asked whether a message with this key went out.
	send = phase.Reconciled(send, func(ctx context.Context, in *run) (bool, phase.Verdict, error) {
		if m.wasSent(in.DownstreamKey()) {
			return true, phase.Happened, nil
		}
		return false, phase.NotHappened, nil
	}, record)
	w, err := phase.NewWorkflow("mail", send)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestUnknownOutcomeIsReconciledToDoneWithoutRepeatingTheCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	m := &mailer{sent: map[string]bool{}, lose: true}
	w := mailWorkflow(t, m)
	rn := client(t, db, nil, w)
	if _, err := w.Run(ctx, rn, "acme", "k1", job{N: 1}); !errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("first run: %v, want unknown outcome", err)
	}
	if out, err := w.Run(ctx, rn, "acme", "k1", job{N: 1}); err != nil || out.Kind != phase.OutcomeOnHold {
		t.Fatalf("client retry while unknown: %+v %v, want parked (409)", out, err)
	}
	res, err := rn.Complete(ctx)
	if err != nil || res.Completed != 1 {
		t.Fatalf("completer: %+v %v", res, err)
	}
	out, err := w.Run(ctx, rn, "acme", "k1", job{N: 1})
	if err != nil || out.Kind != phase.OutcomeReplayed || string(out.Response.Body) != "{\"sent\":true}\n" {
		t.Fatalf("after reconcile: %+v %v", out, err)
	}
	if m.calls != 1 {
		t.Fatalf("%d calls, want 1: reconciliation must not repeat the call", m.calls)
	}
}

func TestUnknownOutcomeIsReconciledToRetryAndCalledAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	m := &mailer{sent: map[string]bool{}, refuse: true}
	w := mailWorkflow(t, m)
	rn := client(t, db, nil, w)
	if _, err := w.Run(ctx, rn, "acme", "k1", job{N: 1}); !errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("first run: %v, want unknown outcome", err)
	}
	if res, err := rn.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("completer: %+v %v", res, err)
	}
	out, err := w.Run(ctx, rn, "acme", "k1", job{N: 1})
	if err != nil || out.Kind != phase.OutcomeReplayed || string(out.Response.Body) != "{\"sent\":true}\n" {
		t.Fatalf("after retry: %+v %v", out, err)
	}
	if m.calls != 2 || len(m.sent) != 1 {
		t.Fatalf("%d calls, %d mails; want the refused call made again once", m.calls, len(m.sent))
	}
}

func TestKeyThatKeepsFailingGoesDeadAndAnOperatorRevivesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	var broken atomic.Bool
	broken.Store(true)
	w, err := phase.NewWorkflow("fragile", phase.Local("done", func(ctx context.Context, tx pgx.Tx, in *phase.Input[job, struct{}]) (phase.Result, error) {
		if broken.Load() {
			return phase.Result{}, errors.New("downstream bug")
		}
		return phase.JSON(200, "ok"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	rn := client(t, db, nil, w)
	if _, err := w.Run(ctx, rn, "acme", "k1", job{}); err == nil {
		t.Fatal("first run succeeded")
	}
	var (
		mu   sync.Mutex
		dead []keyrow.Event
	)
	c := client(t, db, func(c *phase.Config) {
		c.Completer.MaxAttempts = 3
		c.Hooks = []phase.Hook{phase.ObserverFunc(func(_ context.Context, ev keyrow.Event) {
			mu.Lock()
			defer mu.Unlock()
			if ev.Kind == keyrow.EventDead {
				dead = append(dead, ev)
			}
		})}
	}, w)
	res, err := c.Complete(ctx)
	if err != nil || res.Failed != 3 || res.Dead != 1 || len(dead) != 1 {
		t.Fatalf("drain: %+v %v dead events %v; want three failures of the completer's own, then buried", res, err, dead)
	}
	out, err := w.Run(ctx, c, "acme", "k1", job{})
	if err != nil || out.Kind != phase.OutcomeOnHold || out.Hold != keyrow.HoldDead {
		t.Fatalf("client retry of a dead key: %+v %v, want on hold, dead", out, err)
	}
	counts, err := c.Counts(ctx)
	if err != nil || counts.Dead != 1 || counts.Total() != 1 {
		t.Fatalf("counts %+v %v, want one dead key", counts, err)
	}

	// The bug is fixed; an operator retries the key.
	broken.Store(false)
	if err := c.Retry(ctx, "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("drain after revival: %+v %v", res, err)
	}
}

func TestReaperUnderTrafficDeletesOnlyExpiredFinishedKeys(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "it ages keys with an UPDATE calling a volatile function, which Citus refuses")
	ctx := context.Background()
	db := pgtest.Pool(t)
	w := effectsWorkflow(t, db)
	rn := client(t, db, func(c *phase.Config) { c.Reaper.BatchSize = 7 }, w)
	for i := range 50 {
		if _, err := w.Run(ctx, rn, "acme", fmt.Sprintf("old-%d", i), job{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Run(ctx, rn, "acme", "recent", job{N: 1}); err != nil {
		t.Fatal(err)
	}
	abandon(t, db, w.Name(), "in-flight", `{"n":1}`)
	abandon(t, db, w.Name(), "unknown", `{"n":2}`)
	abandon(t, db, w.Name(), "dead", `{"n":3}`)
	for _, q := range []string{
		`UPDATE idempotency_keys SET finished_at = now() - interval '2 days' WHERE idempotency_key LIKE 'old-%'`,
		`UPDATE idempotency_keys SET last_run_at = now() - interval '2 days',
		     lock_token = gen_random_uuid(), locked_at = now(), lock_expires_at = now() + interval '1 hour' WHERE idempotency_key = 'in-flight'`,
		`UPDATE idempotency_keys SET last_run_at = now() - interval '2 days', hold = 'unknown' WHERE idempotency_key = 'unknown'`,
		`UPDATE idempotency_keys SET last_run_at = now() - interval '2 days', hold = 'dead' WHERE idempotency_key = 'dead'`,
		pgtest.TimePassedSQL,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	// Traffic on new keys and replays of old ones while the reaper runs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var trafficErr atomic.Value
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := w.Run(ctx, rn, "acme", fmt.Sprintf("live-%d-%d", g, i), job{N: i}); err != nil {
					trafficErr.Store(err)
					return
				}
				if _, err := w.Run(ctx, rn, "acme", fmt.Sprintf("old-%d", i%50), job{N: i % 50}); err != nil {
					trafficErr.Store(err)
					return
				}
			}
		})
	}
	res, err := rn.Reap(ctx)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if v := trafficErr.Load(); v != nil {
		t.Fatalf("traffic failed during reaping: %v", v)
	}
	// A delete batch skips keys a replay had locked at that instant; the
	// next run takes them.
	more, err := rn.Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res.Reaped += more.Reaped
	res.Abandoned += more.Abandoned
	if res.Abandoned != 1 {
		t.Fatalf("expired %d, want 1 (the dead key)", res.Abandoned)
	}
	var left []string
	rows, err := db.Query(ctx, `SELECT idempotency_key FROM idempotency_keys WHERE idempotency_key NOT LIKE 'live-%' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// Old keys replayed during the run may have been re-created as new keys
	// after their deletion; only the protected keys must certainly remain.
	want := map[string]bool{"dead": true, "in-flight": true, "recent": true, "unknown": true}
	for _, k := range left {
		delete(want, k)
	}
	if len(want) != 0 {
		t.Fatalf("reaper deleted protected keys %v; left %v", want, left)
	}
	var oldFinishedLeft int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE finished_at < now() - interval '1 day'`).Scan(&oldFinishedLeft); err != nil {
		t.Fatal(err)
	}
	if oldFinishedLeft != 0 || res.Reaped < 50 {
		t.Fatalf("%d expired keys left, %d deleted; want all 50 old keys gone", oldFinishedLeft, res.Reaped)
	}
	out, err := w.Run(ctx, rn, "acme", "dead", job{N: 3})
	if err != nil || out.Kind != phase.OutcomeReplayed || out.Response.Status != 500 {
		t.Fatalf("late retry of the abandoned key: %+v %v, want a replayed terminal 500", out, err)
	}
}

// One observer, given once in the client's hooks, counts the events of
// runs, of the completer and of the reaper, from one list.
func TestOneObserverSeesRunsTheCompleterAndTheReaper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	w := effectsWorkflow(t, db)
	metrics := &recovery.Metrics{}
	rn := client(t, db, func(c *phase.Config) { c.Hooks = []phase.Hook{phase.ObserverFunc(metrics.Observe)} }, w)
	if _, err := w.Run(ctx, rn, "acme", "served", job{N: 1}); err != nil {
		t.Fatal(err)
	}
	abandon(t, db, w.Name(), "abandoned", `{"n":2}`)
	if res, err := rn.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("pass: %+v %v, want the abandoned key completed", res, err)
	}
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET finished_at = now() - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	pgtest.TimePassed(t, db)
	if res, err := rn.Reap(ctx); err != nil || res.Reaped != 2 {
		t.Fatalf("reap: %+v %v, want both keys deleted", res, err)
	}
	got := metrics.Snapshot()
	for kind, want := range map[keyrow.EventKind]int64{
		keyrow.EventNew:       1, // the served key
		keyrow.EventResumed:   1, // the completer's run of the abandoned key
		keyrow.EventFinished:  2,
		keyrow.EventCompleted: 1,
		keyrow.EventReaped:    2,
	} {
		if got[string(kind)] != want {
			t.Errorf("%s: %d events, want %d (all: %v)", kind, got[string(kind)], want, got)
		}
	}
}
