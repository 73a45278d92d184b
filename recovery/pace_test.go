package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// provider is a stub payment provider: it counts the calls sent with each
// downstream key, and the calls in flight at once.
type provider struct {
	took time.Duration
	// hang, when set, holds the first call until it is closed.
	hang     chan struct{}
	hung     atomic.Bool
	mu       sync.Mutex
	sends    map[string]int
	inFlight atomic.Int64
	maxSeen  atomic.Int64
}

func (p *provider) charge(ctx context.Context, downstreamKey string) error {
	n := p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	for seen := p.maxSeen.Load(); n > seen && !p.maxSeen.CompareAndSwap(seen, n); seen = p.maxSeen.Load() {
	}
	p.mu.Lock()
	p.sends[downstreamKey]++
	p.mu.Unlock()
	var (
		took = time.After(p.took)
		hang chan struct{}
	)
	if p.hang != nil && p.hung.CompareAndSwap(false, true) {
		took, hang = nil, p.hang
	}
	select {
	case <-took:
		return nil
	case <-hang:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ridesWorkflow is shaped like the rides example: a local phase that
// records an effect row per run, a charge through p, and a local answer.
func ridesWorkflow(t testing.TB, db *pgxpool.Pool, name string, p *provider) *phase.Workflow[job, struct{}] {
	t.Helper()
	if _, err := db.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS effects (ikey text NOT NULL, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	type run = phase.Input[job, struct{}]
	w, err := phase.NewWorkflow(name,
		phase.Local("ride_created", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, in.Key, in.Req.N)
			return phase.Next(), err
		}),
		phase.Foreign("charge_created",
			func(ctx context.Context, in *run) (bool, error) { return true, p.charge(ctx, in.DownstreamKey()) },
			func(ctx context.Context, tx pgx.Tx, in *run, _ bool) (phase.Result, error) { return phase.Next(), nil }),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.JSON(201, in.Req), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// abandonMany stores n keys of workflow that requests started and left
// before their first phase. One statement per key would take a while; it
// stores them in one batch, with the columns Acquire writes.
func abandonMany(t testing.TB, db *pgxpool.Pool, workflow string, n int) {
	t.Helper()
	b := &pgx.Batch{}
	for i := range n {
		req := fmt.Sprintf(`{"n":%d}`, i)
		fp, err := keyrow.Fingerprint(workflow, []byte(req))
		if err != nil {
			t.Fatal(err)
		}
		b.Queue(`INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params, attempts)
			VALUES ('acme', $1, $2, $3, $4, 1)`, fmt.Sprintf("%s-%05d", workflow, i), workflow, fp[:], req)
	}
	if err := db.SendBatch(context.Background(), b).Close(); err != nil {
		t.Fatal(err)
	}
}

// waitUnfinished waits until no key is left unfinished, or fails t after
// limit.
func waitUnfinished(t *testing.T, db *pgxpool.Pool, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		var left int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE finished_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still unfinished after %s", left, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkEachKeyRanOnce checks the protocol after a drain of keys keys: one
// effect row per key (no committed phase ran again), one charge per
// downstream key, and no lease left on any key.
func checkEachKeyRanOnce(t *testing.T, db *pgxpool.Pool, p *provider, keys int) {
	t.Helper()
	ctx := context.Background()
	var rows, distinct, leased int
	if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT ikey),
		(SELECT count(*) FROM idempotency_keys WHERE lock_expires_at IS NOT NULL OR lock_token IS NOT NULL) FROM effects`).
		Scan(&rows, &distinct, &leased); err != nil {
		t.Fatal(err)
	}
	if rows != keys || distinct != keys || leased != 0 {
		t.Errorf("%d effects over %d keys, %d keys still leased; want each of %d keys run once and no lease left", rows, distinct, leased, keys)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sends) != keys {
		t.Errorf("%d downstream keys charged, want %d", len(p.sends), keys)
	}
	for k, n := range p.sends {
		if n != 1 {
			t.Errorf("downstream key %s charged %d times, want once", k, n)
		}
	}
}

func TestTwoNodesDrainOneBacklogInBackToBackPassesEachKeyOnce(t *testing.T) {
	t.Parallel()
	for _, route := range pgtest.Routes() {
		t.Run(route.Name, func(t *testing.T) {
			t.Parallel()
			db := route.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 20 })
			p := &provider{took: 2 * time.Millisecond, sends: map[string]int{}}
			w := ridesWorkflow(t, db, "rides", p)
			const keys = 600
			abandonMany(t, db, w.Name(), keys)
			// An Interval of an hour: the backlog drains only because a
			// pass that came back full is followed at once by the next.
			var completed [2]atomic.Int64
			for i := range 2 {
				count := phase.ObserverFunc(func(_ context.Context, ev keyrow.Event) {
					if ev.Kind == keyrow.EventCompleted {
						completed[i].Add(int64(ev.Count))
					}
				})
				c := client(t, db, func(c *phase.Config) {
					c.Completer.Interval, c.Completer.BatchSize = time.Hour, 25
					c.Reaper.Interval = -1
					c.Hooks = []phase.Hook{count}
				}, w)
				if err := c.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := c.Stop(context.Background()); err != nil {
						t.Error(err)
					}
				})
			}
			waitUnfinished(t, db, 2*time.Minute)
			checkEachKeyRanOnce(t, db, p, keys)
			a, b := completed[0].Load(), completed[1].Load()
			if a+b != keys || a == 0 || b == 0 {
				t.Errorf("the nodes completed %d and %d keys; want %d in all, some by each", a, b, keys)
			}
		})
	}
}

// TestAHungCallHoldsOneSlotWhileTheBacklogDrains hangs the first call of a
// drain, as a provider that never answers does until CallTimeout: the
// other keys drain past it, in passes that do not wait for it, and the
// hung key finishes once its call returns. Stopped meanwhile, the
// completer waits for it, or, when Stop's context ends first, cancels it
// and leaves it to be resumed.
func TestAHungCallHoldsOneSlotWhileTheBacklogDrains(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"drain", "background", "stopped", "cancelled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 20 })
			p := &provider{took: 2 * time.Millisecond, sends: map[string]int{}, hang: make(chan struct{})}
			w := ridesWorkflow(t, db, "rides", p)
			const keys = 200
			abandonMany(t, db, w.Name(), keys)
			c := client(t, db, func(c *phase.Config) { c.Completer.Interval, c.Reaper.Interval = time.Hour, -1 }, w)
			drained := make(chan recovery.PassResult, 1)
			if how == "drain" {
				go func() {
					res, err := c.Complete(ctx)
					if err != nil {
						t.Error(err)
					}
					drained <- res
				}()
			} else if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			unfinished := func() (n int) {
				t.Helper()
				if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE finished_at IS NULL`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			deadline := time.Now().Add(time.Minute)
			for left := unfinished(); left > 1; left = unfinished() {
				if time.Now().After(deadline) {
					close(p.hang)
					t.Fatalf("%d keys unfinished a minute into the drain, while one call hung; want all but the hung one finished", left)
				}
				time.Sleep(20 * time.Millisecond)
			}
			switch how {
			case "drain":
				close(p.hang)
				if res := <-drained; res.Completed != keys || res.Claimed != keys {
					t.Errorf("drain: %+v, want %d keys claimed and completed", res, keys)
				}
			case "background":
				close(p.hang)
				waitUnfinished(t, db, time.Minute)
				if err := c.Stop(ctx); err != nil {
					t.Error(err)
				}
			case "stopped":
				stopped := make(chan error, 1)
				go func() { stopped <- c.Stop(ctx) }()
				select {
				case err := <-stopped:
					t.Fatalf("Stop returned %v while a key still ran; want it to wait for the key", err)
				case <-time.After(300 * time.Millisecond):
				}
				close(p.hang)
				if err := <-stopped; err != nil {
					t.Error(err)
				}
				if left := unfinished(); left != 0 {
					t.Errorf("%d keys unfinished after Stop waited for the hung one", left)
				}
			case "cancelled":
				stopCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				if err := c.Stop(stopCtx); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Stop: %v, want the deadline of its context, the hung key cut short", err)
				}
				close(p.hang)
				// Cut short in a call not safe to repeat, the key waits
				// for an operator, its lease freed and its phase kept.
				var leased, held int
				if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE lock_expires_at IS NOT NULL OR lock_token IS NOT NULL),
					count(*) FILTER (WHERE hold = 'unknown' AND recovery_point = 'ride_created') FROM idempotency_keys WHERE finished_at IS NULL`).
					Scan(&leased, &held); err != nil {
					t.Fatal(err)
				}
				if leased != 0 || held != 1 {
					t.Errorf("after Stop cut the hung key short: %d keys leased, %d held as unknown at ride_created; want 0 and 1", leased, held)
				}
				p.mu.Lock()
				defer p.mu.Unlock()
				if len(p.sends) != keys {
					t.Errorf("%d downstream keys charged, want %d", len(p.sends), keys)
				}
				return
			}
			checkEachKeyRanOnce(t, db, p, keys)
		})
	}
}

// TestAHungCallUnderAnInFlightCapHoldsOnlyItsWorkflow hangs the first call
// of a workflow capped at one call at once: its other keys wait, unclaimed
// (a key claimed to wait for the cap would hold its lease, and its pass,
// for as long as the call hangs), while another workflow's drain past it.
func TestAHungCallUnderAnInFlightCapHoldsOnlyItsWorkflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 20 })
	capped := &provider{took: 2 * time.Millisecond, sends: map[string]int{}, hang: make(chan struct{})}
	free := &provider{took: 2 * time.Millisecond, sends: map[string]int{}}
	wc := ridesWorkflow(t, db, "capped", capped)
	wf := ridesWorkflow(t, db, "free", free)
	const keys = 100
	abandonMany(t, db, wc.Name(), keys/5)
	abandonMany(t, db, wf.Name(), keys)
	c := client(t, db, func(c *phase.Config) {
		c.Completer.Interval, c.Reaper.Interval = time.Hour, -1
		c.Completer.InFlight = map[string]int{wc.Name(): 1}
	}, wc, wf)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	count := func(workflow, where string) (n int) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE workflow = $1 AND `+where, workflow).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(time.Minute)
	for left := count(wf.Name(), "finished_at IS NULL"); left > 0; left = count(wf.Name(), "finished_at IS NULL") {
		if time.Now().After(deadline) {
			close(capped.hang)
			t.Fatalf("%d keys of the uncapped workflow unfinished a minute into the drain; want none", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if leased := count(wc.Name(), "lock_token IS NOT NULL"); leased != 1 {
		t.Errorf("%d keys of the capped workflow leased while its one slot hung; want only the hung one", leased)
	}
	close(capped.hang)
	deadline = time.Now().Add(time.Minute)
	for count(wc.Name(), "finished_at IS NULL") > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the capped workflow's keys unfinished a minute after its call returned")
		}
		if _, err := c.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*provider{capped, free} {
		p.mu.Lock()
		for k, n := range p.sends {
			if n != 1 {
				t.Errorf("downstream key %s charged %d times, want once", k, n)
			}
		}
		p.mu.Unlock()
	}
	if n := len(capped.sends) + len(free.sends); n != keys+keys/5 {
		t.Errorf("%d downstream keys charged, want %d", n, keys+keys/5)
	}
}

func TestInFlightCapsTheCallsToARateLimitedProvider(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 20 })
	limited := &provider{took: 20 * time.Millisecond, sends: map[string]int{}}
	free := &provider{took: 20 * time.Millisecond, sends: map[string]int{}}
	wl := ridesWorkflow(t, db, "limited", limited)
	wf := ridesWorkflow(t, db, "free", free)
	const keys = 40
	abandonMany(t, db, wl.Name(), keys)
	abandonMany(t, db, wf.Name(), keys)
	c := client(t, db, func(c *phase.Config) {
		c.Completer.Concurrency = 8
		c.Completer.InFlight = map[string]int{wl.Name(): 2}
	}, wl, wf)
	res, err := c.Complete(ctx)
	if err != nil || res.Completed != 2*keys {
		t.Fatalf("drain: %+v %v, want %d keys completed", res, err, 2*keys)
	}
	// The cap is reached and never passed; the other workflow's keys run
	// beside them, more at once than the cap.
	if got := limited.maxSeen.Load(); got != 2 {
		t.Errorf("at most %d calls in flight to the capped provider, want 2", got)
	}
	if got := free.maxSeen.Load(); got <= 2 {
		t.Errorf("at most %d calls in flight to the uncapped provider, want more than 2", got)
	}
	for _, p := range []*provider{limited, free} {
		for k, n := range p.sends {
			if n != 1 {
				t.Errorf("downstream key %s charged %d times, want once", k, n)
			}
		}
	}
}

func TestInFlightNamingNoWorkflowIsRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	w := ridesWorkflow(t, db, "rides", &provider{sends: map[string]int{}})
	for _, tc := range []struct {
		inFlight map[string]int
		want     string
	}{
		{map[string]int{"ridez": 2}, `"ridez", which is not a registered workflow`},
		{map[string]int{"rides": -2}, `InFlight["rides"] must not be negative`},
	} {
		cfg := phase.Config{Logger: quiet, Completer: recovery.CompleterConfig{InFlight: tc.inFlight}}
		_, err := phase.NewClient(db, &cfg, w)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("InFlight %v: %v, want an error saying %s", tc.inFlight, err, tc.want)
		}
	}
	if _, err := (recovery.CompleterConfig{InFlight: map[string]int{"rides": -1}}).WithDefaults(); err != nil {
		t.Errorf("InFlight -1 (no cap of its own): %v", err)
	}
}

// TestKeysWaitingForAnOperatorKeepNoDueKeyWaiting leaves more keys on hold
// for an operator than a batch holds, idle longer than a few crashed keys:
// a drain and the background passes both finish the crashed keys, and hand
// the held ones back untouched.
func TestKeysWaitingForAnOperatorKeepNoDueKeyWaiting(t *testing.T) {
	t.Parallel()
	for _, background := range []bool{false, true} {
		t.Run(fmt.Sprintf("background=%v", background), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.Pool(t)
			p := &provider{sends: map[string]int{}}
			w := ridesWorkflow(t, db, "rides", p)
			// The charge has no reconcile function: a key whose charge's
			// outcome is unknown waits for an operator.
			const held, crashed = 250, 5
			abandonMany(t, db, w.Name(), held+crashed)
			if _, err := db.Exec(ctx, `
UPDATE idempotency_keys SET hold = 'unknown', recovery_point = 'ride_created', last_run_at = now() - interval '1 hour'
WHERE idempotency_key < $1`, fmt.Sprintf("%s-%05d", w.Name(), held)); err != nil {
				t.Fatal(err)
			}
			// An Interval of a minute: the crashed keys finish in time only
			// if the passes that claim nothing but held keys are followed
			// at once by the next.
			c := client(t, db, func(c *phase.Config) { c.Completer.Interval, c.Reaper.Interval = time.Minute, -1 }, w)
			if background {
				if err := c.Start(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := c.Stop(ctx); err != nil {
						t.Error(err)
					}
				})
			} else {
				res, err := c.Complete(ctx)
				if err != nil || res.Completed != crashed {
					t.Fatalf("drain: %+v %v, want the %d crashed keys completed", res, err, crashed)
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				var done, waiting int
				if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE finished_at IS NOT NULL),
					count(*) FILTER (WHERE hold = 'unknown' AND recovery_point = 'ride_created') FROM idempotency_keys`).
					Scan(&done, &waiting); err != nil {
					t.Fatal(err)
				}
				if done == crashed && waiting == held {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d keys finished and %d on hold; want the %d crashed keys finished and the %d held ones left",
						done, waiting, crashed, held)
				}
				time.Sleep(20 * time.Millisecond)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.sends) != crashed {
				t.Errorf("%d downstream keys charged, want the %d crashed keys' only", len(p.sends), crashed)
			}
		})
	}
}

func TestAnInvalidConfigValueIsRefusedByName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  func() error
		want string
	}{
		{func() error { _, err := (recovery.CompleterConfig{BatchSize: -100}).WithDefaults(); return err }, "CompleterConfig.BatchSize is -100"},
		{func() error {
			_, err := (recovery.CompleterConfig{Interval: -2 * time.Second}).WithDefaults()
			return err
		}, "CompleterConfig.Interval is -2s"},
		{func() error { _, err := (recovery.CompleterConfig{MaxAttempts: -1}).WithDefaults(); return err }, "CompleterConfig.MaxAttempts is -1"},
		{func() error { _, err := (recovery.ReaperConfig{Pause: -3}).WithDefaults(); return err }, "ReaperConfig.Pause is -3ns"},
	} {
		if err := tc.err(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want an error saying %s", err, tc.want)
		}
	}
	for _, c := range []recovery.CompleterConfig{{Interval: -1}, {StuckAfter: -1}, {Backoff: -1}} {
		if _, err := c.WithDefaults(); err != nil {
			t.Errorf("%+v: %v, want -1 accepted", c, err)
		}
	}
}

// TestADrainReadsTheStuckKeysForBurialOnlyWhenKeysFailed drains a backlog
// in many passes: the statement that buries keys out of attempts reads
// every stuck key, so it runs in the first pass, and again only after a
// pass in which keys failed.
func TestADrainReadsTheStuckKeysForBurialOnlyWhenKeysFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	counter := &pgtest.StatementCounter{}
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = counter })
	p := &provider{sends: map[string]int{}}
	w := ridesWorkflow(t, db, "rides", p)
	const keys = 300
	abandonMany(t, db, w.Name(), keys)
	c := client(t, db, func(c *phase.Config) { c.Completer.BatchSize = 25 }, w)
	counter.Reset()
	res, err := c.Complete(ctx)
	if err != nil || res.Completed != keys {
		t.Fatalf("drain: %+v %v, want %d keys completed", res, err, keys)
	}
	burials := 0
	for _, sql := range counter.SQL() {
		if strings.Contains(sql, "SET hold = 'dead'") {
			burials++
		}
	}
	if burials != 1 {
		t.Errorf("a drain of %d keys in passes of at most 25 buried %d times; want once, in its first pass", keys, burials)
	}
	checkEachKeyRanOnce(t, db, p, keys)
}

// TestADrainLeavesNoFinishedKeyInTheWatch: the completer drops each key it
// finishes from its watch. Otherwise each row stayed until a claim reached
// it, a lease after the claim that took the key, and a process started
// after a drain read through as many rows as the backlog had keys before
// it found a key due then.
func TestADrainLeavesNoFinishedKeyInTheWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 20 })
	p := &provider{took: time.Millisecond, sends: map[string]int{}}
	w := ridesWorkflow(t, db, "rides", p)
	const keys = 500
	abandonMany(t, db, w.Name(), keys)
	c := client(t, db, nil, w)
	res, err := c.Complete(ctx)
	if err != nil || res.Completed != keys {
		t.Fatalf("drain: %+v %v, want %d keys completed", res, err, keys)
	}
	var watched, finished int
	err = db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE k.finished_at IS NOT NULL)
		FROM atomicphase_watch w LEFT JOIN idempotency_keys k USING (id)`).Scan(&watched, &finished)
	if err != nil {
		t.Fatal(err)
	}
	if watched != 0 {
		t.Errorf("after the drain the watch holds %d keys, %d of them finished; want none", watched, finished)
	}
	checkEachKeyRanOnce(t, db, p, keys)
}

// Live requests keep priority: while the completer drains a backlog, the
// live runs of its process that take over 1.5 times their p99 of while it
// was idle make it run fewer keys at once. Here, after each pass, a
// hundred live runs go through the same client, and sleep in their phase
// when two or more of the pass's keys were in their calls at once, as if
// they had queued behind them for the same CPU: each pass is judged by its
// own runs. The completer comes down from its Concurrency of four to one
// key at once, probes two and is sent back, and runs each key once.
func TestTheCompleterYieldsToLiveRunsItSlows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 40 })
	// Calls long enough that the keys of a pass overlap in theirs.
	p := &provider{took: 60 * time.Millisecond, sends: map[string]int{}}
	w := ridesWorkflow(t, db, "rides", p)
	var (
		slowed atomic.Bool
		// slowBy is how long a slowed live run sleeps: well past the line
		// the idle runs draw, however busy the machine makes them.
		slowBy atomic.Int64
	)
	slowBy.Store(int64(400 * time.Millisecond))
	live, err := phase.NewWorkflow("live",
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[job, struct{}]) (phase.Result, error) {
			if slowed.Load() {
				time.Sleep(time.Duration(slowBy.Load()))
			}
			return phase.JSON(201, in.Req), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	var (
		n      atomic.Int64
		passes []int64 // the most keys in their calls at once, pass by pass
		c      *phase.Client
	)
	var (
		mu   sync.Mutex
		took []time.Duration
	)
	runs := func(count int) {
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				for range count / 20 {
					key := fmt.Sprintf("live-%d", n.Add(1))
					began := time.Now()
					if _, err := live.Run(ctx, c, "acme", key, job{}); err != nil {
						t.Error(err)
					}
					mu.Lock()
					took = append(took, time.Since(began))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	judged := passWrapper(func(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error) {
		p.maxSeen.Store(0)
		res, err := next(ctx)
		if res.Claimed > 0 {
			most := p.maxSeen.Load()
			passes = append(passes, most)
			slowed.Store(most >= 2)
			runs(100)
			slowed.Store(false)
		}
		return res, err
	})
	c = client(t, db, func(c *phase.Config) {
		c.Completer.BatchSize = 10
		c.Hooks = []phase.Hook{judged}
	}, w, live)
	// The completer idle: its process's live runs draw the line, from the
	// last thousand, which leave out the first on each new connection.
	runs(1200)
	// The line's p99, of the last thousand as the completer takes it.
	idle := slices.Sorted(slices.Values(took[len(took)-1000:]))
	slowBy.Store(max(slowBy.Load(), int64(4*idle[len(idle)*99/100])))
	const keys = 200
	abandonMany(t, db, w.Name(), keys)
	res, err := c.Complete(ctx)
	if err != nil || res.Completed != keys {
		t.Fatalf("drain: %+v %v, want %d keys completed", res, err, keys)
	}
	checkEachKeyRanOnce(t, db, p, keys)
	if len(passes) < 10 || slices.Max(passes[:3]) < 3 {
		t.Fatalf("passes ran at most %v keys at once; want ten or more, three or more at once among the first three", passes)
	}
	// Three verdicts bring four down to one; from then on, two at most.
	if most := slices.Max(passes[3:]); most > 2 {
		t.Errorf("passes ran at most %v keys at once while live runs were slowed by two; want at most 2 from the fourth", passes)
	}
}

// passWrapper is a pass wrapper made of a function.
type passWrapper func(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error)

func (passWrapper) IsHook() bool { return true }

func (f passWrapper) WrapPass(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error) {
	return f(ctx, next)
}
