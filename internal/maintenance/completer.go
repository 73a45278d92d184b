package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"slices"
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
	// mu guards started and cancelKeys: the keys of Start's passes, and
	// the function that cancels them.
	mu         sync.Mutex
	started    *flight
	cancelKeys context.CancelFunc
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
// at the pace the passes before it set. It returns once every key it
// claimed has ended.
func (c *Completer) RunOnce(ctx context.Context) (recovery.PassResult, error) {
	f := newFlight(ctx)
	f.patient = true
	res, _, _, err := c.runOnce(ctx, f, streak{})
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

// fresh records the keys handed back since the last pass and reports
// whether the pass claimed any key the streak had not handed back before.
// A key handed back by the pass itself counts as new: it goes behind the
// keys due now, which the next pass claims.
func (s streak) fresh(claimed, back []uuid.UUID) bool {
	fresh := false
	for _, id := range claimed {
		fresh = fresh || !s[id]
	}
	for _, id := range back {
		s[id] = true
	}
	return fresh
}

// runOnce is one pass of f's caller within streak s. It also returns the
// pause the pace sets before the next pass, and whether the pass claimed
// keys that s had not handed back.
func (c *Completer) runOnce(ctx context.Context, f *flight, s streak) (recovery.PassResult, time.Duration, bool, error) {
	claim, running := c.pace.plan()
	var claimed, back []uuid.UUID
	pass := func(ctx context.Context) (recovery.PassResult, error) {
		var (
			res recovery.PassResult
			err error
		)
		res, claimed, back, err = c.pass(ctx, f, claim, running)
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
	fresh := err == nil && s.fresh(claimed, back)
	return res, c.pace.record(claim, res, time.Since(began), fresh, err), fresh, err
}

// pass claims up to claim due keys, runs them with f, up to running keys
// of f at once and each workflow's within its own cap, and waits for them
// (see flight.await). It counts the keys of f that ended meanwhile, its
// own and those that outlasted passes before it, and returns the keys it
// claimed and those handed back besides the sums.
func (c *Completer) pass(ctx context.Context, f *flight, claim, running int) (res recovery.PassResult, claimed, back []uuid.UUID, err error) {
	defer c.Live.busy()()
	if c.burial.due() {
		buried, err := store.Bury(ctx, c.db, c.workflows, c.definitions, c.cfg.MaxAttempts, c.cfg.StuckAfter)
		switch {
		case err != nil && ctx.Err() != nil:
			return res, nil, nil, err
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
	// Keys that outlasted their passes may hold every slot, or every slot
	// of a workflow's cap: a key claimed now would wait for one with its
	// lease running, and hold up the pass.
	f.limit(running)
	var workflows, definitions []string
	if !f.room(ctx, func() bool {
		workflows, definitions = c.claimable()
		return len(workflows) > 0
	}) {
		return res, nil, nil, ctx.Err()
	}
	if len(workflows) == 0 {
		// Every workflow's cap is full with keys of another caller.
		return res, nil, nil, nil
	}
	rows, err := store.Claim(ctx, c.db, store.ClaimParams{
		Workflows: workflows, Definitions: definitions, Limit: claim, StuckAfter: c.cfg.StuckAfter,
		Backoff: c.cfg.Backoff, MaxBackoff: c.cfg.MaxBackoff, TTL: c.ttl, Distributed: distributed(c.Distributed),
		MaxAttempts: c.cfg.MaxAttempts, Unanswered: c.unansweredScan,
	})
	if err != nil {
		return res, nil, nil, err
	}
	res.Claimed = len(rows)
	c.Live.drain(len(rows) > 0)
	// The keys' context: a key that outlasts the pass keeps the pass's
	// values (a trace's span, say); the keys end with the pass while it
	// waits for them, and with f's context.
	keys, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var (
		b = &batch{keys: keys, started: make(chan bool, len(rows)), parked: make(chan struct{}, len(rows)),
			ended: make(chan time.Duration, len(rows)), over: make(chan struct{})}
		cut     = context.AfterFunc(ctx, cancel)
		stopped = context.AfterFunc(f.ctx, cancel)
		woken   = context.AfterFunc(keys, f.wake)
		mine    sync.WaitGroup
	)
	for _, row := range rows {
		claimed = append(claimed, row.ID)
		f.begin()
		mine.Add(1)
		f.keys.Go(func() {
			defer mine.Done()
			defer f.done()
			c.runKey(f, b, row)
		})
	}
	f.await(len(rows), b, c.ttl/4)
	close(b.over)
	cut()
	go func() {
		mine.Wait()
		stopped()
		woken()
		cancel()
	}()
	o := f.take()
	c.settle(ctx, o)
	return res.Add(o.res), claimed, o.back, nil
}

// batch is the keys of one pass as they run, and what they tell the pass.
type batch struct {
	keys context.Context
	// started: a key took its slot, after waiting for its workflow's cap
	// (true) or not; parked: a key waits for its workflow's cap; ended: a
	// key ended, after the time given.
	started chan bool
	parked  chan struct{}
	ended   chan time.Duration
	// over is closed when the pass stops waiting for its keys.
	over chan struct{}
}

// runKey runs one key of batch b with f: it takes the key's workflow's
// slot (CompleterConfig.InFlight) first, so that a key waiting for it
// holds no slot a key of another workflow could use, then one of f's.
// A key whose workflow's slots are all held past the end of its pass is
// handed back, due again at once, for a later pass; one cut short while
// it waits runs without, for as long as it takes to free its lease.
func (c *Completer) runKey(f *flight, b *batch, row *store.Row) {
	var queued bool
	if slot := c.slots[row.Workflow]; slot != nil {
		select {
		case slot <- struct{}{}:
			defer func() { <-slot }()
		default:
			queued = true
			b.parked <- struct{}{}
			select {
			case slot <- struct{}{}:
				defer func() { <-slot }()
			case <-b.over:
				if err := store.ReleaseDetached(b.keys, c.db, row.Holder(), "", "", store.EndedCut, false); err != nil {
					// Its lease runs out instead.
					c.log.Warn("completer could not hand back a key waiting for its workflow's cap", "workflow", row.Workflow,
						"tenant", row.Tenant, "key", row.Key, "err", err)
				}
				f.handedBack(row.ID)
				return
			case <-b.keys.Done():
			}
		}
	}
	f.acquire(b.keys)
	b.started <- queued
	defer c.Live.busy()()
	began := time.Now()
	calls, err := c.resume(b.keys, row)
	took := time.Since(began)
	f.end(row.ID, took-calls, err)
	b.ended <- took
}

// claimable returns, pairwise, the workflows and definitions whose keys a
// pass may claim: those of workflows with a free slot of their own cap
// (CompleterConfig.InFlight), or none.
func (c *Completer) claimable() (workflows, definitions []string) {
	if len(c.slots) == 0 {
		return c.workflows, c.definitions
	}
	for i, w := range c.workflows {
		if slot := c.slots[w]; slot == nil || len(slot) < cap(slot) {
			workflows, definitions = append(workflows, w), append(definitions, c.definitions[i])
		}
	}
	return workflows, definitions
}

// settle acts on what the keys of o left: it drops those that finished
// from the watch, marks a burial due when some failed, and gives the pace
// their times.
func (c *Completer) settle(ctx context.Context, o outcomes) {
	// A distributed key table has no watch: its claim reads an index of
	// unfinished keys (atomicphase.DistributeSQL).
	if len(o.done) > 0 && ctx.Err() == nil && !distributed(c.Distributed) {
		if err := store.Unwatch(ctx, c.db, o.done); err != nil {
			// A later claim drops the rows when it reaches them.
			c.log.Warn("completer could not drop finished keys from its watch", "count", len(o.done), "err", err)
		}
	}
	if o.res.Failed > 0 {
		c.burial.failed()
	}
	c.pace.observe(o.own)
}

// flight holds the keys that the passes of one caller of a completer
// (Start's background passes, one Drain, one RunOnce) started and that
// have not ended, and the outcomes of those that ended until a pass counts
// them. A pass waits for its keys, but not for one that outlasts the
// others by far, a call that hangs until CallTimeout: it holds its slot
// and ends in a later pass, while the next pass claims keys for the slots
// that are free. So one slow key costs the drain one slot, not all of
// them.
type flight struct {
	// ctx ends the keys' runs. Stop cancels Start's when its own context
	// ends.
	ctx context.Context
	// patient: the passes wait for every key (RunOnce).
	patient bool
	keys    sync.WaitGroup
	mu      sync.Mutex
	// cond is broadcast when a key ends, the limit changes or a context
	// that a waiter for a slot heeds ends.
	cond *sync.Cond
	// running counts the keys that hold a slot, at most max of them
	// unless cut short; live counts those that have not returned.
	running, max, live int
	ended              outcomes
	// typical is the median time of the keys of the last pass that ended
	// any, which its passes read one at a time.
	typical time.Duration
}

// outcomes are what the keys that ended leave for a pass to count: the
// sums, the keys handed back and those finished, and each key's time but
// its calls.
type outcomes struct {
	res        recovery.PassResult
	back, done []uuid.UUID
	own        []time.Duration
}

// lingerFactor is how many times the median time of its keys that ended a
// pass waits for the next of the rest to end, once a slot is free and
// none of its keys waits for one: the usual spread of a batch's keys ends
// within it, a hung call does not.
const lingerFactor = 4

func newFlight(ctx context.Context) *flight {
	f := &flight{ctx: ctx}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// limit sets how many keys may run at once; the keys above it that run
// already go on.
func (f *flight) limit(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.max = n
	f.cond.Broadcast()
}

// acquire waits for a slot and takes it; once ctx ends it takes one
// without waiting, for a run that only frees its lease.
func (f *flight) acquire(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.running >= f.max && ctx.Err() == nil {
		f.cond.Wait()
	}
	f.running++
}

// room waits until a slot is free and ready reports true, as it may once
// a key of f returns, or until no key of f is left to return. It reports
// false when ctx ended first.
func (f *flight) room(ctx context.Context, ready func() bool) bool {
	defer context.AfterFunc(ctx, f.wake)()
	f.mu.Lock()
	defer f.mu.Unlock()
	for ctx.Err() == nil {
		if f.running < f.max && (ready() || f.live == 0) {
			return true
		}
		f.cond.Wait()
	}
	return false
}

// wake wakes the keys waiting for a slot, to see whether their context
// ended.
func (f *flight) wake() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cond.Broadcast()
}

// begin and done count a key of f from its claim to its return.
func (f *flight) begin() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live++
}

func (f *flight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live--
	// The key has given back its workflow's slot too.
	f.cond.Broadcast()
}

// end frees the slot of a key that ended with err, its calls aside having
// taken own, and records its outcome.
func (f *flight) end(id uuid.UUID, own time.Duration, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running--
	f.cond.Broadcast()
	f.ended.own = append(f.ended.own, own)
	switch {
	case errors.Is(err, recovery.ErrHandedBack):
		f.ended.res.HandedBack++
		f.ended.back = append(f.ended.back, id)
	case err != nil:
		f.ended.res.Failed++
	default:
		f.ended.res.Completed++
		f.ended.done = append(f.ended.done, id)
	}
}

// handedBack records a key handed back without a run.
func (f *flight) handedBack(id uuid.UUID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended.res.HandedBack++
	f.ended.back = append(f.ended.back, id)
}

// idle reports whether a slot is free.
func (f *flight) idle() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running < f.max
}

// take returns the outcomes recorded since the last take.
func (f *flight) take() outcomes {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.ended
	f.ended = outcomes{}
	return o
}

// await waits for the n keys of batch b. Unless f is patient, once each
// has started or waits for its workflow's cap and a slot of f is free, it
// waits for the rest only while one ends at least every lingerFactor
// times the median time of those that ended (or of the last pass's, when
// none has), and at most every most: a key waiting for its workflow's cap
// holds a lease that runs.
func (f *flight) await(n int, b *batch, most time.Duration) {
	var (
		began, parked int
		took          []time.Duration
		linger        <-chan time.Time
	)
	defer func() {
		if len(took) > 0 {
			slices.Sort(took)
			f.typical = took[len(took)/2]
		}
	}()
	for len(took) < n {
		select {
		case queued := <-b.started:
			began++
			if queued {
				parked--
			}
		case <-b.parked:
			parked++
		case d := <-b.ended:
			took = append(took, d)
			// The wait runs from the last key that ended: keys that end
			// one after another, as under a workflow's cap, are waited
			// for.
			linger = nil
		case <-linger:
			return
		}
		if f.patient || linger != nil || began+parked < n || !f.idle() {
			continue
		}
		wait := most
		if len(took) > 0 {
			slices.Sort(took)
			wait = min(wait, lingerFactor*took[len(took)/2])
		} else if f.typical > 0 {
			wait = min(wait, lingerFactor*f.typical)
		}
		linger = time.After(wait)
	}
}

// wait waits for the keys of f until ctx ends, then cancels them with
// cancel and waits for them to stop. It returns ctx's error when it had
// to cancel any.
func (f *flight) wait(ctx context.Context, cancel context.CancelFunc) error {
	f.mu.Lock()
	live := f.live
	f.mu.Unlock()
	if live == 0 {
		return nil
	}
	done := make(chan struct{})
	go func() {
		f.keys.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	cancel()
	<-done
	return ctx.Err()
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
// keys it handed back before, waits for the keys still running, and
// returns the sum.
func (c *Completer) Drain(ctx context.Context) (recovery.PassResult, error) {
	var total recovery.PassResult
	f := newFlight(ctx)
	s := streak{}
	for {
		res, _, fresh, err := c.runOnce(ctx, f, s)
		total = total.Add(res)
		if err != nil || !fresh {
			f.keys.Wait()
			o := f.take()
			c.settle(ctx, o)
			return total.Add(o.res), err
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
	c.mu.Lock()
	defer c.mu.Unlock()
	keys, cancel := context.WithCancel(ctx)
	f := newFlight(keys)
	s := streak{}
	err := c.bg.Start(ctx, "completer", func(ctx context.Context) time.Duration {
		_, wait, _, err := c.runOnce(ctx, f, s)
		if err != nil && ctx.Err() == nil {
			c.log.Error("completer pass failed", "err", err, "next_pass_in", wait)
		}
		if wait > 0 {
			clear(s)
		}
		return wait
	})
	if err != nil {
		cancel()
		return err
	}
	c.started, c.cancelKeys = f, cancel
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
// still running, the current pass's and any that outlasted theirs, run
// until ctx ends. It then cancels them, waits for them to stop, and
// returns ctx's error. A cancelled key keeps its recovery point, frees its
// lease and is resumed later. The counts stop at once and are never what
// Stop reports: a count cut short loses nothing, as the next count of the
// slot, by any process, stands for it.
func (c *Completer) Stop(ctx context.Context) error {
	// Given a context that never ends, Stop cancels the count under way
	// and waits for it, which pgx's cancellation keeps short, and
	// returns nil.
	_ = c.counting.Stop(context.WithoutCancel(ctx))
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.bg.StopGracefully(ctx)
	f, cancel := c.started, c.cancelKeys
	if f == nil {
		return err
	}
	c.started, c.cancelKeys = nil, nil
	defer cancel()
	if werr := f.wait(ctx, cancel); err == nil {
		err = werr
	}
	c.settle(ctx, f.take())
	return err
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
