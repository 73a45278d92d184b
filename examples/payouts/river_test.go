package payouts_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
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
// id, and tells River what the verdict says. A job River runs again (a
// retry after an error, a rescue after its worker died) resumes the
// workflow; one whose workflow finished replays it and completes.
type PayoutWorker struct {
	river.WorkerDefaults[PayoutArgs]
	Client   *phase.Client
	Workflow *phase.Workflow[PayoutArgs, payoutState]
	// Context, in tests, adds fault injection to a job's run.
	Context func(ctx context.Context, job *river.Job[PayoutArgs]) context.Context
}

// Work implements river.Worker.
func (w *PayoutWorker) Work(ctx context.Context, job *river.Job[PayoutArgs]) error {
	if w.Context != nil {
		ctx = w.Context(ctx, job)
	}
	v := consume.Run(ctx, w.Client, w.Workflow, "river", "job-"+strconv.FormatInt(job.ID, 10), job.Args)
	switch v.Action {
	case consume.Ack:
		return nil
	case consume.Retry:
		return river.JobSnooze(v.Delay)
	case consume.Drop:
		return river.JobCancel(v.Err)
	}
	// Abandon: fail the attempt; River runs the job again after its
	// retry backoff.
	return v.Err
}

type payoutState struct {
	Transfer string `json:"transfer"`
}

// bank is a fake bank that honours idempotency keys, as the transfer
// phase (Repeatable) requires; it counts the calls by key.
type bank struct {
	mu    sync.Mutex
	calls map[string]int
}

func (b *bank) transfer(key string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls[key]++
	return "tr_" + key
}

func payoutWorkflow(b *bank) (*phase.Workflow[PayoutArgs, payoutState], error) {
	type in = phase.Input[PayoutArgs, payoutState]
	return phase.NewWorkflow("payout",
		phase.Local("recorded", func(ctx context.Context, tx pgx.Tx, r *in) (phase.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO payouts (key_id, supplier, cents) VALUES ($1, $2, $3)`, r.ID, r.Req.Supplier, r.Req.Cents)
			return phase.Next(), err
		}),
		phase.Foreign("transferred",
			func(ctx context.Context, r *in) (string, error) { return b.transfer(r.DownstreamKey()), nil },
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
	if _, err := pool.Exec(ctx, `CREATE TABLE payouts (key_id uuid PRIMARY KEY, supplier text NOT NULL, cents bigint NOT NULL, transfer text)`); err != nil {
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
	b := &bank{calls: map[string]int{}}
	pool, c, w := setup(t, b)
	ctx := t.Context()
	points := []phase.Point{
		{Phase: "recorded", Stage: phase.BeforeCommit},
		{Phase: "transferred", Stage: phase.AfterCall},
		{Phase: "transferred", Stage: phase.AfterCommit},
	}
	worker := &PayoutWorker{Client: c, Workflow: w, Context: func(ctx context.Context, job *river.Job[PayoutArgs]) context.Context {
		if job.Attempt == 1 {
			return phase.WithInjector(ctx, phase.CrashAt(points[job.Args.Cents%int64(len(points))]))
		}
		return ctx
	}}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	jobs, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:        slog.New(slog.DiscardHandler),
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:       workers,
		FetchCooldown: 50 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond,
		// The first retry after a crash comes at once; the lease decides
		// when it may run.
		RetryPolicy: retryAt(100 * time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := jobs.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled, river.EventKindJobFailed)
	defer cancel()
	if err := jobs.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = jobs.Stop(context.Background()) })
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
	b := &bank{calls: map[string]int{}}
	_, c, w := setup(t, b)
	worker := &PayoutWorker{Client: c, Workflow: w}
	job := &river.Job[PayoutArgs]{JobRow: &rivertype.JobRow{ID: 42, Attempt: 1}, Args: PayoutArgs{Supplier: "s", Cents: 100}}
	for range 2 {
		if err := worker.Work(t.Context(), job); err != nil {
			t.Fatal(err)
		}
	}
	v := consume.Run(t.Context(), c, w, "river", "job-42", job.Args)
	if v.Action != consume.Ack || v.Outcome.Kind != phase.OutcomeReplayed {
		t.Errorf("third run: %v %+v, want an acknowledged replay", v.Action, v.Outcome)
	}
	changed := job.Args
	changed.Cents++
	if v := consume.Run(t.Context(), c, w, "river", "job-42", changed); v.Action != consume.Drop || !errors.Is(v.Err, consume.ErrReused) {
		t.Errorf("another payload under the same id: %v %v, want a drop", v.Action, v.Err)
	}
	if len(b.calls) != 1 {
		t.Errorf("the bank made transfers under %d keys, want 1", len(b.calls))
	}
}

// retryAt is a River retry policy with a fixed pause.
type retryAt time.Duration

func (d retryAt) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(time.Duration(d)) }
