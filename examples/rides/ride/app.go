package ride

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stripe/stripe-go/v85"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

//go:embed schema.sql
var schema string

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

// Migrate applies the atomicphase schema, River's and the example's own.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := atomicphase.Migrate(ctx, pool); err != nil {
		return err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("rides: river migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("rides: river migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("rides: migrate: %w", err)
	}
	return nil
}

// Seed stores the two demo riders; running it again changes nothing.
func Seed(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		INSERT INTO users (email, stripe_customer_id) VALUES ($1, $2), ($3, $4)
		ON CONFLICT (email) DO NOTHING`, UserEmail, UserCustomer, DeclinedEmail, DeclinedCustomer)
	if err != nil {
		return fmt.Errorf("rides: seed: %w", err)
	}
	return nil
}

// DefaultStripeURL is Stripe's API.
const DefaultStripeURL = "https://api.stripe.com"

// NewStripeClient returns a stripe-go client for the API at baseURL (Stripe
// itself, the example's fake Stripe, or stripe-mock). stripe-go's own
// network retries are turned off: the workflow retries through its resumed
// runs, with the same idempotency key, and a retry inside one attempt would
// only hold the lease longer.
func NewStripeClient(baseURL, key string, hc *http.Client) *stripe.Client {
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(baseURL),
		HTTPClient:        hc,
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient(key, stripe.WithBackends(&stripe.Backends{API: backend, Connect: backend, Uploads: backend, MeterEvents: backend}))
}

// Config configures an App. Zero values mean the documented default.
type Config struct {
	// Pool is the database. Required; Migrate must have run on it.
	Pool *pgxpool.Pool
	// Stripe is the client charges go through. Required.
	Stripe *stripe.Client
	// Runner adjusts the runner's configuration (lease TTL, observer,
	// fault injector, logger); Pool is set by the App.
	Runner phase.Config
	// Completer adjusts the completer (Pool and Resumer are set by the App).
	Completer recovery.CompleterConfig
	// Reaper adjusts the reaper (Pool is set by the App).
	Reaper recovery.ReaperConfig
	// Without* leave a part out of Start, for running parts in separate
	// processes.
	WithoutCompleter, WithoutReaper, WithoutWorker bool
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// App is the rides service: the workflow, its runner, the HTTP API, and the
// background parts (completer, reaper, River receipt worker).
type App struct {
	cfg       Config
	Workflow  *phase.Workflow[Request, State]
	Runner    *phase.Runner
	Completer *recovery.Completer
	Reaper    *recovery.Reaper
	Jobs      *river.Client[pgx.Tx]
	handler   http.Handler
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
	rc := cfg.Runner
	rc.Pool = cfg.Pool
	if rc.Logger == nil {
		rc.Logger = cfg.Logger
	}
	rn, err := phase.NewRunner(rc, w)
	if err != nil {
		return nil, err
	}
	cc := cfg.Completer
	cc.Pool, cc.Resumer = cfg.Pool, rn
	if cc.LockTTL == 0 {
		cc.LockTTL = rn.LockTTL()
	}
	if cc.Logger == nil {
		cc.Logger = cfg.Logger
	}
	completer, err := recovery.NewCompleter(cc)
	if err != nil {
		return nil, err
	}
	reaperCfg := cfg.Reaper
	reaperCfg.Pool = cfg.Pool
	if reaperCfg.Logger == nil {
		reaperCfg.Logger = cfg.Logger
	}
	reaper, err := recovery.NewReaper(reaperCfg)
	if err != nil {
		return nil, err
	}
	rides, err := w.Handler(rn, phase.HTTPConfig[Request]{Tenant: tenant(cfg.Pool), Decode: decode})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /rides", rides)
	return &App{cfg: cfg, Workflow: w, Runner: rn, Completer: completer, Reaper: reaper, Jobs: jobs, handler: mux}, nil
}

// Handler serves POST /rides.
func (a *App) Handler() http.Handler { return a.handler }

// Start runs the completer, the reaper and the receipt worker, unless
// configured without them.
func (a *App) Start(ctx context.Context) error {
	if !a.cfg.WithoutWorker {
		if err := a.Jobs.Start(ctx); err != nil {
			return fmt.Errorf("rides: start river: %w", err)
		}
	}
	if !a.cfg.WithoutCompleter {
		if err := a.Completer.Start(ctx); err != nil {
			return err
		}
	}
	if !a.cfg.WithoutReaper {
		if err := a.Reaper.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops what Start started and waits for it, or for ctx.
func (a *App) Stop(ctx context.Context) error {
	errs := []error{a.Completer.Stop(ctx), a.Reaper.Stop(ctx)}
	if !a.cfg.WithoutWorker {
		errs = append(errs, a.Jobs.Stop(ctx))
	}
	return errors.Join(errs...)
}
