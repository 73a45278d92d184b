package payouts_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/atomicphase/atomicphase/consume"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

func TestMain(m *testing.M) { phasetest.Main(m) }

// PayoutArgs is a River job that pays a supplier once.
type PayoutArgs struct {
	Supplier string `json:"supplier"`
	Cents    int64  `json:"cents"`
}

// Kind implements river.JobArgs.
func (PayoutArgs) Kind() string { return "payout" }

// PayoutWorker is the recipe: it runs the payout workflow under the job's
// id, for the merchant that owns the supplier, and tells River what the
// verdict says. A job River runs again (a retry after an error, a rescue
// after its worker died) resumes the workflow; one whose workflow finished
// replays it and completes.
type PayoutWorker struct {
	river.WorkerDefaults[PayoutArgs]
	Pool   *pgxpool.Pool
	Client *phase.Client
	// LookupTimeout bounds the supplier's lookup. Defaults to 5 s.
	LookupTimeout time.Duration
	Workflow      *phase.Workflow[PayoutArgs, payoutState]
	// Context, in tests, adds fault injection to a job's run.
	Context func(ctx context.Context, job *river.Job[PayoutArgs]) context.Context
}

// Work implements river.Worker.
func (w *PayoutWorker) Work(ctx context.Context, job *river.Job[PayoutArgs]) error {
	if w.Context != nil {
		ctx = w.Context(ctx, job)
	}
	v := w.run(ctx, job)
	switch v.Action {
	case consume.Ack:
		return nil
	case consume.Drop:
		// Never run again; River keeps the job as cancelled, with the
		// error, for an operator.
		return river.JobCancel(v.Err)
	case consume.Retry:
		if v.Outcome != nil && v.Outcome.Kind == phase.OutcomeInFlight {
			// Another attempt holds the key (River rescued a job whose
			// worker still runs): wait for its lease, without spending
			// an attempt.
			return river.JobSnooze(v.Delay)
		}
		// Fail the attempt: River's retry policy spaces the attempts and
		// discards the job after its MaxAttempts, keeping each error;
		// the key stays for the completer or an operator.
		if v.Err == nil {
			return fmt.Errorf("payout: key %s", v.Outcome.Kind)
		}
		return v.Err
	}
	// Abandon: fail the attempt, as a killed worker would.
	return v.Err
}

// run finds whose key the job uses and runs the workflow under it. A
// supplier nobody owns is refused; a lookup that fails may not fail again
// (phase.ErrUnavailable).
func (w *PayoutWorker) run(ctx context.Context, job *river.Job[PayoutArgs]) consume.Verdict {
	lookupCtx, cancel := context.WithTimeout(ctx, cmp.Or(w.LookupTimeout, 5*time.Second))
	defer cancel()
	var merchant string
	err := w.Pool.QueryRow(lookupCtx, `SELECT merchant FROM suppliers WHERE id = $1`, job.Args.Supplier).Scan(&merchant)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return consume.ReadFailed(&phase.RequestError{Status: 422, Detail: "unknown supplier", Field: "supplier"})
	case err != nil:
		return consume.ReadFailed(fmt.Errorf("payout: supplier lookup: %w: %w", phase.ErrUnavailable, err))
	}
	return consume.Run(ctx, w.Client, w.Workflow, merchant, "job-"+strconv.FormatInt(job.ID, 10), job.Args)
}

type payoutState struct {
	Transfer string `json:"transfer"`
}

// bank is a fake bank that honours idempotency keys, as the transfer
// phase (Repeatable) requires; it counts the calls by key, and refuses
// every transfer to the suppliers in refused.
type bank struct {
	mu      sync.Mutex
	calls   map[string]int
	refused map[string]bool
}

func newBank() *bank { return &bank{calls: map[string]int{}, refused: map[string]bool{}} }

func (b *bank) transfer(key, supplier string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls[key]++
	if b.refused[supplier] {
		return "", errors.New("bank: transfers to " + supplier + " refused")
	}
	return "tr_" + key, nil
}

// transfers returns the calls the bank got, by downstream key.
func (b *bank) transfers() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.calls)
}

func payoutWorkflow(b *bank) (*phase.Workflow[PayoutArgs, payoutState], error) {
	type in = phase.Input[PayoutArgs, payoutState]
	return phase.NewWorkflow("payout",
		phase.Local("recorded", func(ctx context.Context, tx pgx.Tx, r *in) (phase.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO payouts (key_id, supplier, cents) VALUES ($1, $2, $3)`, r.ID, r.Req.Supplier, r.Req.Cents)
			return phase.Next(), err
		}),
		phase.Foreign("transferred",
			func(ctx context.Context, r *in) (string, error) { return b.transfer(r.DownstreamKey(), r.Req.Supplier) },
			func(ctx context.Context, tx pgx.Tx, r *in, id string) (phase.Result, error) {
				r.State.Transfer = id
				_, err := tx.Exec(ctx, `UPDATE payouts SET transfer = $2 WHERE key_id = $1`, r.ID, id)
				return phase.JSON(200, r.State), err
			}).Repeatable())
}

// setup returns a database with River's tables and a payouts table, and a
// phase client that runs the payout workflow with b.
func setup(t *testing.T, b *bank) (*pgxpool.Pool, *phase.Client, *phase.Workflow[PayoutArgs, payoutState]) {
	t.Helper()
	ctx := context.Background()
	pool := phasetest.Pool(t)
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payouts (key_id uuid PRIMARY KEY, supplier text NOT NULL, cents bigint NOT NULL, transfer text);
		CREATE TABLE suppliers (id text PRIMARY KEY, merchant text NOT NULL);
		INSERT INTO suppliers SELECT 's' || i, 'merchant-' || i FROM generate_series(0, 9) i`); err != nil {
		t.Fatal(err)
	}
	w, err := payoutWorkflow(b)
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pool, &phase.Config{LeaseTTL: time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))}, w)
	if err != nil {
		t.Fatal(err)
	}
	return pool, c, w
}

// TestARiverJobCrashedMidWorkflowPaysOnce runs payout jobs on a real
// River client whose first attempt of each crashes at a different point
// of the workflow, as a killed worker would stop (its lease kept): River
// runs each job again, the next attempt waits for the lease (snoozed
// while the key is in flight) and resumes the workflow, and each job
// completes with one transfer.
func TestARiverJobCrashedMidWorkflowPaysOnce(t *testing.T) {
	t.Parallel()
	b := newBank()
	pool, c, w := setup(t, b)
	ctx := t.Context()
	points := []phase.Point{
		{Phase: "recorded", Stage: phase.BeforeCommit},
		{Phase: "transferred", Stage: phase.AfterCall},
		{Phase: "transferred", Stage: phase.AfterCommit},
	}
	worker := &PayoutWorker{Pool: pool, Client: c, Workflow: w, Context: func(ctx context.Context, job *river.Job[PayoutArgs]) context.Context {
		if job.Attempt == 1 {
			return phase.WithInjector(ctx, phase.CrashAt(points[job.Args.Cents%int64(len(points))]))
		}
		return ctx
	}}
	// The first retry after a crash comes at once; the lease decides when
	// it may run.
	jobs, done := startRiver(t, pool, worker, retryAt(100*time.Millisecond))
	for i := range len(points) {
		if _, err := jobs.Insert(ctx, PayoutArgs{Supplier: fmt.Sprintf("s%d", i), Cents: int64(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	completed := 0
	for completed < len(points) {
		select {
		case ev := <-done:
			if ev.Kind == river.EventKindJobCompleted {
				completed++
				if ev.Job.Attempt < 2 {
					t.Errorf("job %d completed at attempt %d, want a crash first", ev.Job.ID, ev.Job.Attempt)
				}
			} else if ev.Kind != river.EventKindJobFailed {
				t.Fatalf("job %d: %s", ev.Job.ID, ev.Kind)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d jobs completed", completed, len(points))
		}
	}
	// A crash after the call repeats it, under the same key, which the
	// bank honours: one transfer. Any other crash point calls once.
	for key, n := range b.calls {
		if n > 2 {
			t.Errorf("the bank was called %d times under %s", n, key)
		}
	}
	if len(b.calls) != len(points) {
		t.Errorf("the bank made transfers under %d keys, want %d", len(b.calls), len(points))
	}
	var rows, transferred int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(transfer) FROM payouts`).Scan(&rows, &transferred); err != nil || rows != len(points) || transferred != rows {
		t.Errorf("payouts: %d rows, %d transferred (%v); want %d", rows, transferred, err, len(points))
	}
}

// TestAJobWorkedTwiceReplays works one job twice, as River does when it
// rescues a job whose worker was presumed dead after it finished: the
// second run replays the stored answer and completes the job, with no
// second transfer.
func TestAJobWorkedTwiceReplays(t *testing.T) {
	t.Parallel()
	b := newBank()
	pool, c, w := setup(t, b)
	worker := &PayoutWorker{Pool: pool, Client: c, Workflow: w}
	job := &river.Job[PayoutArgs]{JobRow: &rivertype.JobRow{ID: 42, Attempt: 1}, Args: PayoutArgs{Supplier: "s1", Cents: 100}}
	for range 2 {
		if err := worker.Work(t.Context(), job); err != nil {
			t.Fatal(err)
		}
	}
	v := consume.Run(t.Context(), c, w, "merchant-1", "job-42", job.Args)
	if v.Action != consume.Ack || v.Outcome.Kind != phase.OutcomeReplayed {
		t.Errorf("third run: %v %+v, want an acknowledged replay", v.Action, v.Outcome)
	}
	changed := job.Args
	changed.Cents++
	if v := consume.Run(t.Context(), c, w, "merchant-1", "job-42", changed); v.Action != consume.Drop || !errors.Is(v.Err, consume.ErrReused) {
		t.Errorf("another payload under the same id: %v %v, want a drop", v.Action, v.Err)
	}
	if len(b.calls) != 1 {
		t.Errorf("the bank made transfers under %d keys, want 1", len(b.calls))
	}
}

// startRiver starts a River client that works payout jobs with worker and
// retries them as policy says, and returns it with the events of the jobs
// that completed, failed or were cancelled.
func startRiver(t *testing.T, pool *pgxpool.Pool, worker *PayoutWorker, policy river.ClientRetryPolicy) (*river.Client[pgx.Tx], <-chan *river.Event) {
	t.Helper()
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	jobs, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:        slog.New(slog.DiscardHandler),
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:       workers,
		FetchCooldown: 50 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond,
		RetryPolicy: policy,
	})
	if err != nil {
		t.Fatal(err)
	}
	events, cancel := jobs.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled, river.EventKindJobFailed)
	t.Cleanup(cancel)
	if err := jobs.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = jobs.Stop(context.Background()) })
	return jobs, events
}

// retryAt is a River retry policy with a fixed pause.
type retryAt time.Duration

func (d retryAt) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(time.Duration(d)) }

// doubling is a River retry policy that doubles the pause from its value
// with each attempt: River's default policy (attempt⁴ seconds) in
// miniature.
type doubling time.Duration

func (d doubling) NextRetry(job *rivertype.JobRow) time.Time {
	return time.Now().Add(time.Duration(d) << max(job.Attempt-1, 0))
}

// TestARiverJobRetriesThroughALookupOutageAndPaysOnce holds a lock on the
// suppliers table, so that the worker's lookup of the job's merchant
// times out, as it would while the store is down: each attempt fails (not
// cancelled), River retries it after a growing pause, and once the lock
// is gone the job pays, once.
func TestARiverJobRetriesThroughALookupOutageAndPaysOnce(t *testing.T) {
	t.Parallel()
	b := newBank()
	pool, c, w := setup(t, b)
	ctx := t.Context()
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.WithoutCancel(ctx))
	if _, err := lock.Exec(ctx, `LOCK TABLE suppliers IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	worker := &PayoutWorker{Pool: pool, Client: c, Workflow: w, LookupTimeout: 200 * time.Millisecond}
	jobs, events := startRiver(t, pool, worker, doubling(200*time.Millisecond))
	inserted, err := jobs.Insert(ctx, PayoutArgs{Supplier: "s3", Cents: 300}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		job, err := jobs.JobGet(ctx, inserted.Job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(job.Errors) >= 2 {
			break
		}
		if job.State == rivertype.JobStateCancelled || job.State == rivertype.JobStateDiscarded || time.Now().After(deadline) {
			t.Fatalf("job %s during the outage, with errors %v; want two failed attempts", job.State, job.Errors)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	ev := next(t, events)
	for ev.Kind == river.EventKindJobFailed && ev.Job.State != rivertype.JobStateDiscarded { // a failed attempt, retried
		ev = next(t, events)
	}
	if ev.Kind != river.EventKindJobCompleted || ev.Job.Attempt < 3 {
		t.Fatalf("job %s at attempt %d, want completed after two failed attempts", ev.Kind, ev.Job.Attempt)
	}
	for _, e := range ev.Job.Errors {
		if !strings.Contains(e.Error, phase.ErrUnavailable.Error()) {
			t.Errorf("attempt %d failed with %q, want the store unavailable", e.Attempt, e.Error)
		}
	}
	if calls := slices.Collect(maps.Values(b.transfers())); !slices.Equal(calls, []int{1}) {
		t.Errorf("the bank got calls %v by key, want one call under one key", calls)
	}
}

// TestAJobThatKeepsFailingIsDiscardedAfterItsAttempts sends a payout the
// bank keeps refusing, and one to a supplier nobody owns. The first fails
// each attempt, River retries it after a doubling pause and discards it
// after its MaxAttempts, with each attempt's error, its key left
// unfinished; the second is cancelled at its first attempt, and no key is
// stored.
func TestAJobThatKeepsFailingIsDiscardedAfterItsAttempts(t *testing.T) {
	t.Parallel()
	b := newBank()
	b.refused["s4"] = true
	pool, c, w := setup(t, b)
	ctx := t.Context()
	worker := &PayoutWorker{Pool: pool, Client: c, Workflow: w}
	const pause = 200 * time.Millisecond
	jobs, events := startRiver(t, pool, worker, doubling(pause))
	refused, err := jobs.Insert(ctx, PayoutArgs{Supplier: "s4", Cents: 400}, &river.InsertOpts{MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := jobs.Insert(ctx, PayoutArgs{Supplier: "nobody", Cents: 500}, &river.InsertOpts{MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	ended := map[int64]*river.Event{}
	for len(ended) < 2 {
		ev := next(t, events)
		if ev.Job.State == rivertype.JobStateDiscarded || ev.Job.State == rivertype.JobStateCancelled {
			ended[ev.Job.ID] = ev
		}
	}

	r := ended[refused.Job.ID].Job
	if r.State != rivertype.JobStateDiscarded || r.Attempt != 3 || len(r.Errors) != 3 {
		t.Fatalf("refused payout: %s at attempt %d with %d errors, want discarded after 3", r.State, r.Attempt, len(r.Errors))
	}
	for i, e := range r.Errors {
		if !strings.Contains(e.Error, "refused") {
			t.Errorf("attempt %d failed with %q, want the bank's refusal", e.Attempt, e.Error)
		}
		if i > 0 {
			if gap := e.At.Sub(r.Errors[i-1].At); gap < pause<<(i-1) {
				t.Errorf("attempt %d came %v after the one before, want at least %v", e.Attempt, gap, pause<<(i-1))
			}
		}
	}
	if calls := slices.Collect(maps.Values(b.transfers())); !slices.Equal(calls, []int{3}) {
		t.Errorf("the bank got calls %v by key, want 3 under one key", calls)
	}
	row, err := c.Inspect(ctx, "merchant-4", "job-"+strconv.FormatInt(r.ID, 10))
	if err != nil {
		t.Fatal(err)
	}
	if row.FinishedAt != nil || row.LeaseLeft != 0 || row.Attempts != 3 {
		t.Errorf("key finished at %v, lease left %v, %d runs; want it unfinished and free after 3", row.FinishedAt, row.LeaseLeft, row.Attempts)
	}

	u := ended[unknown.Job.ID].Job
	if u.State != rivertype.JobStateCancelled || u.Attempt != 1 || len(u.Errors) != 1 || !strings.Contains(u.Errors[0].Error, "unknown supplier") {
		t.Errorf("unknown supplier: %s at attempt %d, errors %v; want cancelled at once", u.State, u.Attempt, u.Errors)
	}
	var keys int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&keys); err != nil || keys != 1 {
		t.Errorf("%d keys stored (%v), want the refused payout's only", keys, err)
	}
}

// next returns the next job event, or fails the test after 30 s.
func next(t *testing.T, events <-chan *river.Event) *river.Event {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no job event in 30 s")
		return nil
	}
}
