package phase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/maintenance"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
	"github.com/atomicphase/atomicphase/recovery"
)

// Defaults for Config's zero values.
const (
	// DefaultCallTimeout bounds one foreign call.
	DefaultCallTimeout = time.Minute
	// DefaultRunTimeout bounds one run of a key, from taking its lease to
	// storing its response.
	DefaultRunTimeout = 5 * time.Minute
	// DefaultMaxPhaseRetries is how many times a phase is run again after a
	// serialization failure or deadlock before the run fails.
	DefaultMaxPhaseRetries = 5
	// DefaultRetryBackoff is the first pause before such a retry. It
	// doubles, with jitter, on each further one.
	DefaultRetryBackoff = 5 * time.Millisecond
	// DefaultDownstreamKeyPrefix starts every downstream idempotency key.
	DefaultDownstreamKeyPrefix = "atomicphase"
)

// Config configures a Client. Zero values mean the documented default.
type Config struct {
	// LeaseTTL is the lease length: how long a run may go without renewing
	// its lease before another run may take the key over. The run, the
	// completer and every process must agree on it, so it is set here once.
	//
	// Every phase commit renews the lease. A foreign call renews it every
	// third of it while it runs, and before it starts unless the commit
	// before it was just sent.
	//
	// Must be at least lockttl.MinTTL. Defaults to lockttl.DefaultTTL.
	LeaseTTL time.Duration
	// CallTimeout bounds each foreign call. A call that exceeds it has an
	// unknown outcome. The next run repeats a Repeatable phase's call with
	// the same downstream key. Any other phase is held for reconciliation.
	//
	// Defaults to DefaultCallTimeout. -1 disables the limit.
	CallTimeout time.Duration
	// RunTimeout bounds one run of a key, the completer's included. A run
	// that exceeds it stops, keeps its committed phases and frees the key.
	// A retry or the completer then resumes it.
	//
	// Defaults to DefaultRunTimeout. -1 disables the limit.
	RunTimeout time.Duration
	// MaxPhaseRetries bounds the re-runs of a phase after a serialization
	// failure or deadlock. Defaults to DefaultMaxPhaseRetries. -1 means
	// none.
	MaxPhaseRetries int
	// RetryBackoff is the first pause before such a re-run. Defaults to
	// DefaultRetryBackoff.
	RetryBackoff time.Duration
	// WaitForInFlight, when positive, makes a request whose key is held by
	// another live run wait up to this long for that run to finish and
	// replay its response, instead of answering a conflict at once.
	// Defaults to 0: no waiting.
	WaitForInFlight time.Duration
	// DownstreamKeyPrefix starts every downstream idempotency key. Defaults
	// to DefaultDownstreamKeyPrefix.
	DownstreamKeyPrefix string
	// Logger receives the client's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks observe, wrap and fault the client's work. Each receives what
	// the interfaces it implements say (see [Hook]). Wrappers apply in
	// order, the first outermost:
	//
	//	Hooks: []phase.Hook{otelHook, phase.ObserverFunc(count)}
	//
	// Defaults to none.
	Hooks []Hook
	// Completer configures the completer that Start runs. Its zero value
	// means recovery's defaults.
	Completer recovery.CompleterConfig
	// Reaper configures the reaper that Start runs. Its zero value means
	// recovery's defaults.
	Reaper recovery.ReaperConfig
	// Schema is the Postgres schema that holds the library's tables and
	// functions, migrated there with atomicphase.Migrator. Every statement
	// the client, its completer and reaper, and its operator methods send
	// names them in this schema, whatever the connection's search_path;
	// the statements of the workflows' own phases are left as they are.
	// The name is used as it is, quoted: case matters.
	//
	// Defaults to empty: the tables the connection's search_path finds.
	Schema string
}

// withDefaults returns c with its defaults applied, or an error naming the
// invalid field.
func (c Config) withDefaults() (Config, error) {
	for name, d := range map[string]time.Duration{"CallTimeout": c.CallTimeout, "RunTimeout": c.RunTimeout} {
		if d < -1 {
			return c, fmt.Errorf("phase: Config.%s %v is negative; use -1 to disable it", name, d)
		}
	}
	if c.LeaseTTL < 0 || c.RetryBackoff < 0 || c.WaitForInFlight < 0 || c.MaxPhaseRetries < -1 {
		return c, errors.New("phase: Config.LeaseTTL, RetryBackoff, WaitForInFlight and MaxPhaseRetries must not be negative")
	}
	c.LeaseTTL = cmp.Or(c.LeaseTTL, lockttl.DefaultTTL)
	if err := lockttl.Check(c.LeaseTTL); err != nil {
		return c, fmt.Errorf("phase: Config.LeaseTTL: %w", err)
	}
	c.CallTimeout = cmp.Or(c.CallTimeout, DefaultCallTimeout)
	c.RunTimeout = cmp.Or(c.RunTimeout, DefaultRunTimeout)
	c.MaxPhaseRetries = max(cmp.Or(c.MaxPhaseRetries, DefaultMaxPhaseRetries), 0)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, DefaultRetryBackoff)
	c.DownstreamKeyPrefix = cmp.Or(c.DownstreamKeyPrefix, DefaultDownstreamKeyPrefix)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	var err error
	if c.Completer, err = c.Completer.WithDefaults(); err != nil {
		return c, err
	}
	if c.Reaper, err = c.Reaper.WithDefaults(); err != nil {
		return c, err
	}
	return c, nil
}

// Registered is a workflow a Client can run and resume from its stored row.
// Every *Workflow is one.
type Registered interface {
	Name() string
	Definition() string
	// resume continues a key whose lease the caller took: claimed by the
	// completer, or acquired by a request to another definition.
	resume(ctx context.Context, c *Client, row *store.Row, rt route, byCompleter bool) (*keyrow.Response, error)
	adopted() []adoption
	// retention is how long the workflow's keys are kept; zero means the
	// client's reaper retention.
	retention() time.Duration
}

// defKey names a workflow definition as a key row records it.
type defKey struct{ workflow, definition string }

// route says which registered workflow runs the keys of a definition, and
// how: moves maps the recovery points of an adopted definition; adopted is
// false for the workflow's own definition.
type route struct {
	w       Registered
	moves   map[string]string
	adopted bool
}

// routesOf returns the definitions a client with workflows runs, and by
// which of them. A workflow runs its own definition and those it adopts;
// keys it adopted from another workflow name keep that name and carry its
// definition afterwards. Keys stored before definitions were recorded are
// run by the first workflow registered under their name, unless one adopts
// them explicitly.
func routesOf(workflows []Registered) (map[defKey]route, error) {
	routes := make(map[defKey]route)
	add := func(k defKey, r route) error {
		if prev, dup := routes[k]; dup {
			if !prev.adopted && !r.adopted && prev.w == r.w {
				return fmt.Errorf("phase: workflow %q (definition %s) registered twice", k.workflow, k.definition)
			}
			return fmt.Errorf("phase: definition %s of workflow %q is run by two registered workflows", k.definition, k.workflow)
		}
		routes[k] = r
		return nil
	}
	for _, w := range workflows {
		if err := add(defKey{w.Name(), w.Definition()}, route{w: w}); err != nil {
			return nil, err
		}
	}
	for _, w := range workflows {
		for _, a := range w.adopted() {
			if err := add(defKey{a.workflow, a.definition}, route{w: w, moves: a.moves, adopted: true}); err != nil {
				return nil, err
			}
			if a.workflow != w.Name() {
				alias := defKey{a.workflow, w.Definition()}
				if prev, dup := routes[alias]; dup && prev.w != w {
					return nil, fmt.Errorf("phase: definition %s of workflow %q is run by two registered workflows", alias.definition, alias.workflow)
				}
				routes[alias] = route{w: w}
			}
		}
	}
	for _, w := range workflows {
		legacy := defKey{w.Name(), ""}
		if _, ok := routes[legacy]; !ok {
			routes[legacy] = route{w: w, adopted: true}
		}
	}
	return routes, nil
}

// reapScopes are the workflows whose keys a client's reaper judges: those
// it runs, under their own names and those they adopt keys from, each kept
// for its workflow's retention (the longest, when several registered
// workflows run keys of one name).
func reapScopes(routes map[defKey]route, retention time.Duration) []maintenance.Scope {
	keep := make(map[string]time.Duration)
	for k, rt := range routes {
		keep[k.workflow] = max(keep[k.workflow], cmp.Or(rt.w.retention(), retention))
	}
	scopes := make([]maintenance.Scope, 0, len(keep))
	for _, name := range slices.Sorted(maps.Keys(keep)) {
		scopes = append(scopes, maintenance.Scope{Workflow: name, Retention: keep[name]})
	}
	return scopes
}

// warnShortRetention logs a warning for each workflow whose keys are kept
// for less than a lease and the completer's StuckAfter: the reaper gives
// such a key, left unfinished by a crash, its terminal "request abandoned"
// response before the completer may take it, so crashed requests are
// closed rather than finished. The setting stays allowed, as it was: a
// workflow may prefer that.
func warnShortRetention(c Config, scopes []maintenance.Scope) {
	for _, s := range scopes {
		if need := c.LeaseTTL + c.Completer.StuckAfter; s.Retention < need {
			c.Logger.Warn("retention is shorter than the lease and the completer's stuck-after: the reaper closes crashed keys as abandoned before the completer can finish them",
				"workflow", s.Workflow, "retention", s.Retention, "lease_ttl", c.LeaseTTL, "stuck_after", c.Completer.StuckAfter)
		}
	}
}

// Client runs workflows under idempotency keys. It owns the services that
// finish and clean up keys without a client: the completer and the reaper.
// One Client serves every request of a process. It is safe for concurrent
// use.
//
// A process may do only one of the two jobs:
//
//   - A process that only serves sets Config.Completer.Interval and
//     Config.Reaper.Interval to -1, or never calls Start.
//   - A process that only completes registers its workflows and calls
//     Start without serving.
type Client struct {
	cfg   Config
	hooks hooks
	pool  *pgxpool.Pool
	// schema is Config.Schema, and db the pool through which the library's
	// statements go out for it (the pool itself for the search_path).
	schema *store.Schema
	db     store.Querier
	// poolConfig is a copy of the pool's configuration, made once.
	poolConfig *pgxpool.Config
	routes     map[defKey]route
	completer  *maintenance.Completer
	reaper     *maintenance.Reaper

	mu       sync.Mutex
	stopping bool
	inflight sync.WaitGroup
	// running counts the runs in flight (inflight's count), under mu.
	running int
	// halt is cancelled when Stop gives up waiting: runs still going then
	// stop and free their leases.
	halt     context.Context
	haltRuns context.CancelFunc

	// Check's answer, once it has one; checkPassed lets runs skip the
	// mutex.
	checkMu     sync.Mutex
	checked     bool
	checkErr    error
	checkPassed atomic.Bool
	// distributed is Check's finding that the key table is distributed
	// with Citus, which some statements must then be written for.
	distributed atomic.Bool
}

// NewClient returns a client over pool, which must hold the migrated
// atomicphase schema (see atomicphase.Migrate, or atomicphase.Migrator for
// the schema Config.Schema names) and the workflows' own tables,
// configured by cfg (nil means all defaults), that can run and resume
// workflows.
func NewClient(pool *pgxpool.Pool, cfg *Config, workflows ...Registered) (*Client, error) {
	if pool == nil {
		return nil, errors.New("phase: NewClient needs a pool")
	}
	if err := checkPool(pool.Config().ConnConfig); err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	if slices.Contains(workflows, nil) {
		return nil, errors.New("phase: NewClient: nil workflow")
	}
	routes, err := routesOf(workflows)
	if err != nil {
		return nil, err
	}
	hs, err := sortHooks(c.Hooks)
	if err != nil {
		return nil, err
	}
	schema, err := store.NewSchema(c.Schema)
	if err != nil {
		return nil, fmt.Errorf("phase: Config.Schema: %w", err)
	}
	cl := &Client{cfg: c, hooks: hs, pool: pool, schema: schema, db: schema.Querier(pool), poolConfig: pool.Config(), routes: routes}
	keys := slices.SortedFunc(maps.Keys(routes), func(a, b defKey) int {
		return cmp.Or(cmp.Compare(a.workflow, b.workflow), cmp.Compare(a.definition, b.definition))
	})
	names, defs := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		names[i], defs[i] = k.workflow, k.definition
	}
	for name := range c.Completer.InFlight {
		if !slices.Contains(names, name) {
			return nil, fmt.Errorf("phase: Config.Completer.InFlight names %q, which is not a registered workflow", name)
		}
	}
	cl.halt, cl.haltRuns = context.WithCancel(context.Background())
	cl.completer = maintenance.NewCompleter(c.Completer, cl.db, cl.resume, names, defs, c.LeaseTTL, c.Logger)
	if len(cl.hooks.passes) > 0 {
		cl.completer.Around = cl.throughPass
	}
	scopes := reapScopes(routes, c.Reaper.Retention)
	cl.reaper = maintenance.NewReaper(c.Reaper, cl.db, c.Logger, scopes)
	warnShortRetention(c, scopes)
	if len(cl.hooks.observers) > 0 {
		cl.completer.Observe, cl.reaper.Observe = cl.observe, cl.observe
	}
	cl.completer.Distributed, cl.reaper.Distributed = cl.distributed.Load, cl.distributed.Load
	return cl, nil
}

// Start runs the completer and the reaper in the background, each unless
// its Interval is -1, until Stop or ctx ends. It first checks the pool (see
// Check) and returns the error wrapping ErrTransactionPooler when the
// client cannot run through it; when the database cannot be reached, it
// logs a warning and starts anyway, and the first run checks again. A
// client stopped (see Stop), even before it started, stays stopped: Start
// and every run then return ErrStopped.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	stopping := c.stopping
	c.mu.Unlock()
	if stopping {
		return ErrStopped
	}
	if err := c.Check(ctx); errors.Is(err, ErrTransactionPooler) {
		return err
	} else if err != nil {
		c.cfg.Logger.Warn("could not check the pool; starting anyway", "err", err)
	}
	if c.cfg.Completer.Interval > 0 {
		if err := c.completer.Start(ctx); err != nil {
			return fmt.Errorf("phase: start: %w", err)
		}
	}
	if c.cfg.Reaper.Interval > 0 {
		if err := c.reaper.Start(ctx); err != nil {
			return fmt.Errorf("phase: start: %w", err)
		}
	}
	return nil
}

// Stop shuts the client down gracefully: new runs are refused with
// ErrStopped, the completer and reaper stop, and runs in flight are given
// until ctx ends to finish; the completer starts no other pass, and its
// keys under way are such runs. Runs still going then are cancelled: each
// stops at its next step, keeps its committed phases and frees its lease,
// so a retry resumes it at once, and so does another process's completer
// when the run was the completer's, or else once the key has been idle
// for StuckAfter (a cut run counts no failed attempt); the
// run's caller gets an error that is ErrStopped and ErrUnavailable (the
// HTTP handler answers 503 shutting-down with Retry-After). A run cut in the
// middle of a foreign call may have made the call: it ends with
// ErrOutcomeUnknown, as when a provider's answer is lost, so a Repeatable
// call is made again by the next run, and any other phase holds the key
// (keyrow.HoldUnknown): a Reconciled phase's completer reconciles it once
// it is idle for StuckAfter, any other waits for an operator. Give Stop a
// context that outlasts your calls. Stop returns an error wrapping ctx's
// when it had to cancel runs, or a pass of the completer or the reaper
// under way (as right after Start, which begins both with a pass), and nil
// when none was left to cancel: the completer's counts of its keys are
// cancelled without an error. It returns once the
// cancelled runs have freed their leases: shortly after ctx ends (their
// statements under way are cancelled first), or up to 5 s later when the
// store does not answer (a lease it could not free expires by itself).
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		c.inflight.Wait()
		close(done)
	}()
	// The services' own runs count as in flight; stopping them cancels
	// those runs, which then free their leases.
	errs := []error{c.completer.Stop(ctx), c.reaper.Stop(ctx)}
	select {
	case <-done:
	case <-ctx.Done():
		c.mu.Lock()
		idle := c.running == 0
		c.mu.Unlock()
		if idle {
			// No run to cancel: none can start once stopping is set.
			<-done
			break
		}
		c.haltRuns()
		// Cancelled runs free their leases within the store's release
		// timeout; wait for that, so nothing is left running.
		<-done
		errs = append(errs, fmt.Errorf("phase: stop: runs cancelled: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// enter registers a run in flight, unless the client is stopping.
func (c *Client) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping {
		return false
	}
	c.inflight.Add(1)
	c.running++
	return true
}

// exit ends a run that enter registered.
func (c *Client) exit() {
	c.mu.Lock()
	c.running--
	c.mu.Unlock()
	c.inflight.Done()
}

// registered reports whether w is registered with c.
func (c *Client) registered(w Registered) error {
	if rt, ok := c.routes[defKey{w.Name(), w.Definition()}]; !ok || rt.w != w {
		return fmt.Errorf("%w: %q (definition %s)", ErrNotRegistered, w.Name(), w.Definition())
	}
	return nil
}

// resume continues a key the completer claimed, with its registered
// workflow, and returns the time the run spent in foreign calls and
// reconcile functions: the completer paces itself on the rest, the time
// the store and this process took.
func (c *Client) resume(ctx context.Context, row *store.Row) (calls time.Duration, err error) {
	clock := &callClock{}
	ctx = context.WithValue(ctx, callClockKey{}, clock)
	defer func() { calls = time.Duration(clock.spent.Load()) }()
	info := &RunInfo{Workflow: row.Workflow, Tenant: row.Tenant, Key: row.Key, ByCompleter: true,
		RecoveryPoint: row.RecoveryPoint, Attempt: row.Attempts}
	_, err = c.throughRun(ctx, info, func(ctx context.Context) (*Outcome, error) {
		rt, ok := c.routes[defKey{row.Workflow, row.Definition}]
		if !ok {
			// Claims select registered definitions only; a miss is a bug,
			// and the key is handed back for a process that knows it.
			err := fmt.Errorf("%w: %q (definition %s)", ErrNotRegistered, row.Workflow, row.Definition)
			c.release(ctx, row, err.Error(), row.Hold, store.EndedFailed, false)
			return nil, err
		}
		resp, err := rt.w.resume(ctx, c, row, rt, true)
		if errors.Is(err, ErrDefinitionElsewhere) || errors.Is(err, errForOperator) {
			return nil, fmt.Errorf("%w: %w", recovery.ErrHandedBack, err)
		}
		if err != nil {
			return nil, err
		}
		return &Outcome{Kind: OutcomeResumed, Response: resp}, nil
	})
	return 0, err
}

// timeLive starts timing a live run for the completer, which yields to
// live runs slowed by its keys (see # Pace in package recovery), and
// returns the run's context and the function that ends the timing.
// Its calls are left out: a slow provider is not a busy store.
func (c *Client) timeLive(ctx context.Context) (context.Context, func()) {
	if c.cfg.Completer.Interval <= 0 {
		return ctx, func() {}
	}
	clock, ok := ctx.Value(callClockKey{}).(*callClock)
	if !ok {
		clock = &callClock{}
		ctx = context.WithValue(ctx, callClockKey{}, clock)
	}
	began, before := time.Now(), clock.spent.Load()
	return ctx, func() {
		c.completer.Live.Record(began, time.Since(began)-time.Duration(clock.spent.Load()-before))
	}
}

// callClock sums the time a run spends in foreign calls and reconcile
// functions (see Client.resume and Client.timeLive).
type callClock struct{ spent atomic.Int64 }

// callClockKey is the context key of a run's callClock.
type callClockKey struct{}

// since adds the time since start.
func (k *callClock) since(start time.Time) { k.spent.Add(int64(time.Since(start))) }

// release frees the lease of a run that ends without finishing. It reports
// whether the lease was no longer the run's, because another run took the
// key over, and whether it freed the lease; any other failure to free it
// is logged (the lease then expires by itself).
//
// callFailed clears the key's pending call: the run learnt that the call
// did not happen.
//
// A diagnostic never keeps a lease: when the server refuses the statement
// (not the connection) while lastErr is recorded, the lease is freed again
// without it, and lastErr goes only to the log. Otherwise every retry would
// be refused as in flight until the lease expired.
func (c *Client) release(ctx context.Context, row *store.Row, lastErr string, hold keyrow.Hold, end store.Ending, callFailed bool) (lost, freed bool) {
	err := store.ReleaseDetached(ctx, c.db, row.Holder(), lastErr, hold, end, callFailed)
	if err != nil && lastErr != "" && !errors.Is(err, keyrow.ErrLeaseLost) && !storeDown(err) {
		c.cfg.Logger.Error("storing the run's error failed; freeing the lease without it",
			"workflow", row.Workflow, "tenant", row.Tenant, "key", row.Key, "last_error", lastErr, "err", err)
		err = store.ReleaseDetached(ctx, c.db, row.Holder(), "", hold, end, callFailed)
	}
	if errors.Is(err, keyrow.ErrLeaseLost) {
		return true, false
	}
	if err != nil {
		c.cfg.Logger.Error("freeing the lease failed; the key resumes when it expires",
			"workflow", row.Workflow, "tenant", row.Tenant, "key", row.Key, "err", err)
		return false, false
	}
	return false, true
}

// Complete runs completer passes until one finds nothing due but keys it
// handed back already (keys that wait for an operator or for a process
// that runs their definition), and returns what they did. It finishes due keys now, in a test or a one-off job,
// whether or not Start runs the completer. It also works after Stop, as a
// final drain. Keys are due under the completer's StuckAfter and backoff.
func (c *Client) Complete(ctx context.Context) (recovery.PassResult, error) {
	if err := c.ready(ctx); err != nil {
		return recovery.PassResult{}, err
	}
	return c.completer.Drain(ctx)
}

// Reap runs the reaper once, now, whether or not Start runs it.
func (c *Client) Reap(ctx context.Context) (recovery.ReapResult, error) {
	if err := c.ready(ctx); err != nil {
		return recovery.ReapResult{}, err
	}
	return c.reaper.RunOnce(ctx)
}

// Inspect returns everything stored about the tenant's key, or
// keyrow.ErrNotFound.
func (c *Client) Inspect(ctx context.Context, tenant, key string) (*keyrow.Row, error) {
	return store.Inspect(ctx, c.db, tenant, key)
}

// List returns one page of the keys f selects: the keys of an unfinished
// state idle longest first, finished keys and all keys newest first. Pass
// the page's Next as f.After for the next page; each page reads about as
// many index entries as it returns, however many keys the table holds. A
// zero StuckAfter means the completer's StuckAfter.
func (c *Client) List(ctx context.Context, f keyrow.ListFilter) (keyrow.Page, error) {
	return store.List(ctx, c.db, c.filter(f))
}

// Counts returns how many keys are in each keyrow.Status, counting a key as
// stuck once it has been idle for the completer's StuckAfter. The unfinished
// states are counted exactly; the finished keys of a table over 32 MiB
// are estimated from its statistics (Counts.FinishedEstimated), so that
// counting never reads every key. It counts the keys of every workflow in
// the key table, the other processes' as well as this client's: the
// backlog an operator sees, as the CLI's counts and the console do.
func (c *Client) Counts(ctx context.Context) (keyrow.Counts, error) {
	return store.Count(ctx, c.db, c.cfg.Completer.StuckAfter)
}

// Definitions returns how many unfinished keys each workflow definition has,
// whether or not c runs it: after a deploy, the old definitions still
// listed are those whose keys need a process that runs or adopts them.
func (c *Client) Definitions(ctx context.Context) ([]keyrow.DefinitionCount, error) {
	return store.CountDefinitions(ctx, c.db)
}

// Unlock frees the lease on an unfinished key, whoever holds it. The key
// keeps its recovery point, so the next request or the completer resumes
// it at once. It reports whether a lease was freed.
//
// Unlock is the operator's escape hatch for a key whose holder is known to
// be dead. A holder that is still running is fenced out and stops at its
// next write. But a foreign call it is already making goes on, and so does
// one it starts within a third of the TTL (at most a second) of its last
// commit (see # Fencing).
//
// Pass what the operator saw of the key (at most one [keyrow.Seen]):
//
//	row, err := client.Inspect(ctx, tenant, key)
//	freed, err := client.Unlock(ctx, tenant, key, row.Seen())
//
// Unlock then frees the lease only while the key is as seen, above all
// while its lease is the one seen. A lease a new run took since is left
// alone, and the error is a *keyrow.ChangedError (errors.Is
// keyrow.ErrChanged) holding the key as it is now. Given nothing, Unlock
// frees whatever lease the key has, as a test or a script that knows its
// holder is gone does.
//
// The change, or the refusal, is audited under the actor of ctx (see
// [WithActor]).
func (c *Client) Unlock(ctx context.Context, tenant, key string, seen ...keyrow.Seen) (bool, error) {
	s, err := oneSeen(seen)
	if err != nil {
		return false, err
	}
	return store.Unlock(ctx, c.db, tenant, key, s)
}

// Retry takes a key off hold, to run again. The key keeps its recovery
// point and state, and the completer gets its full MaxAttempts on it again.
//
//   - Retrying a dead key is always safe.
//   - Retrying an unknown key is the operator's word that the uncertain
//     foreign call did not happen, or may happen twice. The resumed run
//     repeats the call instead of reconciling it. [Client.Resolve] is the
//     way to say what became of an unknown outcome.
//
// Pass what the operator saw of the key (at most one [keyrow.Seen], from
// [keyrow.Row.Seen]). Retry then applies only while the key is as seen,
// and drops a pending resolution only when seen names it. Given nothing,
// it applies only while no resolution is pending on the key. Otherwise
// nothing changes, and the error is a *keyrow.ChangedError (errors.Is
// keyrow.ErrChanged) holding the key as it is now. Given nothing, it can
// also be refused so when another action or run changed the key while
// Retry was applied (it found the key off hold, but on hold again when it
// read it to say why): read the key again and decide.
//
// It returns keyrow.ErrNotFound or keyrow.ErrNotHeld when there is nothing
// to retry. The change, or the refusal, is audited under the actor of ctx
// (see [WithActor]).
func (c *Client) Retry(ctx context.Context, tenant, key string, seen ...keyrow.Seen) error {
	s, err := oneSeen(seen)
	if err != nil {
		return err
	}
	return store.Retry(ctx, c.db, tenant, key, s)
}

// Hold puts an unfinished key on hold as dead, to run again only when
// [Client.Retry] takes it off hold. The key keeps its recovery point,
// state and pending call; neither the completer nor a request runs it
// meanwhile (a request gets OutcomeOnHold). It is the way to stop a key
// whose runs fail in a way the completer cannot count (a run that crashes
// its process is run again once its lease runs out, every time) or that
// must wait for a fix.
//
// A lease on the key is cleared: a holder still running is fenced out at
// its next write, as with [Client.Unlock], and a foreign call it is
// already making goes on. So can one it is about to make: a run that
// took the key, or committed, just before the hold has that as its proof
// of the lease (see # Fencing), so a repeatable call may go out once
// after Hold returns, under the same downstream key, and the run then
// stops without writing. A call not safe to repeat is marked first, a
// write the hold fences. Retried, the key resumes at its recovery point,
// and the call of a phase it was cut short in is made again with the same
// downstream key, or reconciled when the phase's call is not safe to
// repeat.
//
// Pass what the operator saw of the key (at most one [keyrow.Seen]): Hold
// then applies only while the key is as seen, above all while its lease is
// the one seen. Otherwise nothing changes, and the error is a
// *keyrow.ChangedError (errors.Is keyrow.ErrChanged) holding the key as it
// is now.
//
// It returns keyrow.ErrNotFound, or keyrow.ErrNotRunnable for a key that
// is finished or already on hold. The change, or the refusal, is audited
// under the actor of ctx (see [WithActor]).
func (c *Client) Hold(ctx context.Context, tenant, key string, seen ...keyrow.Seen) error {
	s, err := oneSeen(seen)
	if err != nil {
		return err
	}
	return store.Hold(ctx, c.db, tenant, key, s)
}

// oneSeen returns the one Seen an operator action was given, nil for none.
func oneSeen(seen []keyrow.Seen) (*keyrow.Seen, error) {
	switch len(seen) {
	case 0:
		return nil, nil
	case 1:
		return &seen[0], nil
	}
	return nil, fmt.Errorf("phase: an operator action takes at most one Seen, got %d", len(seen))
}

// ReapCandidates reports what a reaper run would do if it started now,
// changing nothing: how many finished keys it would delete and how many
// abandoned keys it would close with a terminal response.
func (c *Client) ReapCandidates(ctx context.Context) (finished, abandoned int, err error) {
	return c.reaper.Candidates(ctx)
}
