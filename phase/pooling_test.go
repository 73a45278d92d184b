package phase_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestNewClientRefusesPoolsThatCannotRunItsStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		configure func(*pgxpool.Config)
		want      string
	}{
		{"exec", func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec }, "cache_describe"},
		{"simple protocol", func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol }, "cache_describe"},
		{"no statement cache", func(c *pgxpool.Config) { c.ConnConfig.StatementCacheCapacity = 0 }, "statement_cache_capacity=0"},
		{"no description cache", func(c *pgxpool.Config) {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
			c.ConnConfig.DescriptionCacheCapacity = 0
		}, "description_cache_capacity=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.PoolWith(t, tc.configure)
			w := ordersWorkflow(t, newPayments())
			if _, err := phase.NewClient(db, nil, w); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewClient: %v, want an error naming %s", err, tc.want)
			}
			// The refusal is not a precaution: the store's first statement
			// fails under these settings.
			fp, _ := keyrow.Fingerprint("orders", []byte(`{}`))
			if _, _, err := store.Acquire(ctx, db, store.Request{Distributed: pgtest.OnCitus(), Tenant: "acme", Key: "k1", Workflow: "orders",
				Fingerprint: fp, Params: []byte(`{}`), TTL: time.Minute}); err == nil {
				t.Fatal("a key was acquired under settings NewClient refuses; the refusal is no longer needed")
			}
		})
	}
}

func TestCheckRefusesPreparedStatementsBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		route   string
		mode    pgx.QueryExecMode
		refused bool
	}{
		{"pgbouncer", pgx.QueryExecModeCacheStatement, true},
		{"pgbouncer", pgx.QueryExecModeDescribeExec, true},
		{"pgbouncer", pgx.QueryExecModeCacheDescribe, false},
		{"direct", pgx.QueryExecModeCacheStatement, false},
		{"direct", pgx.QueryExecModeDescribeExec, false},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.route, tc.mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			configure := func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = tc.mode }
			var db *pgxpool.Pool
			if tc.route == "pgbouncer" {
				db = pgtest.BouncerPoolWith(t, configure)
			} else {
				db = pgtest.PoolWith(t, configure)
			}
			e := setupPool(t, db, func(c *phase.Config) { c.Completer.Interval, c.Reaper.Interval = -1, -1 })
			err := e.c.Check(ctx)
			if !tc.refused {
				if err != nil {
					t.Fatalf("Check: %v, want nil", err)
				}
				if out, err := e.w.Run(ctx, e.c, "acme", "k1", order{Item: "lamp", Amount: 1}); err != nil || out.Kind != phase.OutcomeNew {
					t.Fatalf("run after the check passed: %v %v", out, err)
				}
				return
			}
			if !errors.Is(err, phase.ErrTransactionPooler) || !strings.Contains(err.Error(), "cache_describe") {
				t.Fatalf("Check: %v, want ErrTransactionPooler naming cache_describe", err)
			}
			if err := e.c.Start(ctx); !errors.Is(err, phase.ErrTransactionPooler) {
				t.Errorf("Start: %v, want ErrTransactionPooler", err)
			}
			if _, err := e.c.Complete(ctx); !errors.Is(err, phase.ErrTransactionPooler) {
				t.Errorf("Complete: %v, want ErrTransactionPooler", err)
			}
			if _, err := e.w.Run(ctx, e.c, "acme", "k1", order{Item: "lamp", Amount: 1}); !errors.Is(err, phase.ErrTransactionPooler) {
				t.Errorf("Run: %v, want ErrTransactionPooler", err)
			}
			if rec := post(e.handler(t), "k2", `{"item":"lamp","amount":1}`); rec.Code != http.StatusInternalServerError {
				t.Errorf("HTTP: %d %s, want 500", rec.Code, rec.Body)
			}
			if err := e.c.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			var keys int
			if err := db.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys", pgx.QueryExecModeSimpleProtocol).Scan(&keys); err != nil {
				t.Fatal(err)
			}
			if keys != 0 || e.pay.total() != 0 {
				t.Errorf("%d keys stored and %d charges made by a client that failed its check", keys, e.pay.total())
			}
		})
	}
}

func TestPreparedStatementLostBehindAPoolerTheProbeMissedIsNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One connection: the probe cannot compare two, so it only warns.
	db := pgtest.BouncerPoolWith(t, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
		c.MaxConns = 1
	})
	var logs syncBuffer
	e := setupPool(t, db, func(c *phase.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	if out, err := e.w.Run(ctx, e.c, "acme", "k1", order{Item: "lamp", Amount: 1}); err != nil || out.Kind != phase.OutcomeNew {
		t.Fatalf("first run: %v %v", out, err)
	}
	if !strings.Contains(logs.String(), "through a proxy") {
		t.Errorf("no warning about the proxy in the log:\n%s", logs.String())
	}
	// Another client holds the server session the first one prepared its
	// statements on, so the next run meets a session without them.
	other, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	_, err = e.w.Run(ctx, e.c, "acme", "k2", order{Item: "lamp", Amount: 1})
	if !errors.Is(err, phase.ErrTransactionPooler) {
		t.Fatalf("run on another server session: %v, want ErrTransactionPooler", err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes, for logs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestTerminatedServerSessionsUnderTrafficConverge(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "it ends every session of its database, which the Citus tests share")
	for _, route := range pgtest.Routes() {
		if route.Name == "citus" {
			continue // its sessions are other tests' too
		}
		t.Run(route.Name, func(t *testing.T) {
			t.Parallel()
			terminatedSessionsUnderTraffic(t, route.PoolWith(t, func(c *pgxpool.Config) { c.MaxConns = 16 }))
		})
	}
}

// terminateSQL ends every session of the test's database but the caller's.
const terminateSQL = `
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'`

// soakEnv names the environment variable that turns
// TestTerminatedServerSessionsUnderTrafficConverge into a soak: traffic for
// that long (a Go duration such as 2m), with a burst every two seconds.
const soakEnv = "ATOMICPHASE_TERMINATE_SOAK"

// terminatedSessionsUnderTraffic runs keys to their end while every session
// of the database on the server is terminated, ten times in a second, and
// checks that each key converged to one order, one charge and one stored
// response, and that runs only ever failed in ways that are safe to retry.
func terminatedSessionsUnderTraffic(t *testing.T, db *pgxpool.Pool) {
	const (
		defaultKeys = 400
		workers     = 16
		burst       = 10
		killEvery   = 100 * time.Millisecond
		burstEvery  = 2 * time.Second
	)
	var soak time.Duration
	if v := os.Getenv(soakEnv); v != "" {
		var err error
		if soak, err = time.ParseDuration(v); err != nil {
			t.Fatalf("%s: %v", soakEnv, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), soak+2*time.Minute)
	defer cancel()
	e := setupPool(t, db, func(c *phase.Config) {
		// Leases a killed session failed to free expire within a second.
		c.LeaseTTL = lockttl.MinTTL
		c.Completer = recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}
	})
	e.pay.delay = 5 * time.Millisecond
	admin, err := pgx.Connect(ctx, pgtest.Server(t).AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)

	var (
		terminated, finished atomic.Int64
		trafficDone          = make(chan struct{})
		killerDone           = make(chan struct{})
	)
	go func() {
		defer close(killerDone)
		// Once the traffic flows, terminate the sessions burst times, and
		// again every burstEvery in a soak.
		for finished.Load() < 20 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		for {
			for range burst {
				var n int64
				if err := admin.QueryRow(ctx, terminateSQL, db.Config().ConnConfig.Database).Scan(&n); err != nil {
					t.Errorf("terminate: %v", err)
					return
				}
				terminated.Add(n)
				time.Sleep(killEvery)
			}
			if soak == 0 {
				return
			}
			select {
			case <-trafficDone:
				return
			case <-time.After(burstEvery):
			}
		}
	}()

	var (
		mu        sync.Mutex
		responses = map[string][]byte{}
		took      []time.Duration // from first attempt to response, per key
		failures  = map[string]int{}
		failed    int
		attempts  atomic.Int64
		work      = make(chan string)
		wg        sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for key := range work {
				began := time.Now()
				for ctx.Err() == nil {
					attempts.Add(1)
					out, err := e.w.Run(ctx, e.c, "acme", key, order{Item: "lamp", Amount: 2000})
					if err == nil && out.Response != nil {
						mu.Lock()
						responses[key] = out.Response.Body
						took = append(took, time.Since(began))
						mu.Unlock()
						finished.Add(1)
						break
					}
					if err != nil {
						mu.Lock()
						failures[failureKind(err)]++
						failed++
						mu.Unlock()
					}
					time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
				}
			}
		})
	}
	began := time.Now()
	keys := 0
	for ; soak == 0 && keys < defaultKeys || soak > 0 && time.Since(began) < soak; keys++ {
		work <- fmt.Sprintf("k%06d", keys)
	}
	close(work)
	wg.Wait()
	close(trafficDone)
	<-killerDone
	slices.Sort(took)
	if len(took) > 0 {
		t.Logf("%s: %d keys in %d runs over %v; %d sessions terminated; failed runs by kind: %v; "+
			"first attempt to response: median %v, p99 %v, max %v",
			t.Name(), len(responses), attempts.Load(), time.Since(began).Round(time.Millisecond), terminated.Load(), failures,
			took[len(took)/2].Round(time.Millisecond), took[len(took)*99/100].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	}

	if terminated.Load() == 0 || failed == 0 {
		t.Fatalf("%d sessions terminated, failing %d runs: the burst missed the traffic", terminated.Load(), failed)
	}
	for kind, n := range failures {
		if kind != "unavailable" && kind != "lease lost" {
			t.Errorf("%d runs failed with %s, which is not safe to retry", n, kind)
		}
	}
	if len(responses) != keys {
		t.Fatalf("%d of %d keys got a response", len(responses), keys)
	}
	var orders, distinct, unfinished int
	if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT ikey),
		(SELECT count(*) FROM idempotency_keys WHERE finished_at IS NULL) FROM orders`).Scan(&orders, &distinct, &unfinished); err != nil {
		t.Fatal(err)
	}
	if orders != keys || distinct != keys || e.pay.total() != keys || unfinished != 0 {
		t.Fatalf("%d orders for %d keys, %d charges, %d keys unfinished; want one order and one charge for each of %d keys",
			orders, distinct, e.pay.total(), unfinished, keys)
	}
	for key, body := range responses {
		out, err := e.w.Run(ctx, e.c, "acme", key, order{Item: "lamp", Amount: 2000})
		if err != nil || out.Kind != phase.OutcomeReplayed || !bytes.Equal(out.Response.Body, body) {
			t.Fatalf("replay of %s: %v %v, want the bytes first answered", key, out, err)
		}
	}
}

// failureKind names the kind of a run's error for the report.
func failureKind(err error) string {
	switch {
	case errors.Is(err, phase.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, keyrow.ErrLeaseLost):
		return "lease lost"
	}
	return fmt.Sprintf("%q", err)
}

func TestStartWithTheDatabaseDownStartsAndChecksLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var logs syncBuffer
	w := ordersWorkflow(t, newPayments())
	c, err := phase.NewClient(db, &phase.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, w)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start with the database down: %v, want it to start and check later", err)
	}
	if !strings.Contains(logs.String(), "could not check the pool") {
		t.Errorf("no warning that the check was put off:\n%s", logs.String())
	}
	if _, err := w.Run(ctx, c, "acme", "k1", order{Item: "lamp", Amount: 1}); !errors.Is(err, phase.ErrUnavailable) {
		t.Errorf("run with the database down: %v, want ErrUnavailable", err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
