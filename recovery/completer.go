package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
)

// Defaults for CompleterConfig's zero values.
const (
	// DefaultInterval is how often the completer looks for due keys.
	DefaultInterval = 5 * time.Second
	// DefaultBatchSize is how many keys one pass claims.
	DefaultBatchSize = 100
	// DefaultMinIdle is how long a key's last run must be past before the
	// completer takes it, leaving a client time to retry on its own. The
	// reference implementation waits 60 seconds.
	DefaultMinIdle = time.Minute
	// DefaultBackoff is the pause added after a key's second attempt,
	// doubling with each further one up to DefaultMaxBackoff.
	DefaultBackoff    = 30 * time.Second
	DefaultMaxBackoff = time.Hour
	// DefaultMaxAttempts is how many runs a key gets before it is dead.
	DefaultMaxAttempts = 10
	// DefaultConcurrency is how many claimed keys run at once.
	DefaultConcurrency = 4
)

// Resumer continues a claimed key with its workflow. *phase.Runner is one.
type Resumer interface {
	Resume(ctx context.Context, row *keyrow.Row) error
}

// CompleterConfig configures a Completer. Zero values mean the default.
type CompleterConfig struct {
	// Pool is the database holding idempotency_keys. Required.
	Pool *pgxpool.Pool
	// Resumer runs the workflows, by name. Required.
	Resumer Resumer
	// Interval between passes (default DefaultInterval).
	Interval time.Duration
	// BatchSize caps the keys claimed per pass (default DefaultBatchSize).
	BatchSize int
	// Concurrency caps the claimed keys run at once (default
	// DefaultConcurrency).
	Concurrency int
	// MinIdle (default DefaultMinIdle; negative: none).
	MinIdle time.Duration
	// Backoff and MaxBackoff shape per-key backoff (defaults DefaultBackoff,
	// DefaultMaxBackoff; negative Backoff: none).
	Backoff    time.Duration
	MaxBackoff time.Duration
	// MaxAttempts before a key moves to the dead hold (default
	// DefaultMaxAttempts).
	MaxAttempts int
	// LockTTL is the lease on claimed keys (default lockttl.DefaultTTL); it
	// should match the runner's.
	LockTTL time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Observer, when set, receives the completer's events.
	Observer Observer
}

func (c *CompleterConfig) validate() error {
	if c.Pool == nil || c.Resumer == nil {
		return errors.New("recovery: CompleterConfig.Pool and Resumer are required")
	}
	c.Interval = orDefault(c.Interval, DefaultInterval)
	c.BatchSize = orDefault(c.BatchSize, DefaultBatchSize)
	c.Concurrency = orDefault(c.Concurrency, DefaultConcurrency)
	c.MinIdle = max(orDefault(c.MinIdle, DefaultMinIdle), 0)
	c.Backoff = max(orDefault(c.Backoff, DefaultBackoff), 0)
	c.MaxBackoff = orDefault(c.MaxBackoff, DefaultMaxBackoff)
	c.MaxAttempts = orDefault(c.MaxAttempts, DefaultMaxAttempts)
	c.LockTTL = orDefault(c.LockTTL, lockttl.DefaultTTL)
	if c.Interval < 0 || c.BatchSize < 0 || c.Concurrency < 0 || c.MaxAttempts < 0 || c.LockTTL < 0 || c.MaxBackoff < 0 {
		return errors.New("recovery: CompleterConfig values must not be negative")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Completer finishes keys that no client is waiting for: requests that
// crashed or failed part-way and were never retried, and keys awaiting
// reconciliation. Any number of completers, in any number of processes, may
// run against one database: each key is claimed by one of them at a time
// through the same lease a request takes, with no leader.
type Completer struct {
	cfg CompleterConfig
	bg  background
}

// NewCompleter returns a completer configured by cfg.
func NewCompleter(cfg CompleterConfig) (*Completer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Completer{cfg: cfg}, nil
}

// PassResult counts what one pass did.
type PassResult struct {
	// Claimed keys were taken for a run.
	Claimed int
	// Completed keys ran to their stored response.
	Completed int
	// Failed keys ran and failed again; they keep their recovery point.
	Failed int
	// Buried keys moved to the dead hold.
	Buried int
}

// RunOnce makes one pass: buries keys out of attempts, claims up to
// BatchSize due keys, and resumes them.
func (c *Completer) RunOnce(ctx context.Context) (PassResult, error) {
	var res PassResult
	buried, err := keyrow.Bury(ctx, c.cfg.Pool, c.cfg.MaxAttempts)
	if err != nil {
		return res, err
	}
	res.Buried = buried
	if buried > 0 {
		c.observe(Event{Kind: EventDead, Count: buried})
		c.cfg.Logger.Warn("keys moved to dead after too many attempts", "count", buried, "max_attempts", c.cfg.MaxAttempts)
	}
	rows, err := keyrow.Claim(ctx, c.cfg.Pool, keyrow.ClaimParams{
		Limit: c.cfg.BatchSize, MinIdle: c.cfg.MinIdle, Backoff: c.cfg.Backoff, MaxBackoff: c.cfg.MaxBackoff,
		Unknown: true, TTL: c.cfg.LockTTL,
	})
	if err != nil {
		return res, err
	}
	res.Claimed = len(rows)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sem = make(chan struct{}, c.cfg.Concurrency)
	)
	for _, row := range rows {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := c.resume(ctx, row)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Failed++
			} else {
				res.Completed++
			}
		})
	}
	wg.Wait()
	return res, nil
}

func (c *Completer) resume(ctx context.Context, row *keyrow.Row) error {
	log := c.cfg.Logger.With("workflow", row.Workflow, "tenant", row.Tenant, "key", row.Key, "recovery_point", row.RecoveryPoint)
	err := c.cfg.Resumer.Resume(ctx, row)
	if err == nil {
		c.observe(Event{Kind: EventCompleted, Count: 1, Workflow: row.Workflow, Tenant: row.Tenant, Key: row.Key})
		log.Info("completer finished key", "attempt", row.Attempts)
		return nil
	}
	c.observe(Event{Kind: EventFailed, Count: 1, Workflow: row.Workflow, Tenant: row.Tenant, Key: row.Key, Err: err})
	log.Warn("completer could not finish key", "attempt", row.Attempts, "err", err)
	// A workflow this process does not know (an old name, or a service
	// that registers fewer workflows) is reported and handed back, not
	// crashed on; another process may know it.
	if errors.Is(err, ErrUnknownWorkflow) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := keyrow.Release(rctx, c.cfg.Pool, row.ID, row.LockToken, err.Error(), row.Hold); rerr != nil && !errors.Is(rerr, keyrow.ErrLeaseLost) {
			log.Error("could not free the lease of a key with an unknown workflow", "err", rerr)
		}
	}
	return err
}

// Drain runs passes until one finds nothing to claim, and returns the sum.
// Tests and shutdown paths use it to finish everything that is due now.
func (c *Completer) Drain(ctx context.Context) (PassResult, error) {
	var total PassResult
	for {
		res, err := c.RunOnce(ctx)
		total.Claimed += res.Claimed
		total.Completed += res.Completed
		total.Failed += res.Failed
		total.Buried += res.Buried
		if err != nil || res.Claimed == 0 {
			return total, err
		}
	}
}

// Start runs passes every Interval in the background until Stop or ctx
// ends. It returns an error if the completer is already running.
func (c *Completer) Start(ctx context.Context) error {
	return c.bg.start(ctx, "completer", c.cfg.Interval, func(ctx context.Context) {
		if _, err := c.RunOnce(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Error("completer pass failed", "err", err)
		}
	})
}

// Stop ends the background passes and waits for the current one, or for
// ctx, whichever comes first. Keys a cancelled pass was running keep their
// recovery point and are resumed later.
func (c *Completer) Stop(ctx context.Context) error { return c.bg.stop(ctx) }

func (c *Completer) observe(ev Event) {
	if c.cfg.Observer != nil {
		c.cfg.Observer(ev)
	}
}

// background runs a periodic pass on its own goroutine between start and
// stop; the completer and the reaper are both one.
type background struct {
	mu     sync.Mutex
	name   string
	cancel context.CancelFunc
	done   chan struct{}
}

// start calls pass at once and then every interval until stop or ctx ends.
func (b *background) start(ctx context.Context, name string, interval time.Duration, pass func(context.Context)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		return fmt.Errorf("recovery: %s already started", name)
	}
	b.name = name
	ctx, b.cancel = context.WithCancel(ctx)
	b.done = make(chan struct{})
	go func() {
		defer close(b.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			pass(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// stop cancels the passes and waits for the current one, or for ctx.
func (b *background) stop(ctx context.Context) error {
	b.mu.Lock()
	cancel, done := b.cancel, b.done
	b.cancel = nil
	b.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("recovery: stop %s: %w", b.name, ctx.Err())
	}
}
