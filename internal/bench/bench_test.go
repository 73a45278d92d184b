package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// envLarge names the environment variable that enables the benchmarks that
// load a million keys.
const envLarge = "ATOMICPHASE_BENCH_LARGE"

func setup(tb testing.TB) *Env {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(tb))
	if err != nil {
		tb.Fatal(err)
	}
	env, err := Open(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(env.Close)
	return env
}

func large(b *testing.B) {
	b.Helper()
	if os.Getenv(envLarge) == "" {
		b.Skipf("loads a million keys; set %s=1 to run it", envLarge)
	}
}

// TestEachPathCostsWhatTheCostModelSays pins the statements and round trips
// behind the benchmark figures: a local phase costs its own statements plus
// one round trip (BEGIN travels with its first statement, the advance with
// COMMIT), and none when the next phase is local too (its advance travels
// with that phase's first statement, and one COMMIT AND CHAIN ends the one
// transaction and begins the other), a foreign call none of its own (the
// commit before it proves the lease; its record commits alone, before the
// next phase runs), acquire, replay and 409 one statement
// each, and the baseline one round trip per statement.
func TestEachPathCostsWhatTheCostModelSays(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		kind              Kind
		statements, trips int
	}{
		// The advance of a local phase followed by a local phase travels
		// with that phase's first statement, and COMMIT AND CHAIN stands
		// for the one's COMMIT and the other's BEGIN.
		{LibraryRun, 1 + phases*(1+userStatements+2) - (phases - 1), 1 + phases*userStatements + 1},
		{BaselineRun, 1 + phases*(1+userStatements+2), 1 + phases*(1+userStatements+2)},
		// The commit before the foreign call proves the lease: no renewal;
		// the charge's record commits on its own, before anything after
		// it runs, and the last phase begins a transaction of its own.
		{LibraryRides, 1 + phases*(1+userStatements+2), 1 + phases*(1+userStatements)},
		{BaselineRides, 1 + phases*(1+userStatements+2), 1 + phases*(1+userStatements+2)},
		{LibraryReplay, 1, 1},
		{BaselineReplay, 2, 2},
		{LibraryConflict, 1, 1},
		{BaselineConflict, 2, 2},
	} {
		load, err := env.Prepare(ctx, tc.kind, 1)
		if err != nil {
			t.Fatal(err)
		}
		res, err := load.Run(ctx, 5, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatementsPerRequest() != float64(tc.statements) || res.RoundTripsPerRequest() != float64(tc.trips) {
			t.Errorf("%v: %.2f statements and %.2f round trips a request; want %d and %d",
				tc.kind, res.StatementsPerRequest(), res.RoundTripsPerRequest(), tc.statements, tc.trips)
		}
	}
}

// TestReaperDeletesEveryExpiredKeyUnderTraffic runs the reaper measurement
// on a small table: every expired key is deleted, in batches of the default
// size, while the workflow's requests keep being answered.
func TestReaperDeletesEveryExpiredKeyUnderTraffic(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	const expired = 2500
	if err := env.LoadFinished(ctx, expired, 25*time.Hour); err != nil {
		t.Fatal(err)
	}
	res, err := env.ReapUnderTraffic(ctx, 2, 200*time.Millisecond, recovery.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if batches := (expired + res.BatchSize) / res.BatchSize; res.Deleted != expired || len(res.Batches) != batches {
		t.Errorf("reaper deleted %d keys in %d batches; want %d in %d", res.Deleted, len(res.Batches), expired, batches)
	}
	if res.Before.Requests() == 0 || res.AcquireBefore.Requests() == 0 {
		t.Errorf("traffic before the reaper: %d requests, %d acquires timed; want some",
			res.Before.Requests(), res.AcquireBefore.Requests())
	}
	var left int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE finished_at < now() - interval '24 hours'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d expired keys left after the reaper", left)
	}
}

// TestDrainFinishesABacklogOnTwoNodesEachKeyOnce runs the drain
// measurement on a small backlog: two completers finish every key while
// live requests keep being answered, each key charged and its order
// created once (DrainUnderTraffic checks both), and both nodes do some of
// the work.
func TestDrainFinishesABacklogOnTwoNodesEachKeyOnce(t *testing.T) {
	t.Parallel()
	env := setup(t)
	const keys = 400
	res, err := env.DrainUnderTraffic(context.Background(), DrainParams{Keys: keys, Nodes: 2, CallTook: 5 * time.Millisecond,
		Live: 2, LiveEvery: 10 * time.Millisecond, Before: 200 * time.Millisecond, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed[0]+res.Completed[1] != keys || res.Completed[0] == 0 || res.Completed[1] == 0 {
		t.Errorf("the nodes completed %v keys; want %d in all, some by each", res.Completed, keys)
	}
	if res.Before.Requests() == 0 || res.During.Requests() == 0 {
		t.Errorf("live requests: %d before, %d during the drain; want some of each", res.Before.Requests(), res.During.Requests())
	}
	// The completers' runs were timed, and no more ran at once than
	// their Concurrency allows.
	if most := float64(2 * recovery.DefaultConcurrency); res.AtOnce <= 0 || res.AtOnce > most {
		t.Errorf("the nodes ran %.2f keys at once on average; want some, at most %.0f", res.AtOnce, most)
	}
	// A key costs its run's statements but the acquire (12 of the rides
	// shape's 13: the claim took the lease) and its share of its pass's
	// (the bury, the claim, now and then the history), under one.
	if per := res.StatementsPerKey(); per < 12 || per >= 13 {
		t.Errorf("%.2f statements per drained key, want 12 and its share of a pass's 2 or 3", per)
	}
}

// TestWarmReadsTheTableAndEveryIndex checks that the large-table
// benchmarks measure a table whose every block was read into shared
// buffers.
func TestWarmReadsTheTableAndEveryIndex(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if err := env.LoadFinished(ctx, 10_000, 0); err != nil {
		t.Fatal(err)
	}
	blocks, err := env.Warm(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	err = env.Pool.QueryRow(ctx, `
SELECT (pg_relation_size('idempotency_keys') + sum(pg_relation_size(indexrelid)))::bigint / current_setting('block_size')::bigint
FROM pg_index WHERE indrelid = 'idempotency_keys'::regclass`).Scan(&want)
	if err != nil {
		t.Fatal(err)
	}
	if blocks != want || want < 500 {
		t.Errorf("Warm read %d blocks; the table and its indexes have %d", blocks, want)
	}
}

// BenchmarkRequests compares the library's three-phase workflow, the
// rides-shaped one, replay and 409 with the same statements written by hand
// after the reference, at each concurrency, on one database and pool. ns/op
// is wall time over requests (the inverse of throughput); mean-us, p50-us
// and p99-us are the time a request took; server-us and wal-B the server
// time and WAL per request, when the server has pg_stat_statements loaded.
func BenchmarkRequests(b *testing.B) {
	env := setup(b)
	for _, c := range Concurrencies {
		for _, k := range []Kind{LibraryRun, BaselineRun, LibraryRides, BaselineRides, LibraryReplay, BaselineReplay, LibraryConflict, BaselineConflict} {
			b.Run(fmt.Sprintf("c=%d/%s", c, name(k)), func(b *testing.B) {
				measure(b, env, k, c)
			})
		}
	}
}

// BenchmarkAcquire measures the acquire statement alone, on new keys and on
// finished ones picked at random, with 10 thousand and, when
// ATOMICPHASE_BENCH_LARGE is set, 10 million finished keys in the table. The
// two tables are loaded first so that their benchmarks can run side by side,
// then read into shared buffers where pg_prewarm can be created.
func BenchmarkAcquire(b *testing.B) {
	sizes := []int{10_000}
	if os.Getenv(envLarge) != "" {
		sizes = append(sizes, 10_000_000)
	}
	envs := make([]*Env, len(sizes))
	for i, rows := range sizes {
		envs[i] = setup(b)
		if err := envs[i].LoadFinished(context.Background(), rows, 0); err != nil {
			b.Fatal(err)
		}
	}
	for _, env := range envs {
		if _, err := env.Warm(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	for _, k := range []Kind{AcquireFinished, AcquireNew} {
		for _, c := range []int{1, 8} {
			for i, rows := range sizes {
				b.Run(fmt.Sprintf("%s/c=%d/rows=%d", name(k), c, rows), func(b *testing.B) {
					measure(b, envs[i], k, c)
				})
			}
		}
	}
}

// BenchmarkReaperUnderTraffic loads a million expired keys and runs the
// three-phase workflow from 8 clients, alone for five seconds and then
// while a reaper with the default batch size and pause deletes them all. It
// runs once whatever b.N; run it with -benchtime 1x.
func BenchmarkReaperUnderTraffic(b *testing.B) {
	large(b)
	ctx := context.Background()
	env := setup(b)
	if err := env.LoadFinished(ctx, 1_000_000, 25*time.Hour); err != nil {
		b.Fatal(err)
	}
	scan, err := env.ExpireScan(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	res, err := env.ReapUnderTraffic(ctx, 8, 5*time.Second, recovery.ReaperConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(us(res.AcquireBefore.Quantile(0.5)), "acquire-p50-before-us")
	b.ReportMetric(us(res.AcquireDuring.Quantile(0.5)), "acquire-p50-during-us")
	b.ReportMetric(us(res.AcquireBefore.Quantile(0.99)), "acquire-p99-before-us")
	b.ReportMetric(us(res.AcquireDuring.Quantile(0.99)), "acquire-p99-during-us")
	b.ReportMetric(us(res.Before.Quantile(0.99)), "request-p99-before-us")
	b.ReportMetric(us(res.During.Quantile(0.99)), "request-p99-during-us")
	b.ReportMetric(res.Before.PerSecond(), "req/s-before")
	b.ReportMetric(res.During.PerSecond(), "req/s-during")
	b.ReportMetric(float64(res.Deleted), "deleted")
	b.ReportMetric(res.Reap.Seconds(), "reap-s")
	first, last := res.BatchTimes(10)
	b.ReportMetric(ms(first), "first10-batch-ms")
	b.ReportMetric(ms(last), "last10-batch-ms")
	b.ReportMetric(ms(scan), "expire-scan-ms")
}

// measure runs b.N requests of kind k from c clients and reports them.
func measure(b *testing.B, env *Env, k Kind, c int) {
	ctx := context.Background()
	load, err := env.Prepare(ctx, k, c)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	res, err := load.Run(ctx, b.N, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(res.PerSecond(), "req/s")
	b.ReportMetric(us(res.Mean()), "mean-us")
	b.ReportMetric(us(res.Quantile(0.5)), "p50-us")
	b.ReportMetric(us(res.Quantile(0.99)), "p99-us")
	b.ReportMetric(res.StatementsPerRequest(), "stmts/op")
	b.ReportMetric(res.RoundTripsPerRequest(), "roundtrips/op")
	if env.Stats() {
		b.ReportMetric(us(res.ServerPerRequest()), "server-us")
		b.ReportMetric(res.WALPerRequest(), "wal-B")
	}
}

func name(k Kind) string { return strings.ReplaceAll(k.String(), " ", "-") }

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkCounts measures the operator's reads on a table of 10 thousand
// and, when ATOMICPHASE_BENCH_LARGE is set, 10 million finished keys (plus
// a few unfinished ones, as in steady state): Client.Counts, which counts
// the unfinished keys without reading the finished ones and estimates the finished
// ones of a large table from its statistics; the first page of every key,
// the page after its first 20 000 keys, reached by its cursor; and the first page of
// one state's keys.
func BenchmarkCounts(b *testing.B) {
	sizes := []int{10_000}
	if os.Getenv(envLarge) != "" {
		sizes = append(sizes, 10_000_000)
	}
	for _, rows := range sizes {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			env := setup(b)
			ctx := context.Background()
			if err := env.LoadFinished(ctx, rows, 0); err != nil {
				b.Fatal(err)
			}
			// A hundred dead keys among them.
			if _, err := env.Pool.Exec(ctx, `UPDATE idempotency_keys SET hold = 'dead', finished_at = NULL,
				recovery_point = 'started' WHERE id IN (SELECT id FROM idempotency_keys ORDER BY id LIMIT 100)`); err != nil {
				b.Fatal(err)
			}
			deep := keyrow.ListFilter{}
			for range 20 {
				page, err := store.List(ctx, env.Pool, keyrow.ListFilter{After: deep.After, Limit: 1000})
				if err != nil {
					b.Fatal(err)
				}
				deep.After = page.Next
			}
			for _, bc := range []struct {
				name string
				op   func() error
			}{
				{"counts", func() error { _, err := store.Count(ctx, env.Pool, time.Minute); return err }},
				{"list-first-page", func() error { _, err := store.List(ctx, env.Pool, keyrow.ListFilter{}); return err }},
				{"list-page-after-20000-keys", func() error { _, err := store.List(ctx, env.Pool, deep); return err }},
				{"list-dead", func() error {
					_, err := store.List(ctx, env.Pool, keyrow.ListFilter{Status: keyrow.StatusDead})
					return err
				}},
			} {
				b.Run(bc.name, func(b *testing.B) {
					for b.Loop() {
						if err := bc.op(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// TestCitusEveryStatementOfEitherSideRunsOnOneShard runs each request
// path, the library's and the baseline's, against a Citus coordinator on
// which Open distributed every table by tenant: every statement on a
// distributed table runs on one shard (as Citus counts its executions),
// so the comparison on the cluster is between single-shard transactions on
// both sides.
func TestCitusEveryStatementOfEitherSideRunsOnOneShard(t *testing.T) {
	// Not parallel: Citus counts executions per database, and this is the
	// only test of the package on the cluster.
	db := pgtest.CitusSchemaPool(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["citus.enable_stat_counters"] = "on"
	})
	env, err := Open(context.Background(), db.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	if !env.Distributed() || !env.ShardCounts() {
		t.Fatalf("Open on a Citus coordinator: distributed %v, counting shards %v; want both", env.Distributed(), env.ShardCounts())
	}
	ctx := context.Background()
	// A request's statements on distributed tables (BEGIN and COMMIT
	// aside), and its statements and round trips in all. On Citus the
	// library's requests cost what they cost on one Postgres (see
	// TestEachPathCostsWhatTheCostModelSays): the fenced write, a function
	// that runs the UPDATE, travels with COMMIT, and a local phase's with
	// the next phase's first statement. A replay or a 409 reads the key
	// after the insert found it.
	for _, tc := range []struct {
		kind                      Kind
		shards, statements, trips int
	}{
		{LibraryRun, 1 + phases*(userStatements+1), 1 + phases*(1+userStatements+2) - (phases - 1), 1 + phases*userStatements + 1},
		{BaselineRun, 1 + phases*(userStatements+1), 1 + phases*(1+userStatements+2), 1 + phases*(1+userStatements+2)},
		{LibraryRides, 1 + phases*(userStatements+1), 1 + phases*(1+userStatements+2), 1 + phases*(1+userStatements)},
		{BaselineRides, 1 + phases*(userStatements+1), 1 + phases*(1+userStatements+2), 1 + phases*(1+userStatements+2)},
		{LibraryReplay, 2, 2, 2},
		{BaselineReplay, 2, 2, 2},
		{LibraryConflict, 2, 2, 2},
		{BaselineConflict, 2, 2, 2},
	} {
		load, err := env.Prepare(ctx, tc.kind, 2)
		if err != nil {
			t.Fatal(err)
		}
		res, err := load.Run(ctx, 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(tc.shards * res.Requests()); res.SingleShard != want || res.MultiShard != 0 {
			t.Errorf("%v: %d requests ran %d statements on one shard and %d on several; want %d and none",
				tc.kind, res.Requests(), res.SingleShard, res.MultiShard, want)
		}
		if res.StatementsPerRequest() != float64(tc.statements) || res.RoundTripsPerRequest() != float64(tc.trips) {
			t.Errorf("%v: %.2f statements and %.2f round trips a request; want %d and %d",
				tc.kind, res.StatementsPerRequest(), res.RoundTripsPerRequest(), tc.statements, tc.trips)
		}
	}
}
