package ride

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/phase"
)

//go:embed schema.sql
var schema string

//go:embed distribute.sql
var distributeSQL string

// Demo riders seeded by Seed: one whose card works, one whose card is
// declined by the fake Stripe (and by Stripe's test mode, for a real test
// customer set up that way).
const (
	UserEmail     = "user@example.com"
	DeclinedEmail = "declined@example.com"
)

// Customers the demo riders are charged as. DeclinedCustomer matches
// fakestripe.DeclineCustomer.
const (
	UserCustomer     = "cus_user"
	DeclinedCustomer = "cus_declined"
)

// migrateLockID is the advisory lock key that serialises concurrent Migrate
// calls (the bytes of "ridesmig" as a bigint).
const migrateLockID = 0x72696465736d6967

// Migrate applies the atomicphase schema (with atomicphase.Migrate), River's
// migrations, and the example's own tables. It is safe to run at every start
// and from several processes at once: every transaction it runs takes an
// advisory lock first, so concurrent runs wait for each other. River's
// migrator takes no lock of its own, and CREATE ... IF NOT EXISTS alone still
// races on the catalog's unique indexes.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool, false)
}

// Distribute is Migrate for a Citus coordinator with its workers added: it
// distributes the key table with atomicphase.Distribute, and the example's
// tables as distribute.sql says (users a reference table; rides,
// audit_records and receipts by tenant, co-located with the keys), so that
// each phase runs on the node that holds its key. River's tables stay on the
// coordinator. Like Migrate it is safe to run at every start; tables already
// distributed are left as they are.
func Distribute(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool, true)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, citus bool) error {
	keys := atomicphase.Migrate
	if citus {
		keys = atomicphase.Distribute
	}
	if err := keys(ctx, pool); err != nil {
		return err
	}
	// River's migrator logs warnings to stdout unless given a logger; the
	// errors it returns say all there is.
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("rides: river migrator: %w", err)
	}
	// One River migration per transaction, as River applies them: a
	// migration may use an enum value that an earlier one added, which
	// Postgres refuses within the transaction that added it.
	for {
		applied, err := migrateStep(ctx, pool, func(tx pgx.Tx) (bool, error) {
			res, err := migrator.MigrateTx(ctx, tx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{MaxSteps: 1})
			if err != nil {
				return false, fmt.Errorf("river migrate: %w", err)
			}
			return len(res.Versions) > 0, nil
		})
		if err != nil {
			return err
		}
		if !applied {
			break
		}
	}
	_, err = migrateStep(ctx, pool, func(tx pgx.Tx) (bool, error) {
		// Tables that exist are left alone, without a statement: on Citus
		// even CREATE TABLE IF NOT EXISTS of a distributed table reaches
		// every node, and a process must start while one is down. schema
		// creates receipts last, in one transaction with the others.
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('receipts') IS NOT NULL`).Scan(&exists); err != nil {
			return true, err
		}
		if !exists {
			if _, err := tx.Exec(ctx, schema); err != nil {
				return true, err
			}
		}
		if !citus {
			return true, nil
		}
		var done bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
			WHERE logicalrelid = to_regclass('rides'))`).Scan(&done)
		if err != nil || done {
			return true, err
		}
		// One statement at a time: Citus passes the text of a foreign key's
		// statement on to the workers, which refuse several commands in one.
		for stmt := range strings.SplitAfterSeq(distributeSQL, ";\n") {
			if strings.TrimSpace(stmt) == "" {
				continue
			}
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return true, fmt.Errorf("distribute: %w", err)
			}
		}
		return true, nil
	})
	return err
}

// migrateStep runs step in a transaction that holds the migration lock, and
// commits it.
func migrateStep(ctx context.Context, pool *pgxpool.Pool, step func(pgx.Tx) (bool, error)) (bool, error) {
	// READ COMMITTED, so that what step reads after the lock wait includes
	// what the previous holder committed.
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return false, fmt.Errorf("rides: migrate: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLockID)); err != nil {
		return false, fmt.Errorf("rides: migrate: lock: %w", err)
	}
	done, err := step(tx)
	if err != nil {
		return false, fmt.Errorf("rides: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("rides: migrate: %w", err)
	}
	return done, nil
}

// Seed stores the two demo riders; running it again changes nothing.
func Seed(ctx context.Context, pool *pgxpool.Pool) error {
	// Riders already stored are not written again: on Citus users is a
	// reference table, whose writes reach every node and fail while one is
	// down, and a process must start while one is.
	var seeded int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM users WHERE email = ANY($1)`,
		[]string{UserEmail, DeclinedEmail}).Scan(&seeded)
	if err != nil {
		return fmt.Errorf("rides: seed: %w", err)
	}
	if seeded == 2 {
		return nil
	}
	_, err = pool.Exec(ctx, `
		INSERT INTO users (email, stripe_customer_id) VALUES ($1, $2), ($3, $4)
		ON CONFLICT (email) DO NOTHING`, UserEmail, UserCustomer, DeclinedEmail, DeclinedCustomer)
	if err != nil {
		return fmt.Errorf("rides: seed: %w", err)
	}
	return nil
}

// Config configures an App. Zero values mean the documented default.
type Config struct {
	// Pool is the database. Required; Migrate must have run on it.
	Pool *pgxpool.Pool
	// Stripe is the client charges go through. Required.
	Stripe *Stripe
	// Client configures the atomicphase client that runs the workflow and
	// its completer and reaper: lease TTL, observer, fault injector,
	// completer and reaper settings. Setting Client.Completer.Interval or
	// Client.Reaper.Interval to -1 leaves that part out of Start, for
	// running parts in separate processes. Its Logger defaults to Logger.
	Client phase.Config
	// WithoutWorker leaves River's receipt worker out of Start; receipts
	// are still queued, for a worker in another process.
	WithoutWorker bool
	// PollOnly makes River poll for jobs and leadership instead of
	// listening for notifications, which a transaction pooler such as
	// PgBouncer in transaction mode cannot carry: LISTEN holds a server
	// session that the pooler hands to other clients.
	PollOnly bool
	// Accept makes POST /rides answer 202 Accepted once the ride row is
	// committed, with Location: /rides/status/{key}, and charge and queue
	// the receipt in the background (the completer finishes what a crash
	// leaves). Otherwise the API answers when the receipt is queued.
	Accept bool
	// FraudCheck serves the next definition of the workflow, with a fraud
	// check before the charge (NewCheckedWorkflow), and keeps the first
	// one registered, so that its rides in flight finish as they began.
	FraudCheck bool
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// App is the rides service: the workflow, the client that runs it and
// finishes what clients abandon (its completer and reaper), the HTTP API,
// and River's receipt worker.
type App struct {
	cfg      Config
	Workflow *phase.Workflow[Request, State]
	Client   *phase.Client
	Jobs     *river.Client[pgx.Tx]
	handler  http.Handler
}

// New wires the service; Start runs its background parts.
func New(cfg Config) (*App, error) {
	if cfg.Pool == nil || cfg.Stripe == nil {
		return nil, errors.New("rides: Config.Pool and Config.Stripe are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &ReceiptWorker{Pool: cfg.Pool})
	riverCfg := &river.Config{
		Workers: workers,
		Logger:  cfg.Logger.With("component", "river"),
		// A receipt takes milliseconds, and sending one twice is a no-op
		// (see ReceiptWorker), so a job left running by a killed process is
		// rescued within seconds rather than River's default hour.
		JobTimeout:           10 * time.Second,
		RescueStuckJobsAfter: 15 * time.Second,
		PollOnly:             cfg.PollOnly,
	}
	if !cfg.WithoutWorker {
		riverCfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}}
		riverCfg.FetchPollInterval = 100 * time.Millisecond
	}
	jobs, err := river.NewClient(riverpgxv5.New(cfg.Pool), riverCfg)
	if err != nil {
		return nil, fmt.Errorf("rides: river client: %w", err)
	}
	w, err := NewWorkflow(cfg.Stripe, jobs)
	if err != nil {
		return nil, err
	}
	registered := []phase.Registered{w}
	if cfg.FraudCheck {
		// New rides run the checked definition; rides started before the
		// deploy drain on the one they started with.
		if w, err = NewCheckedWorkflow(cfg.Stripe, jobs); err != nil {
			return nil, err
		}
		registered = append([]phase.Registered{w}, registered...)
	}
	pc := cfg.Client
	if pc.Logger == nil {
		pc.Logger = cfg.Logger
	}
	client, err := phase.NewClient(cfg.Pool, &pc, registered...)
	if err != nil {
		return nil, err
	}
	hcfg := phase.HTTPConfig[Request]{Tenant: tenant(cfg.Pool), Decode: decode}
	if cfg.Accept {
		hcfg.AcceptAfter = "ride_created"
		hcfg.StatusLocation = func(r *http.Request, key string) string { return "/rides/status/" + url.PathEscape(key) }
	}
	rides, err := phase.Handler(client, w, hcfg)
	if err != nil {
		return nil, err
	}
	status, err := phase.StatusHandler(client, w, phase.StatusConfig{Tenant: tenant(cfg.Pool)})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	// The workflow's handler answers 405 itself to methods other than POST.
	mux.Handle("/rides", rides)
	mux.Handle("/rides/status/{key}", status)
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		phase.WriteProblem(rw, http.StatusNotFound, "not-found", "Not found",
			fmt.Sprintf("there is no %s; the API is POST /rides", r.URL.Path), 0)
	})
	return &App{cfg: cfg, Workflow: w, Client: client, Jobs: jobs, handler: mux}, nil
}

// Handler serves POST /rides and GET /rides/status/{key} (where a ride
// request stands; its stored answer once finished), and answers any other
// request with a problem+json error: 405 for another method, 404
// elsewhere.
func (a *App) Handler() http.Handler { return a.handler }

// Start runs the client's completer and reaper, and the receipt worker,
// each unless configured without it.
func (a *App) Start(ctx context.Context) error {
	if err := a.Client.Start(ctx); err != nil {
		return err
	}
	if a.cfg.WithoutWorker {
		return nil
	}
	if err := a.Jobs.Start(ctx); err != nil {
		return errors.Join(fmt.Errorf("rides: start river: %w", err), a.Client.Stop(ctx))
	}
	return nil
}

// Stop shuts down what Start started, gracefully: runs and receipt jobs in
// flight are given until ctx ends to finish. The client and the worker
// stop side by side, so each has all of ctx's time.
func (a *App) Stop(ctx context.Context) error {
	var jobsErr error
	var wg sync.WaitGroup
	if !a.cfg.WithoutWorker {
		wg.Go(func() { jobsErr = a.Jobs.Stop(ctx) })
	}
	err := a.Client.Stop(ctx)
	wg.Wait()
	return errors.Join(err, jobsErr)
}
