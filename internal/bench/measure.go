package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
	"github.com/atomicphase/atomicphase/phase"
)

// MaxConns is the pool size of every benchmark, library and baseline alike:
// enough for one connection per request at the highest concurrency measured.
const MaxConns = 32

// Concurrencies are the numbers of concurrent clients the request
// benchmarks compare.
var Concurrencies = []int{1, 8, 32}

// leaseTTL is the lease of every library run, and of the acquires the
// benchmarks send alone: the default.
const leaseTTL = lockttl.DefaultTTL

// Env is a database with the library's schema, the workflow's tables and
// the baseline's, and a pool whose statements are counted.
type Env struct {
	Pool *pgxpool.Pool
	// Counter counts every statement and round trip the pool sends.
	Counter *pgtest.StatementCounter

	client   *phase.Client
	workflow *phase.Workflow[Order, orderState]
	rides    *phase.Workflow[Order, orderState]
	// stub is the provider the rides-shaped workflow calls over http, and
	// charges its delay and count.
	stub    *httptest.Server
	charges charges
	http    *http.Client
	// stats is set when pg_stat_statements can be read: Results then
	// hold the server time and WAL of their statements.
	stats bool
	// distributed is set on a Citus coordinator, where Open distributed
	// every table by tenant.
	distributed bool
	// shardCounts is set on a Citus coordinator that counts executions
	// (citus.enable_stat_counters): Results then hold how many of their
	// statements ran on one shard and how many on several.
	shardCounts bool
	// CPU, when set, returns the CPU time used so far by this process and
	// by the database server; Results then hold the CPU time their
	// requests took, which noise on a shared machine does not inflate as it
	// does wall time.
	CPU func() (client, server time.Duration, err error)

	// loaded counts the keys LoadFinished inserted.
	loaded int
	// clock, when set, times the acquire of every library run.
	clock atomic.Pointer[acquireClock]
}

// Open connects with a copy of cfg made into a pool of MaxConns counted
// connections, and creates the tables (in the first schema of the
// search_path, so that two Envs can share a database). It starts the charge
// stub the rides-shaped requests call.
func Open(ctx context.Context, cfg *pgxpool.Config) (*Env, error) {
	e := &Env{Counter: &pgtest.StatementCounter{}}
	cfg = cfg.Copy()
	cfg.MaxConns = MaxConns
	cfg.ConnConfig.Tracer = e.Counter
	var err error
	if e.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	e.stub = chargeStub(&e.charges)
	e.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: MaxConns}}
	if err := e.open(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Env) open(ctx context.Context) error {
	if err := e.migrate(ctx); err != nil {
		return err
	}
	var err error
	if e.workflow, err = newWorkflow(); err != nil {
		return err
	}
	if e.rides, err = e.newRidesWorkflow(); err != nil {
		return err
	}
	// The client is never started: the completer and the reaper do not run
	// beside the requests measured. Nothing logs below Info, as in
	// production.
	e.client, err = phase.NewClient(e.Pool, &phase.Config{LeaseTTL: leaseTTL, Hooks: []phase.Hook{phase.ObserverFunc(e.observe)}}, e.workflow, e.rides)
	if err != nil {
		return err
	}
	// Statement statistics need the extension preloaded; without them the
	// server columns stay empty.
	_, err = e.Pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements WITH SCHEMA public`)
	if err == nil {
		err = e.Pool.QueryRow(ctx, `SELECT true FROM public.pg_stat_statements LIMIT 1`).Scan(&e.stats)
	}
	e.stats = err == nil
	return nil
}

// migrate creates the tables; on a Citus coordinator it distributes them
// all by tenant, co-located, unless they are already.
func (e *Env) migrate(ctx context.Context) error {
	var citus bool
	if err := e.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	migrate := atomicphase.Migrate
	if citus {
		migrate = atomicphase.Distribute
	}
	if err := migrate(ctx, e.Pool); err != nil {
		return err
	}
	if _, err := e.Pool.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("bench: create tables: %w", err)
	}
	if !citus {
		return nil
	}
	e.distributed = true
	var done bool
	err := e.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = to_regclass('orders'))`).Scan(&done)
	if err == nil && !done {
		_, err = e.Pool.Exec(ctx, distributeSQL)
	}
	if err != nil {
		return fmt.Errorf("bench: distribute tables: %w", err)
	}
	return e.Pool.QueryRow(ctx, `SELECT current_setting('citus.enable_stat_counters')::bool`).Scan(&e.shardCounts)
}

// Close closes the pool and stops the charge stub.
func (e *Env) Close() {
	e.Pool.Close()
	e.stub.Close()
	e.http.CloseIdleConnections()
}

// Stats reports whether Results hold server time and WAL bytes, which come
// from pg_stat_statements.
func (e *Env) Stats() bool { return e.stats }

// Distributed reports whether the tables are distributed by tenant on a
// Citus coordinator.
func (e *Env) Distributed() bool { return e.distributed }

// ShardCounts reports whether Results hold the number of statements that
// ran on one shard and on several, which come from Citus's
// citus_stat_counters.
func (e *Env) ShardCounts() bool { return e.shardCounts }

func (e *Env) observe(_ context.Context, ev keyrow.Event) {
	if ev.Kind != keyrow.EventNew {
		return
	}
	if c := e.clock.Load(); c != nil {
		c.acquired(ev.Key)
	}
}

// Kind is a request path the benchmarks drive.
type Kind int

// The request paths. Every library kind has a baseline twin that does the
// same with hand-written pgx.
const (
	// LibraryRun runs the three-phase workflow on a new key.
	LibraryRun Kind = iota
	// BaselineRun runs the same statements by hand on a new key.
	BaselineRun
	// LibraryReplay replays a finished key.
	LibraryReplay
	// BaselineReplay replays a finished baseline key.
	BaselineReplay
	// LibraryConflict sends a key another run holds: the 409 path.
	LibraryConflict
	// BaselineConflict sends a locked baseline key.
	BaselineConflict
	// AcquireNew runs the acquire statement alone on a new key.
	AcquireNew
	// AcquireFinished runs the acquire statement alone on a random key of those
	// loaded by LoadFinished: the replay lookup.
	AcquireFinished
	// LibraryRides runs the rides-shaped workflow (a local phase, a foreign
	// call to the charge stub, a local phase) on a new key.
	LibraryRides
	// BaselineRides runs the same by hand, the call inside the phase's
	// transaction as the reference makes it.
	BaselineRides
)

func (k Kind) String() string {
	switch k {
	case LibraryRun:
		return "library 3-phase"
	case BaselineRun:
		return "baseline 3-phase"
	case LibraryReplay:
		return "library replay"
	case BaselineReplay:
		return "baseline replay"
	case LibraryConflict:
		return "library 409"
	case BaselineConflict:
		return "baseline 409"
	case AcquireNew:
		return "acquire new key"
	case AcquireFinished:
		return "acquire finished key"
	case LibraryRides:
		return "library rides"
	case BaselineRides:
		return "baseline rides"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Baseline returns the baseline twin of a library kind, and false for
// kinds without one.
func (k Kind) Baseline() (Kind, bool) {
	switch k {
	case LibraryRun, LibraryReplay, LibraryConflict, LibraryRides:
		return k + 1, true
	}
	return 0, false
}

// Load is one kind of request, ready to be sent by a number of concurrent
// clients.
type Load struct {
	Kind        Kind
	Concurrency int
	// Every, when set, paces each client to one request per Every, as
	// live traffic arrives, rather than one as soon as the last is
	// answered; a client that falls behind sends at once.
	Every time.Duration
	env   *Env
	send  func(ctx context.Context, client int) error
}

// warmRequests is how many requests each client sends before a Load is
// measured, so that every pooled connection has prepared its statements.
const warmRequests = 10

// Prepare sets up what kind k needs for concurrency clients (a finished key
// per client to replay, a held key per client to conflict on) and warms the
// pool up with it.
func (e *Env) Prepare(ctx context.Context, k Kind, concurrency int) (*Load, error) {
	l := &Load{Kind: k, Concurrency: concurrency, env: e}
	var err error
	if l.send, err = e.sender(ctx, k, concurrency); err != nil {
		return nil, fmt.Errorf("bench: prepare %v: %w", k, err)
	}
	if _, err := l.run(ctx, warmRequests*concurrency, nil); err != nil {
		return nil, fmt.Errorf("bench: warm up %v: %w", k, err)
	}
	return l, nil
}

// sender returns the function that sends one request of kind k as a
// client.
func (e *Env) sender(ctx context.Context, k Kind, clients int) (func(ctx context.Context, client int) error, error) {
	switch k {
	case LibraryRun:
		return func(ctx context.Context, _ int) error {
			key := uuid.NewString()
			if c := e.clock.Load(); c != nil {
				c.start(key)
			}
			return e.runLibrary(ctx, e.workflow, key, phase.OutcomeNew)
		}, nil
	case BaselineRun:
		return func(ctx context.Context, _ int) error {
			return e.expectBaseline(ctx, uuid.NewString(), 201, false)
		}, nil
	case LibraryRides:
		return func(ctx context.Context, _ int) error {
			return e.runLibrary(ctx, e.rides, uuid.NewString(), phase.OutcomeNew)
		}, nil
	case BaselineRides:
		return func(ctx context.Context, _ int) error {
			return e.expectBaseline(ctx, uuid.NewString(), 201, true)
		}, nil
	case LibraryReplay, LibraryConflict:
		keys := make([]string, clients)
		want := phase.OutcomeReplayed
		for i := range keys {
			keys[i] = uuid.NewString()
			if err := e.holdOrFinish(ctx, keys[i], k == LibraryReplay); err != nil {
				return nil, err
			}
		}
		if k == LibraryConflict {
			want = phase.OutcomeInFlight
		}
		return func(ctx context.Context, client int) error {
			return e.runLibrary(ctx, e.workflow, keys[client], want)
		}, nil
	case BaselineReplay, BaselineConflict:
		keys := make([]string, clients)
		want := 201
		for i := range keys {
			keys[i] = uuid.NewString()
			if err := e.holdOrFinishBaseline(ctx, keys[i], k == BaselineReplay); err != nil {
				return nil, err
			}
		}
		if k == BaselineConflict {
			want = 409
		}
		return func(ctx context.Context, client int) error {
			return e.expectBaseline(ctx, keys[client], want, false)
		}, nil
	case AcquireNew:
		return func(ctx context.Context, _ int) error {
			key := uuid.NewString()
			return e.acquire(ctx, tenantOf(key), key, store.New)
		}, nil
	case AcquireFinished:
		if e.loaded == 0 {
			return nil, fmt.Errorf("no keys loaded; call LoadFinished first")
		}
		return func(ctx context.Context, _ int) error {
			i := 1 + rand.IntN(e.loaded)
			return e.acquire(ctx, loadedTenant(i), loadedKey(i), store.Replay)
		}, nil
	}
	return nil, fmt.Errorf("unknown kind %v", k)
}

// holdOrFinish leaves key finished by a library run, or held by a lease
// that outlives the benchmark.
func (e *Env) holdOrFinish(ctx context.Context, key string, finish bool) error {
	if finish {
		return e.runLibrary(ctx, e.workflow, key, phase.OutcomeNew)
	}
	req, err := e.keyRequest(tenantOf(key), key, time.Hour)
	if err != nil {
		return err
	}
	_, _, err = store.Acquire(ctx, e.Pool, req)
	return err
}

// holdOrFinishBaseline leaves a baseline key finished, or locked as by a
// request still running.
func (e *Env) holdOrFinishBaseline(ctx context.Context, key string, finish bool) error {
	if finish {
		return e.expectBaseline(ctx, key, 201, false)
	}
	params, err := json.Marshal(order)
	if err != nil {
		return err
	}
	_, err = e.Pool.Exec(ctx, baselineAcquireSQL, tenantOf(key), key, params)
	return err
}

func (e *Env) expectBaseline(ctx context.Context, key string, want int, rides bool) error {
	status, err := e.runBaseline(ctx, key, rides)
	if err != nil {
		return err
	}
	if status != want {
		return fmt.Errorf("bench: key %s: baseline status %d, want %d", key, status, want)
	}
	return nil
}

// keyRequest is the store.Request a library run of the benchmark's order
// under tenant's key makes.
func (e *Env) keyRequest(tenant, key string, ttl time.Duration) (store.Request, error) {
	params, err := json.Marshal(order)
	if err != nil {
		return store.Request{}, err
	}
	fp, err := keyrow.RequestFingerprint("", "application/json", params)
	if err != nil {
		return store.Request{}, err
	}
	return store.Request{Tenant: tenant, Key: key, Workflow: e.workflow.Name(), Definition: e.workflow.Definition(),
		Fingerprint: fp, Params: params, TTL: ttl, Distributed: e.distributed}, nil
}

func (e *Env) acquire(ctx context.Context, tenant, key string, want store.Outcome) error {
	req, err := e.keyRequest(tenant, key, leaseTTL)
	if err != nil {
		return err
	}
	got, _, err := store.Acquire(ctx, e.Pool, req)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("bench: key %s: acquire outcome %v, want %v", key, got, want)
	}
	return nil
}

// Run sends requests until n have been sent or d has passed, whichever
// comes first (zero means no limit), and measures them.
func (l *Load) Run(ctx context.Context, n int, d time.Duration) (Result, error) {
	var stop <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		stop = t.C
	}
	return l.run(ctx, n, stop)
}

// start sends requests in the background until the returned function is
// called, which returns what they measured.
func (l *Load) start(ctx context.Context) (stop func() (Result, error)) {
	halt := make(chan time.Time)
	var (
		res Result
		err error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err = l.run(ctx, 0, halt)
	}()
	return func() (Result, error) {
		close(halt)
		<-done
		return res, err
	}
}

// run is Run until n requests or a value on stop.
func (l *Load) run(ctx context.Context, n int, stop <-chan time.Time) (Result, error) {
	var (
		sent    atomic.Int64
		stopped atomic.Bool
		wg      sync.WaitGroup
		errOnce sync.Once
		runErr  error
	)
	latencies := make([][]time.Duration, l.Concurrency)
	if stop != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-stop:
				stopped.Store(true)
			case <-done:
			}
		}()
	}
	if err := l.env.resetStats(ctx); err != nil {
		return Result{}, err
	}
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	allocs := mem.Mallocs
	var client, server time.Duration
	if l.env.CPU != nil {
		var err error
		if client, server, err = l.env.CPU(); err != nil {
			return Result{}, err
		}
	}
	l.env.Counter.Reset()
	start := time.Now()
	for c := range l.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now()
			for !stopped.Load() && (n <= 0 || sent.Add(1) <= int64(n)) {
				if l.Every > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(l.Every)
				}
				t := time.Now()
				if err := l.send(ctx, c); err != nil {
					errOnce.Do(func() { runErr = err })
					stopped.Store(true)
					return
				}
				latencies[c] = append(latencies[c], time.Since(t))
			}
		}()
	}
	wg.Wait()
	r := Result{
		Kind:        l.Kind,
		Concurrency: l.Concurrency,
		Elapsed:     time.Since(start),
		Statements:  l.env.Counter.Statements(),
		RoundTrips:  l.env.Counter.RoundTrips(),
		Latencies:   slices.Concat(latencies...),
	}
	runtime.ReadMemStats(&mem)
	r.Allocs = mem.Mallocs - allocs
	if l.env.CPU != nil {
		nowClient, nowServer, err := l.env.CPU()
		if err != nil {
			return r, err
		}
		r.ClientCPU, r.CPU = nowClient-client, nowClient-client+nowServer-server
	}
	l.env.Counter.Reset()
	if runErr == nil {
		runErr = l.env.readStats(ctx, &r)
	}
	slices.Sort(r.Latencies)
	return r, runErr
}

// resetStats forgets the statement statistics gathered so far.
func (e *Env) resetStats(ctx context.Context) error {
	if e.shardCounts {
		if _, err := e.Pool.Exec(ctx, `SELECT citus_stat_counters_reset()`); err != nil {
			return fmt.Errorf("bench: reset citus counters: %w", err)
		}
	}
	if !e.stats {
		return nil
	}
	if _, err := e.Pool.Exec(ctx, `SELECT public.pg_stat_statements_reset()`); err != nil {
		return fmt.Errorf("bench: reset statement statistics: %w", err)
	}
	return nil
}

// readStats reads the server time (planning and execution) and the WAL of
// each statement run in this database since resetStats, and adds them up.
//
// BEGIN and COMMIT are left out: pg_stat_statements does not see them when
// they are pipelined with other statements, as the library sends them, and
// a COMMIT's time is mostly its wait for the WAL flush, which shows in the
// requests' latency instead.
func (e *Env) readStats(ctx context.Context, r *Result) error {
	if e.shardCounts {
		err := e.Pool.QueryRow(ctx, `
SELECT query_execution_single_shard, query_execution_multi_shard
FROM citus_stat_counters WHERE name = current_database()`).Scan(&r.SingleShard, &r.MultiShard)
		if err != nil {
			return fmt.Errorf("bench: read citus counters: %w", err)
		}
	}
	if !e.stats {
		return nil
	}
	rows, err := e.Pool.Query(ctx, `
SELECT query, calls, total_plan_time + total_exec_time, wal_bytes::bigint
FROM public.pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%pg_stat_statements_reset%'
  AND query NOT LIKE '%citus_stat_counters%'
  AND lower(query) NOT SIMILAR TO '(begin|commit|rollback)%'`)
	if err != nil {
		return fmt.Errorf("bench: read statement statistics: %w", err)
	}
	defer rows.Close()
	r.PerStatement = map[string]StatementCost{}
	for rows.Next() {
		var (
			query string
			cost  StatementCost
			ms    float64
		)
		if err := rows.Scan(&query, &cost.Calls, &ms, &cost.WALBytes); err != nil {
			return fmt.Errorf("bench: read statement statistics: %w", err)
		}
		cost.Time = time.Duration(ms * float64(time.Millisecond))
		r.PerStatement[query] = r.PerStatement[query].add(cost)
		r.ServerTime += cost.Time
		r.WALBytes += cost.WALBytes
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("bench: read statement statistics: %w", err)
	}
	return nil
}

// StatementCost is what the server spent on one statement, as
// pg_stat_statements counts it.
type StatementCost struct {
	Calls    int64
	Time     time.Duration
	WALBytes int64
}

func (c StatementCost) add(o StatementCost) StatementCost {
	return StatementCost{c.Calls + o.Calls, c.Time + o.Time, c.WALBytes + o.WALBytes}
}

// Result is what a Load measured.
type Result struct {
	Kind        Kind
	Concurrency int
	// Elapsed is the wall time from the first request sent to the last
	// answered.
	Elapsed time.Duration
	// Statements and RoundTrips count everything the pool sent meanwhile.
	Statements, RoundTrips int
	// ServerTime is the time the server spent planning and running the
	// statements of the database meanwhile, BEGIN and COMMIT aside, and
	// WALBytes the WAL they wrote, by pg_stat_statements; both zero without
	// it.
	ServerTime time.Duration
	WALBytes   int64
	// PerStatement holds the same by statement text, as pg_stat_statements
	// normalises it.
	PerStatement map[string]StatementCost
	// SingleShard and MultiShard count the statements on distributed
	// tables that Citus ran on one shard and on several, when
	// Env.ShardCounts.
	SingleShard, MultiShard int64
	// Allocs counts the heap allocations of the whole process meanwhile:
	// the requests', the load generator's and the charge stub's.
	Allocs uint64
	// CPU is the CPU time this process and the server used meanwhile, and
	// ClientCPU this process's part of it, when Env.CPU is set.
	CPU, ClientCPU time.Duration
	// Latencies holds the time of every request, sorted.
	Latencies []time.Duration
}

// Requests is how many requests were answered.
func (r Result) Requests() int { return len(r.Latencies) }

// PerSecond is the throughput: requests answered per second of wall time.
func (r Result) PerSecond() float64 { return float64(r.Requests()) / r.Elapsed.Seconds() }

// Mean is the mean time a request took.
func (r Result) Mean() time.Duration {
	if r.Requests() == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range r.Latencies {
		sum += d
	}
	return sum / time.Duration(r.Requests())
}

// Quantile returns the q-quantile of the request times (0.5 the median,
// 0.99 the p99), by the nearest-rank method.
func (r Result) Quantile(q float64) time.Duration {
	if r.Requests() == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(r.Requests()))) - 1
	return r.Latencies[min(max(i, 0), r.Requests()-1)]
}

// StatementsPerRequest is the statements sent per request answered.
func (r Result) StatementsPerRequest() float64 { return float64(r.Statements) / float64(r.Requests()) }

// RoundTripsPerRequest is the round trips made per request answered.
func (r Result) RoundTripsPerRequest() float64 { return float64(r.RoundTrips) / float64(r.Requests()) }

// ServerPerRequest is the server time per request answered.
func (r Result) ServerPerRequest() time.Duration {
	return r.ServerTime / time.Duration(max(r.Requests(), 1))
}

// WALPerRequest is the WAL bytes written per request answered.
func (r Result) WALPerRequest() float64 { return float64(r.WALBytes) / float64(r.Requests()) }

// CPUPerRequest is the CPU time per request answered.
func (r Result) CPUPerRequest() time.Duration {
	return r.CPU / time.Duration(max(r.Requests(), 1))
}

// ClientCPUPerRequest is this process's CPU time per request answered.
func (r Result) ClientCPUPerRequest() time.Duration {
	return r.ClientCPU / time.Duration(max(r.Requests(), 1))
}

// AllocsPerRequest is the heap allocations per request answered.
func (r Result) AllocsPerRequest() float64 { return float64(r.Allocs) / float64(r.Requests()) }

// Merge adds up results of the same kind and concurrency measured at
// different times, as one longer measurement.
func Merge(rs ...Result) Result {
	var m Result
	for _, r := range rs {
		m.Kind, m.Concurrency = r.Kind, r.Concurrency
		m.Elapsed += r.Elapsed
		m.Statements += r.Statements
		m.RoundTrips += r.RoundTrips
		m.ServerTime += r.ServerTime
		m.WALBytes += r.WALBytes
		m.SingleShard += r.SingleShard
		m.MultiShard += r.MultiShard
		m.Allocs += r.Allocs
		m.CPU += r.CPU
		m.ClientCPU += r.ClientCPU
		for q, c := range r.PerStatement {
			if m.PerStatement == nil {
				m.PerStatement = map[string]StatementCost{}
			}
			m.PerStatement[q] = m.PerStatement[q].add(c)
		}
		m.Latencies = append(m.Latencies, r.Latencies...)
	}
	slices.Sort(m.Latencies)
	return m
}
