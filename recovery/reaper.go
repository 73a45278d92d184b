package recovery

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/keyrow"
)

// Defaults for ReaperConfig's zero values.
const (
	// DefaultRetention is how long a finished key is kept and replayed;
	// Stripe keeps keys at least 24 hours.
	DefaultRetention = 24 * time.Hour
	// DefaultReapBatch is how many keys one delete removes; small batches
	// keep each transaction and its locks short while traffic runs.
	DefaultReapBatch = 1000
	// DefaultReapInterval is how often the reaper runs.
	DefaultReapInterval = time.Minute
)

// ReaperConfig configures a Reaper. Zero values mean the default.
type ReaperConfig struct {
	// Pool is the database holding idempotency_keys. Required.
	Pool *pgxpool.Pool
	// Retention (default DefaultRetention).
	Retention time.Duration
	// BatchSize (default DefaultReapBatch).
	BatchSize int
	// Interval (default DefaultReapInterval).
	Interval time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Observer, when set, receives EventReaped and EventExpired.
	Observer Observer
}

// Reaper deletes finished keys once their retention is over, in small
// batches, and closes abandoned keys first so that they can be deleted too.
//
// # Abandoned keys
//
// A key that never finished (the completer gave up on it, or no completer
// ran) and has been idle for the whole retention is given a terminal 500
// "request abandoned" response rather than deleted. A client retrying it
// late gets that answer instead of a fresh run that could repeat side
// effects; one retention later the reaper deletes it like any finished key.
// Keys in flight or awaiting reconciliation are never touched.
type Reaper struct {
	cfg ReaperConfig
	bg  background
}

// NewReaper returns a reaper configured by cfg.
func NewReaper(cfg ReaperConfig) (*Reaper, error) {
	if cfg.Pool == nil {
		return nil, errors.New("recovery: ReaperConfig.Pool is required")
	}
	cfg.Retention = orDefault(cfg.Retention, DefaultRetention)
	cfg.BatchSize = orDefault(cfg.BatchSize, DefaultReapBatch)
	cfg.Interval = orDefault(cfg.Interval, DefaultReapInterval)
	if cfg.Retention < 0 || cfg.BatchSize < 0 || cfg.Interval < 0 {
		return nil, errors.New("recovery: ReaperConfig values must not be negative")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Reaper{cfg: cfg}, nil
}

// ReapResult counts what a run did.
type ReapResult struct {
	// Expired keys were abandoned and got their terminal response.
	Expired int
	// Deleted keys were finished and past retention.
	Deleted int
}

// RunOnce closes abandoned keys and deletes expired ones, batch after
// batch, until none is left or ctx ends.
func (r *Reaper) RunOnce(ctx context.Context) (ReapResult, error) {
	var res ReapResult
	for {
		n, err := keyrow.Expire(ctx, r.cfg.Pool, r.cfg.Retention, r.cfg.BatchSize)
		res.Expired += n
		if err != nil {
			return res, err
		}
		if n < r.cfg.BatchSize {
			break
		}
	}
	if res.Expired > 0 {
		r.observe(Event{Kind: EventExpired, Count: res.Expired})
		r.cfg.Logger.Warn("abandoned keys closed with a terminal response", "count", res.Expired)
	}
	for {
		n, err := keyrow.Reap(ctx, r.cfg.Pool, r.cfg.Retention, r.cfg.BatchSize)
		res.Deleted += n
		if n > 0 {
			r.observe(Event{Kind: EventReaped, Count: n})
		}
		if err != nil {
			return res, err
		}
		if n < r.cfg.BatchSize {
			return res, nil
		}
	}
}

// Start runs the reaper every Interval in the background until Stop or ctx
// ends. It returns an error if the reaper is already running.
func (r *Reaper) Start(ctx context.Context) error {
	return r.bg.start(ctx, "reaper", r.cfg.Interval, func(ctx context.Context) {
		if res, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("reaper run failed", "err", err, "deleted", res.Deleted)
		}
	})
}

// Stop ends the background runs and waits for the current one, or for ctx.
func (r *Reaper) Stop(ctx context.Context) error { return r.bg.stop(ctx) }

func (r *Reaper) observe(ev Event) {
	if r.cfg.Observer != nil {
		r.cfg.Observer(ev)
	}
}
