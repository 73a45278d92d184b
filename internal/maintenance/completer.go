package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/recovery"
)

// Resumer continues a claimed key with its workflow, within the client's
// run limits, and returns the time the run spent in foreign calls and
// reconcile functions. It must free or keep the key's lease as any run
// does. The claimed row is the library's own type: a phase.Client gives
// the Resumer, and builds the completer.
type Resumer func(ctx context.Context, row *store.Row) (calls time.Duration, err error)

// Completer finishes keys that no client is waiting for. A phase.Client
// builds one from Config.Completer and runs it; see package recovery's
// documentation for what a pass does.
type Completer struct {
	cfg     recovery.CompleterConfig
	db      store.Querier
	resumer Resumer
	// workflows and definitions, pairwise, are the definitions it resumes.
	workflows, definitions []string
	ttl                    time.Duration
	log                    *slog.Logger
	bg                     background
	// counting runs the counts of Start beside the passes.
	counting         background
	history, samples schedule
	// unanswered paces the warning that a Citus node did not answer the
	// scan for due keys.
	unanswered schedule
	pace       *pace
	burial     burial
	// slots holds, for each workflow with a cap of its own
	// (CompleterConfig.InFlight), a token per key it may run at once.
	slots map[string]chan struct{}
	// Around, when set, wraps every pass (the client's pass wrappers).
	Around func(ctx context.Context, pass func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error)
	// Observe, when set, receives the completer's events (the client's
	// observers).
	Observe func(ctx context.Context, ev keyrow.Event)
	// Distributed, when set, reports whether the key table is distributed
	// with Citus, which claims keys another way.
	Distributed func() bool
	// Live takes the process's live runs, to which it yields.
	Live Live
}

func distributed(f func() bool) bool { return f != nil && f() }

// NewCompleter returns a completer for the keys of the workflow definitions
// given pairwise by workflows and definitions, run by r, with leases of
// ttl. cfg must have its defaults applied. phase.NewClient calls it.
func NewCompleter(cfg recovery.CompleterConfig, db store.Querier, r Resumer, workflows, definitions []string, ttl time.Duration, log *slog.Logger) *Completer {
	slots := map[string]chan struct{}{}
	for name, n := range cfg.InFlight {
		if n > 0 {
			slots[name] = make(chan struct{}, n)
		}
	}
	c := &Completer{cfg: cfg, db: db, resumer: r, workflows: workflows, definitions: definitions, ttl: ttl, log: log,
		pace: newPace(cfg, ttl), slots: slots,
		history: schedule{every: time.Minute}, samples: schedule{every: store.SampleEvery}}
	c.pace.live = &c.Live
	return c
}

// RunOnce makes one pass: buries abandoned keys out of attempts when some
// may be (see burial), claims up to BatchSize due keys, and resumes them,
// at the pace the passes before it set.
func (c *Completer) RunOnce(ctx context.Context) (recovery.PassResult, error) {
	res, _, _, err := c.runOnce(ctx, streak{})
	return res, err
}

// streak holds the keys that the passes of a streak, passes run back to
// back, handed back. A key handed back goes behind every other due key
// (its last run is now), and, handed back by a completer, counts as a
// failure that backs it off; so a streak can claim batches of nothing but
// keys that wait for an operator or for another process while others are
// due behind them, and goes on. Once a pass claims nothing, or nothing but
// keys the streak handed back already, it has seen every due key.
type streak map[uuid.UUID]bool

// fresh records the keys a pass handed back and reports whether it claimed
// any key the streak had not handed back before.
func (s streak) fresh(res recovery.PassResult, back []uuid.UUID) bool {
	fresh := res.Claimed > res.HandedBack
	for _, id := range back {
		fresh = fresh || !s[id]
		s[id] = true
	}
	return fresh
}

// runOnce is RunOnce within streak s. It also returns the pause the pace
// sets before the next pass, and whether the pass claimed keys that s had
// not handed back.
func (c *Completer) runOnce(ctx context.Context, s streak) (recovery.PassResult, time.Duration, bool, error) {
	claim, running := c.pace.plan()
	var back []uuid.UUID
	pass := func(ctx context.Context) (recovery.PassResult, error) {
		var (
			res recovery.PassResult
			err error
		)
		res, back, err = c.pass(ctx, claim, running)
		return res, err
	}
	began := time.Now()
	var (
		res recovery.PassResult
		err error
	)
	if c.Around != nil {
		res, err = c.Around(ctx, pass)
	} else {
		res, err = pass(ctx)
	}
	fresh := err == nil && s.fresh(res, back)
	return res, c.pace.record(claim, res, time.Since(began), fresh, err), fresh, err
}

// pass claims up to claim due keys and runs up to running of them at
// once, each workflow's within its own cap. It returns the keys it handed
// back besides the sums.
func (c *Completer) pass(ctx context.Context, claim, running int) (recovery.PassResult, []uuid.UUID, error) {
	var (
		res  recovery.PassResult
		back []uuid.UUID
		// done are the keys the pass finished.
		done []uuid.UUID
	)
	defer c.Live.pass()()
	if c.burial.due() {
		buried, err := store.Bury(ctx, c.db, c.workflows, c.definitions, c.cfg.MaxAttempts, c.cfg.StuckAfter)
		switch {
		case err != nil && ctx.Err() != nil:
			return res, nil, err
		case err != nil:
			// The burial waits for the next minute, the claim does not:
			// it leaves keys out of attempts alone, and a burial that
			// fails for want of one Citus node (it updates every shard)
			// must not stop the others' keys from draining.
			c.log.Warn("burying keys out of attempts failed; the next try is in a minute", "err", err)
			c.burial.done()
		default:
			c.burial.done()
			res.Dead = buried
		}
	}
	buried := res.Dead
	if buried > 0 {
		c.observe(ctx, keyrow.Event{Kind: keyrow.EventDead, Count: buried})
		c.log.Warn("abandoned keys moved to dead after repeated failures", "count", buried, "max_attempts", c.cfg.MaxAttempts)
	}
	// Started, the completer counts on its own loop; a pass that counted
	// too would hold its claim up for the count, which reads every
	// unfinished key. A pass run on demand counts when due.
	if !c.counting.running() {
		c.recordHistory(ctx)
	}
	rows, err := store.Claim(ctx, c.db, store.ClaimParams{
		Workflows: c.workflows, Definitions: c.definitions, Limit: claim, StuckAfter: c.cfg.StuckAfter,
		Backoff: c.cfg.Backoff, MaxBackoff: c.cfg.MaxBackoff, TTL: c.ttl, Distributed: distributed(c.Distributed),
		MaxAttempts: c.cfg.MaxAttempts, Unanswered: c.unansweredScan,
	})
	if err != nil {
		return res, nil, err
	}
	res.Claimed = len(rows)
	c.Live.drain(len(rows) > 0)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sem = make(chan struct{}, running)
		// own holds each run's time but its calls': the store's and this
		// process's, which grow when they are busy.
		own = make([]time.Duration, 0, len(rows))
	)
	for _, row := range rows {
		wg.Go(func() {
			// The workflow's slot first: a key waiting for it holds no
			// slot that a key of another workflow could use.
			if slot := c.slots[row.Workflow]; slot != nil {
				slot <- struct{}{}
				defer func() { <-slot }()
			}
			sem <- struct{}{}
			defer func() { <-sem }()
			began := time.Now()
			calls, err := c.resume(ctx, row)
			mu.Lock()
			defer mu.Unlock()
			own = append(own, time.Since(began)-calls)
			switch {
			case errors.Is(err, recovery.ErrHandedBack):
				res.HandedBack++
				back = append(back, row.ID)
			case err != nil:
				res.Failed++
			default:
				res.Completed++
				done = append(done, row.ID)
			}
		})
	}
	wg.Wait()
	// A distributed key table has no watch: its claim reads an index of
	// unfinished keys (atomicphase.DistributeSQL).
	if ctx.Err() == nil && !distributed(c.Distributed) {
		if err := store.Unwatch(ctx, c.db, done); err != nil {
			// A later claim drops the rows when it reaches them.
			c.log.Warn("completer could not drop finished keys from its watch", "count", len(done), "err", err)
		}
	}
	if res.Failed > 0 {
		c.burial.failed()
	}
	c.pace.observe(own)
	return res, back, nil
}

func (c *Completer) resume(ctx context.Context, row *store.Row) (calls time.Duration, err error) {
	calls, err = c.resumer(ctx, row)
	ev := keyrow.Event{Kind: keyrow.EventCompleted, Count: 1, Workflow: row.Workflow, Tenant: row.Tenant, Key: row.Key}
	if err != nil {
		ev.Kind, ev.Err = keyrow.EventCompleterFailed, err
	}
	if errors.Is(err, recovery.ErrHandedBack) {
		return calls, err
	}
	c.observe(ctx, ev)
	if err != nil {
		// A run cut short as the completer stops is not the key's fault.
		msg, level := "completer could not finish key", slog.LevelWarn
		if errors.Is(ctx.Err(), context.Canceled) {
			msg, level = "completer stopping; run cut short", slog.LevelInfo
		}
		c.log.Log(ctx, level, msg, "workflow", row.Workflow, "tenant", row.Tenant,
			"key", row.Key, "recovery_point", row.RecoveryPoint, "attempt", row.Attempts, "err", err)
	}
	return calls, err
}

// Drain runs passes, one streak, until one claims nothing or nothing but
// keys it handed back before, and returns the sum.
func (c *Completer) Drain(ctx context.Context) (recovery.PassResult, error) {
	var total recovery.PassResult
	s := streak{}
	for {
		res, _, fresh, err := c.runOnce(ctx, s)
		total = total.Add(res)
		if err != nil || !fresh {
			return total, err
		}
	}
}

// Start runs passes in the background until Stop or ctx ends: one at
// once after a pass that claimed keys it had not handed back, otherwise
// after Interval, longer after trouble (see pace).
//
// Beside its passes it counts its keys every store.SampleEvery, and
// records the minute's status history, on a loop of its own: the backlog's
// drain rate is measured from those counts, which neither a long pass nor
// a pause after failing ones (up to a minute, after an outage) may hold
// up.
func (c *Completer) Start(ctx context.Context) error {
	s := streak{}
	err := c.bg.Start(ctx, "completer", func(ctx context.Context) time.Duration {
		_, wait, _, err := c.runOnce(ctx, s)
		if err != nil && ctx.Err() == nil {
			c.log.Error("completer pass failed", "err", err, "next_pass_in", wait)
		}
		if wait > 0 {
			clear(s)
		}
		return wait
	})
	if err != nil {
		return err
	}
	return c.counting.Start(ctx, "completer's counts", func(ctx context.Context) time.Duration {
		c.recordHistory(ctx)
		return c.samples.untilDue()
	})
}

// unansweredScan warns, once a minute at most, that a node of a Citus
// cluster did not answer the scan for due keys.
func (c *Completer) unansweredScan(err error) {
	if c.unanswered.logFailure() {
		c.log.Warn("a node did not answer the scan for due keys; draining the keys of the nodes that did", "err", err)
	}
}

// Stop ends the background passes: it starts no other, and lets the keys
// of the current one run until ctx ends. It then cancels them, waits for
// them to stop, and returns ctx's error. A cancelled key keeps its
// recovery point, frees its lease and is resumed later. The counts stop
// at once and are never what Stop reports: a count cut short loses
// nothing, as the next count of the slot, by any process, stands for it.
func (c *Completer) Stop(ctx context.Context) error {
	// Given a context that never ends, Stop cancels the count under way
	// and waits for it, which pgx's cancellation keeps short, and
	// returns nil.
	_ = c.counting.Stop(context.WithoutCancel(ctx))
	return c.bg.StopGracefully(ctx)
}

func (c *Completer) observe(ctx context.Context, ev keyrow.Event) {
	if c.Observe != nil {
		c.Observe(ctx, ev)
	}
}

// errAlreadyStarted is returned by Start on a running service.
var errAlreadyStarted = errors.New("already started")

// buryEvery is how often a completer buries keys it did not fail itself:
// keys that other processes failed out of attempts, and left.
const buryEvery = time.Minute

// burial says when a pass buries abandoned keys out of attempts. Bury
// reads every stuck key (their failures are not indexed), so after an
// outage it costs as much as the backlog is long: a pass runs it only when
// keys may have run out of attempts since the last burial, after a pass
// of this completer in which keys failed, and every buryEvery for the
// keys of other processes. The claim leaves such keys alone meanwhile
// (ClaimParams.MaxAttempts), so a key is never run again for being buried
// late.
type burial struct {
	mu   sync.Mutex
	last time.Time
	// keysFailed: keys of a pass failed since the last burial.
	keysFailed bool
}

// due reports whether the pass should bury.
func (b *burial) due() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last.IsZero() || b.keysFailed || time.Since(b.last) >= buryEvery
}

// done records a burial.
func (b *burial) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.last, b.keysFailed = time.Now(), false
}

// failed records that keys of a pass failed.
func (b *burial) failed() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keysFailed = true
}
