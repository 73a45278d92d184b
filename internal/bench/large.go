package bench

import (
	"context"
	"crypto/md5"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// loadSQL inserts finished keys numbered $6 to $7 of a load numbered $10 to
// $11, as library runs of the benchmark's order would have left them, the
// load finished one after the other over the 24 hours before now() - $5, so
// that, as in a real table, rows finished at about the same time sit in the
// same pages, with UUIDv7 ids of their time as this release gives them.
// Keys are UUID-shaped but derived from their number, so loadedKey can name
// any of them without reading the table, and they arrive in random index
// order like real clients' keys; their tenants are $1 followed by their
// number modulo $12 (see loadedTenant).
const loadSQL = `
INSERT INTO idempotency_keys
    (id, created_at, last_run_at, finished_at, tenant, idempotency_key, workflow,
     request_fingerprint, request_params, recovery_point, phase_state,
     response_status, response_headers, response_body, attempts)
SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' || substr(md5(i::text), 1, 3)
        || '8' || substr(md5(i::text), 4, 15))::uuid,
       t - interval '2 milliseconds', t, t, $1 || (i % $12), md5('loaded-' || i)::uuid::text, $2,
       $3, $4, 'finished', jsonb_build_object('order_id', i),
       201, '{"Content-Type": ["application/json"]}',
       convert_to(json_build_object('order_id', i, 'item', $8::text, 'amount', $9::int)::text || E'\n', 'UTF8'), 1
FROM (SELECT i, now() - $5::interval - ($11 - i) * (interval '24 hours' / ($11 - $10 + 1)) AS t
      FROM generate_series($6::int, $7::int) AS i) AS s`

// loadedKey is the key of the i-th row LoadFinished inserted.
func loadedKey(i int) string {
	return uuid.UUID(md5.Sum([]byte("loaded-" + strconv.Itoa(i)))).String()
}

// loadedTenantPrefix and loadedTenant name the tenant of the i-th row
// LoadFinished inserted: the rows are dealt out over the benchmark's
// tenants in turn.
const loadedTenantPrefix = "tenant-"

func loadedTenant(i int) string { return loadedTenantPrefix + strconv.Itoa(i%tenants) }

// Empty deletes every key and every row the workflows wrote.
func (e *Env) Empty(ctx context.Context) error {
	if _, err := e.Pool.Exec(ctx, `TRUNCATE idempotency_keys, baseline_keys, orders, audit_records`); err != nil {
		return fmt.Errorf("bench: empty tables: %w", err)
	}
	e.loaded = 0
	return nil
}

// LoadFinished inserts n finished keys whose responses were stored between
// age and age + 24 hours ago, then vacuums and analyzes the table so that it
// looks like one in steady state rather than one just bulk-loaded.
func (e *Env) LoadFinished(ctx context.Context, n int, age time.Duration) error {
	req, err := e.keyRequest("", "", time.Hour)
	if err != nil {
		return err
	}
	// In chunks, so that no statement runs for minutes. Each chunk spreads
	// its keys over the 24 hours as the whole load would.
	const chunk = 1_000_000
	for from := 0; from < n; from += chunk {
		to := min(from+chunk, n)
		_, err = e.Pool.Exec(ctx, loadSQL, loadedTenantPrefix, req.Workflow, req.Fingerprint[:], req.Params, age,
			e.loaded+from+1, e.loaded+to, order.Item, order.Amount, e.loaded+1, e.loaded+n, tenants)
		if err != nil {
			return fmt.Errorf("bench: load keys: %w", err)
		}
	}
	e.loaded += n
	if _, err := e.Pool.Exec(ctx, `VACUUM (ANALYZE) idempotency_keys`); err != nil {
		return fmt.Errorf("bench: vacuum: %w", err)
	}
	return nil
}

// Warm reads the keys table and then its indexes into shared buffers with
// pg_prewarm, so that a freshly loaded table is measured as one in steady
// state, whose pages were read long ago, and returns the number of blocks
// it read: none when pg_prewarm, a contrib extension only a superuser can
// create, is not at hand. When the table and its indexes do not fit, the
// indexes, read last, are what stays.
func (e *Env) Warm(ctx context.Context) (int64, error) {
	if _, err := e.Pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_prewarm WITH SCHEMA public`); err != nil {
		return 0, nil
	}
	var blocks int64
	err := e.Pool.QueryRow(ctx, `
SELECT sum(public.pg_prewarm(rel))::bigint
FROM (SELECT 'idempotency_keys'::regclass AS rel, 0 AS ord
      UNION ALL
      SELECT indexrelid::regclass, 1 FROM pg_index WHERE indrelid = 'idempotency_keys'::regclass
      ORDER BY ord) AS r`).Scan(&blocks)
	if err != nil {
		return 0, fmt.Errorf("bench: warm: %w", err)
	}
	return blocks, nil
}

// acquireClock times the acquire of library runs from the Observer's
// EventNew, which a run emits right after its acquire statement.
// The time includes encoding and fingerprinting the request, a few
// microseconds.
type acquireClock struct {
	mu        sync.Mutex
	started   map[string]time.Time
	latencies []time.Duration
}

func (c *acquireClock) start(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started[key] = time.Now()
}

func (c *acquireClock) acquired(key string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.started[key]; ok {
		c.latencies = append(c.latencies, now.Sub(t))
		delete(c.started, key)
	}
}

// take returns the latencies timed so far, sorted, and forgets them.
func (c *acquireClock) take() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.latencies
	c.latencies = nil
	slices.Sort(l)
	return l
}

// ReapResult is what ReapUnderTraffic measured.
type ReapResult struct {
	// Before and During are the traffic's requests (library runs of the
	// three-phase workflow on new keys) alone and while the reaper ran.
	Before, During Result
	// AcquireBefore and AcquireDuring hold the acquire latencies of those
	// requests.
	AcquireBefore, AcquireDuring Result
	// Deleted counts the keys the reaper deleted, in Reap.
	Deleted int
	Reap    time.Duration
	// Batches is the time each delete statement took, in order.
	Batches []time.Duration
	// BatchSize and Pause are the reaper's.
	BatchSize int
	Pause     time.Duration
}

// ReapUnderTraffic runs library requests on new keys from concurrency
// clients, first alone for before, then while a reaper configured by rc
// (zero values: the defaults, as a client's reaper runs) deletes every
// expired key. The reaper runs in a client of its own over a connection of
// its own, whose delete statements are timed. Load the expired keys first
// with LoadFinished.
func (e *Env) ReapUnderTraffic(ctx context.Context, concurrency int, before time.Duration, rc recovery.ReaperConfig) (ReapResult, error) {
	var res ReapResult
	rc.Interval = -1
	rc, err := rc.WithDefaults()
	if err != nil {
		return res, err
	}
	res.BatchSize, res.Pause = rc.BatchSize, rc.Pause
	cfg := e.Pool.Config()
	cfg.ConnConfig.Tracer = &deleteClock{batches: &res.Batches}
	cfg.MaxConns = 1
	reaperPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer reaperPool.Close()
	reaper, err := phase.NewClient(reaperPool, &phase.Config{
		Completer: recovery.CompleterConfig{Interval: -1},
		Reaper:    rc,
	})
	if err != nil {
		return res, err
	}

	load, err := e.Prepare(ctx, LibraryRun, concurrency)
	if err != nil {
		return res, err
	}
	clock := &acquireClock{started: map[string]time.Time{}}
	e.clock.Store(clock)
	defer e.clock.Store(nil)
	if res.Before, err = load.Run(ctx, 0, before); err != nil {
		return res, err
	}
	res.AcquireBefore = acquireResult(res.Before, clock.take())

	stop := load.start(ctx)
	start := time.Now()
	reaped, reapErr := reaper.Reap(ctx)
	res.Reap, res.Deleted = time.Since(start), reaped.Reaped
	if res.During, err = stop(); err != nil {
		return res, err
	}
	if reapErr != nil {
		return res, reapErr
	}
	res.AcquireDuring = acquireResult(res.During, clock.take())
	return res, nil
}

// deleteClock is a pgx tracer that times the reaper's DELETE batches of a
// connection used by one goroutine at a time.
type deleteClock struct {
	batches *[]time.Duration
	start   time.Time
}

func (c *deleteClock) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.start = time.Time{}
	// The reaper's batches delete keys; its trims of the status history
	// and of the backlog's counts are not among them.
	if sql := strings.TrimSpace(data.SQL); strings.HasPrefix(sql, "DELETE") && !strings.Contains(sql, "atomicphase_") {
		c.start = time.Now()
	}
	return ctx
}

func (c *deleteClock) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {
	if !c.start.IsZero() {
		*c.batches = append(*c.batches, time.Since(c.start))
	}
}

// BatchTimes returns the mean time of the first n and of the last n delete
// batches: whether batches slow down as the reaper works through the table.
func (r ReapResult) BatchTimes(n int) (first, last time.Duration) {
	k := len(r.Batches)
	return mean(r.Batches[:min(n, k)]), mean(r.Batches[max(0, k-n):])
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

func acquireResult(traffic Result, latencies []time.Duration) Result {
	return Result{Kind: AcquireNew, Concurrency: traffic.Concurrency, Elapsed: traffic.Elapsed, Latencies: latencies}
}

// ExpireScan times one store.Expire call with the default retention and
// batch size: the reaper's search for abandoned keys, which it makes at the
// start of every run.
func (e *Env) ExpireScan(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	_, err := store.Expire(ctx, e.Pool, "", recovery.DefaultRetention, recovery.DefaultReapBatch, false)
	return time.Since(start), err
}
