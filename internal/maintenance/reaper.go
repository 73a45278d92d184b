package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/recovery"
)

// Reaper deletes finished keys once their retention is over, in small
// batches, and closes abandoned keys first so that they can be deleted too.
// It also deletes the status history older than a day.
// A phase.Client builds one from Config.Reaper and runs it.
// It judges only the keys of the workflows it was given, each with its own
// retention, and never deletes a key before the retention the key recorded.
type Reaper struct {
	cfg    recovery.ReaperConfig
	db     store.Querier
	log    *slog.Logger
	bg     background
	scopes []Scope
	// Observe, when set, receives the reaper's events (the client's
	// observers).
	Observe func(ctx context.Context, ev keyrow.Event)
	// Distributed: see Completer.Distributed.
	Distributed func() bool
}

// Scope is the keys of one workflow that a reaper judges, and how long it
// keeps them at least.
type Scope struct {
	Workflow  string
	Retention time.Duration
}

// NewReaper returns a reaper over the keys of scopes, each workflow named
// once; cfg must have its defaults applied. phase.NewClient calls it. With no scopes it judges the
// keys of every workflow, with cfg.Retention: that is the reaper of a
// process that runs no workflow, such as the atomicphase command.
func NewReaper(cfg recovery.ReaperConfig, db store.Querier, log *slog.Logger, scopes []Scope) *Reaper {
	return &Reaper{cfg: cfg, db: db, log: log, scopes: scopes}
}

// Scopes returns the workflows the reaper judges now: those it was given,
// or every workflow that has finished keys, with the configured retention.
func (r *Reaper) Scopes(ctx context.Context) ([]Scope, error) {
	if len(r.scopes) > 0 {
		return r.scopes, nil
	}
	names, err := store.FinishedWorkflows(ctx, r.db)
	if err != nil {
		return nil, err
	}
	scopes := make([]Scope, len(names))
	for i, n := range names {
		scopes[i] = Scope{Workflow: n, Retention: r.cfg.Retention}
	}
	return scopes, nil
}

// Candidates reports what RunOnce would do if it started now, changing
// nothing.
func (r *Reaper) Candidates(ctx context.Context) (finished, abandoned int, err error) {
	if len(r.scopes) == 0 {
		return store.ReapCandidates(ctx, r.db, "", r.cfg.Retention)
	}
	for _, s := range r.scopes {
		f, a, err := store.ReapCandidates(ctx, r.db, s.Workflow, s.Retention)
		if err != nil {
			return finished, abandoned, err
		}
		finished, abandoned = finished+f, abandoned+a
	}
	return finished, abandoned, nil
}

// RunOnce closes abandoned keys and deletes expired ones, batch after
// batch with a pause between batches, until none is left or ctx ends.
func (r *Reaper) RunOnce(ctx context.Context) (recovery.ReapResult, error) {
	var res recovery.ReapResult
	expire := r.scopes
	if len(expire) == 0 {
		expire = []Scope{{Retention: r.cfg.Retention}}
	}
	for _, s := range expire {
		n, err := r.batches(ctx, func() (int, error) {
			return store.Expire(ctx, r.db, s.Workflow, s.Retention, r.cfg.BatchSize, distributed(r.Distributed))
		})
		res.Abandoned += n
		if err != nil {
			return res, err
		}
	}
	if res.Abandoned > 0 {
		r.observe(ctx, keyrow.Event{Kind: keyrow.EventAbandoned, Count: res.Abandoned})
		r.log.Warn("abandoned keys closed with a terminal response", "count", res.Abandoned)
	}
	r.trimHistory(ctx)
	scopes, err := r.Scopes(ctx)
	if err != nil {
		return res, err
	}
	for _, s := range scopes {
		n, err := r.batches(ctx, func() (int, error) {
			n, err := store.Reap(ctx, r.db, s.Workflow, s.Retention, r.cfg.BatchSize, distributed(r.Distributed))
			if n > 0 {
				r.observe(ctx, keyrow.Event{Kind: keyrow.EventReaped, Count: n, Workflow: s.Workflow})
			}
			return n, err
		})
		res.Reaped += n
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// batches runs batch until it changes fewer keys than a batch holds, with a
// pause between two, and returns how many keys the batches changed.
func (r *Reaper) batches(ctx context.Context, batch func() (int, error)) (int, error) {
	total := 0
	for {
		start := time.Now()
		n, err := batch()
		total += n
		if err != nil || n < r.cfg.BatchSize {
			return total, err
		}
		if err := r.pause(ctx, time.Since(start)); err != nil {
			return total, err
		}
	}
}

// pause waits between two batches: Pause, or as long as the batch before
// took when that was longer, so that the reaper keeps its connection busy
// at most half the time whatever the load makes its batches cost.
func (r *Reaper) pause(ctx context.Context, batch time.Duration) error {
	if r.cfg.Pause <= 0 {
		return nil
	}
	t := time.NewTimer(max(r.cfg.Pause, batch))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Start runs the reaper every Interval in the background until Stop or ctx
// ends.
func (r *Reaper) Start(ctx context.Context) error {
	return r.bg.Start(ctx, "reaper", func(ctx context.Context) time.Duration {
		began := time.Now()
		if res, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("reaper run failed", "err", err, "deleted", res.Reaped)
		}
		return r.cfg.Interval - time.Since(began)
	})
}

// Stop ends the background runs and waits for the current one, or for ctx.
func (r *Reaper) Stop(ctx context.Context) error { return r.bg.Stop(ctx) }

func (r *Reaper) observe(ctx context.Context, ev keyrow.Event) {
	if r.Observe != nil {
		r.Observe(ctx, ev)
	}
}

// background runs a periodic pass on its own goroutine between Start and
// Stop; the completer and the reaper are both one.
type background struct {
	mu     sync.Mutex
	name   string
	cancel context.CancelFunc
	// stop, closed by a graceful Stop, ends the passes after the current
	// one.
	stop chan struct{}
	done chan struct{}
	// passing is set while a pass runs. A pass starts only while stop is
	// open, both under mu, so Stop knows whether it has a pass to end.
	passing bool
}

// running reports whether the passes run, between Start and Stop.
func (b *background) running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cancel != nil
}

// begin reports whether a pass may start, none may after stop closed, and
// records that it runs.
func (b *background) begin(stop chan struct{}) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-stop:
		return false
	default:
		b.passing = true
		return true
	}
}

// ended records that the pass ended.
func (b *background) ended() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.passing = false
}

// Start calls pass at once, and again each time the wait pass returns has
// passed, until Stop or ctx ends.
func (b *background) Start(ctx context.Context, name string, pass func(context.Context) (wait time.Duration)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		return fmt.Errorf("%s %w", name, errAlreadyStarted)
	}
	b.name = name
	ctx, b.cancel = context.WithCancel(ctx)
	b.stop, b.done = make(chan struct{}), make(chan struct{})
	stop := b.stop
	go func() {
		defer close(b.done)
		for ctx.Err() == nil {
			if !b.begin(stop) {
				return
			}
			wait := pass(ctx)
			b.ended()
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop cancels the passes and waits for the current one, or for ctx.
func (b *background) Stop(ctx context.Context) error { return b.end(ctx, false) }

// StopGracefully lets the current pass finish, until ctx ends, and starts
// no other; when ctx ends first, it cancels the pass and waits for it.
func (b *background) StopGracefully(ctx context.Context) error { return b.end(ctx, true) }

// end stops the passes. It reports ctx's error only when a pass was under
// way and ctx ended before it did.
func (b *background) end(ctx context.Context, graceful bool) error {
	b.mu.Lock()
	cancel, stop, done := b.cancel, b.stop, b.done
	b.cancel = nil
	var passing bool
	if cancel != nil {
		close(stop)
		passing = b.passing
	}
	b.mu.Unlock()
	if cancel == nil {
		return nil
	}
	defer cancel()
	if !graceful {
		cancel()
	}
	if !passing {
		// Between passes: the goroutine returns at once.
		<-done
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	if graceful {
		// The pass's runs stop at their next step and free their leases
		// within the store's timeouts.
		cancel()
		<-done
	}
	return fmt.Errorf("stop %s: %w", b.name, ctx.Err())
}
