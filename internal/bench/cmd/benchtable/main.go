// Command benchtable measures the library against the hand-written baseline
// in one process and prints the results as markdown tables, so that every
// ratio compares figures taken on the same machine at the same time.
//
// Usage:
//
//	go run ./internal/bench/cmd/benchtable [-rounds 5] [-round 2s] [-configs fast,durable,citus]
//		[-runs 1] [-large [-compare=false]] [-drain 10000,100000 [-compare=false]]
//		[-settings name=value,...] [-database-url URL]
//
// Each kind of request is measured in rounds, library and baseline
// alternating (and swapping which goes first every round), so that drift in
// a noisy machine's load falls on both alike.
//
// Each configuration is a throwaway Postgres started from local binaries
// with pg_stat_statements loaded, so that the tables show the server time
// and WAL of each request: "fast" with durability off (fsync,
// synchronous_commit and full_page_writes off, as the tests run), "durable"
// with it on, as production runs. "citus", not in the default list, is a
// Citus cluster of a coordinator and two workers, each node as "fast", with
// every table distributed by tenant and co-located: the comparison runs
// against the coordinator, every statement of either side on the one shard
// of its tenant, and the table counts the statements Citus ran on one shard
// and on several.
//
// -runs repeats the whole comparison, every configuration in turn, on a
// new server each time, and then prints the median of the runs'
// all-rounds ratios with their lowest and highest, and how far one more
// run may land from that median: the ratio of a single run strays from
// run to run by more than the rounds within it show.
//
// -large adds, on the first configuration of the first run, the acquire
// latency with 10 thousand and with 10 million keys in the table, again
// alternating, and the reaper deleting a million expired keys under
// traffic with its default batch size and pause; it takes many minutes
// more and about 10 GB of disk.
// Both tables are read into shared buffers with pg_prewarm before they are
// measured. Give the server the memory a production server of that size
// would have (the 10-million-key table and its indexes take about 6.3 GB):
// -settings shared_buffers=8GB,huge_pages=on, with vm.nr_hugepages set to
// cover it. With the default 64MB every lookup in a 10-million-key index
// reads from the operating system's cache, and without huge pages every
// backend maps the pages it reads one 4 kB page at a time.
//
// -drain adds, on the first configuration of the first run, the drain of
// a backlog of each size given: that many rides-shaped keys abandoned
// before their first phase, the stub's charge taking 20 ms, finished by one
// and then by two completers with the default configuration while live
// traffic (the three-phase request from 4 clients, each sending one every
// 20 ms) runs. It prints the keys drained a second, the time to empty, the
// keys the completers ran at once on average, the live requests' p50 and
// p99 before and during the drain, the server's CPU time and the
// completers' statements per drained key, and what bound the drain: this
// machine's CPU when it was saturated meanwhile, the completers' yielding
// to live requests when they ran under 85 % of their Concurrency, the
// calls' latency otherwise; and, for each drain, the backlog as
// `atomicphase counts` read it at five points of the drain against what
// the drain then did.
//
// With -database-url, the one configuration is that database, which must be
// a scratch database: the command creates its tables there (for -large also
// in the schemas bench_10000_keys and bench_10000000_keys) and empties them
// with TRUNCATE. It never reads $DATABASE_URL, which names an application's
// database as often as not.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/bench"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/recovery"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

// config is a server configuration benchtable can start.
type config struct {
	settings []string
	// citus starts a Citus coordinator and citusWorkers workers instead of
	// one server.
	citus bool
}

var configs = map[string]config{
	"fast":    {},
	"durable": {settings: []string{"fsync=on", "synchronous_commit=on", "full_page_writes=on"}},
	"citus":   {settings: []string{"citus.enable_stat_counters=on"}, citus: true},
}

// citusWorkers is the number of workers of the citus configuration.
const citusWorkers = 2

// statsSettings load pg_stat_statements in every server benchtable starts;
// on Citus nodes citus must be loaded first.
var statsSettings = []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_planning=on"}

// citusStatsSettings are statsSettings for Citus nodes.
var citusStatsSettings = []string{"shared_preload_libraries=citus,pg_stat_statements", "pg_stat_statements.track_planning=on"}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("benchtable", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rounds := fs.Int("rounds", 5, "rounds per kind of request; library and baseline alternate within each")
	round := fs.Duration("round", 2*time.Second, "length of one round of one kind")
	configList := fs.String("configs", "fast,durable", "server configurations to start, in order: fast, durable, citus")
	large := fs.Bool("large", false, "also measure acquire with 10 million keys and the reaper under traffic")
	drainList := fs.String("drain", "", "also measure the drain of backlogs of these sizes, comma-separated (10000,100000), on 1 and 2 nodes")
	compare := fs.Bool("compare", true, "compare the library with the baseline (-compare=false with -large measures only the large tables)")
	extra := fs.String("settings", "", "more server settings for the servers benchtable starts, comma-separated (shared_buffers=2GB)")
	dbURL := fs.String("database-url", "", "scratch Postgres database to use instead of starting servers; its benchmark tables are emptied")
	drainConcurrency := fs.Int("drain-concurrency", recovery.DefaultConcurrency, "keys each node's completer runs at once in the -drain measurement (CompleterConfig.Concurrency)")
	runs := fs.Int("runs", 1, "runs of the whole comparison; with more than one, the median of their ratios and how far another run may land follow")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *runs < 1 {
		return errors.New("-runs must be at least 1")
	}
	if *drainConcurrency < 1 {
		return errors.New("-drain-concurrency must be at least 1")
	}
	drain := drainPlan{concurrency: *drainConcurrency}
	for _, f := range strings.FieldsFunc(*drainList, func(r rune) bool { return r == ',' }) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return fmt.Errorf("-drain: %q is not a number of keys", f)
		}
		drain.sizes = append(drain.sizes, n)
	}
	var all ratios
	for run := range *runs {
		if *runs > 1 {
			fmt.Fprintf(stdout, "## Run %d of %d\n\n", run+1, *runs)
		}
		if *dbURL != "" {
			results, err := measure(ctx, "the given database", *dbURL, nil, *rounds, *round, *compare, *large && run == 0,
				drainOnce(drain, run == 0), stdout, stderr)
			if err != nil {
				return err
			}
			all.add("the given database", results)
			continue
		}
		for i, name := range strings.Split(*configList, ",") {
			c, ok := configs[name]
			if !ok {
				return fmt.Errorf("unknown configuration %q; use fast, durable or citus", name)
			}
			settings := append(slices.Clone(statsSettings), c.settings...)
			if c.citus {
				settings = append(slices.Clone(citusStatsSettings), c.settings...)
			}
			if *extra != "" {
				settings = append(settings, strings.Split(*extra, ",")...)
			}
			nodes, stop, err := startServer(ctx, name, c.citus, settings, stderr)
			if err != nil {
				return fmt.Errorf("%w\n(or pass -database-url with a scratch database)", err)
			}
			results, err := measure(ctx, name, nodes[0].dsn, nodes, *rounds, *round, *compare, *large && i == 0 && run == 0,
				drainOnce(drain, i == 0 && run == 0), stdout, stderr)
			if stopErr := stop(); err == nil {
				err = stopErr
			}
			if err != nil {
				return err
			}
			all.add(name, results)
		}
	}
	if *runs > 1 && *compare {
		all.print(stdout, *runs)
	}
	return nil
}

// node is a server benchtable started: one Postgres, or a node of a Citus
// cluster.
type node struct {
	name, dsn  string
	postmaster int
}

// startServer starts a throwaway Postgres, or with citus a Citus cluster,
// and returns its nodes, the one to measure on first, and the function that
// stops them.
func startServer(ctx context.Context, name string, citus bool, settings []string, progress io.Writer) ([]node, func() error, error) {
	if !citus {
		fmt.Fprintf(progress, "starting a throwaway Postgres (%s)...\n", name)
		cluster, err := pgcluster.Start(ctx, settings...)
		if err != nil {
			return nil, nil, err
		}
		return []node{{"server", cluster.DSN("postgres"), cluster.PID()}}, cluster.Stop, nil
	}
	fmt.Fprintf(progress, "starting a throwaway Citus coordinator and %d workers (%s)...\n", citusWorkers, name)
	cluster, err := pgcluster.StartCitus(ctx, citusWorkers, settings...)
	if err != nil {
		return nil, nil, err
	}
	nodes := []node{{"coordinator", cluster.Coordinator.DSN("postgres"), cluster.Coordinator.PID()}}
	for i, w := range cluster.Workers {
		nodes = append(nodes, node{fmt.Sprintf("worker %d", i+1), w.DSN("postgres"), w.PID()})
	}
	return nodes, cluster.Stop, nil
}

// drainPlan is the -drain measurement: the backlogs' sizes, and the keys
// each node's completer runs at once.
type drainPlan struct {
	sizes       []int
	concurrency int
}

// drainOnce returns the drain to measure when first, none otherwise.
func drainOnce(plan drainPlan, first bool) drainPlan {
	if !first {
		plan.sizes = nil
	}
	return plan
}

// measure runs the comparison, with large the large-table measurements,
// and the drain of a backlog of each size of drain, on the database at
// dsn, which nodes are when they are servers benchtable started (one, or a
// Citus cluster's; none otherwise). It returns the comparison's results.
func measure(ctx context.Context, name, dsn string, nodes []node, rounds int, round time.Duration, compare, large bool, drain drainPlan, w, progress io.Writer) ([]*measured, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	env, err := bench.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	var postmasters []int
	for _, n := range nodes {
		postmasters = append(postmasters, n.postmaster)
	}
	if len(postmasters) > 0 {
		if env.CPU, err = cpuClock(postmasters...); err != nil {
			fmt.Fprintln(progress, err)
		}
	}
	fmt.Fprintf(w, "### Configuration: %s\n\n", name)
	if err := describeServer(ctx, env, w); err != nil {
		return nil, err
	}
	var results []*measured
	if compare {
		if results, err = compareAll(ctx, env, rounds, round, progress); err != nil {
			return nil, err
		}
		printComparison(w, results, env.Stats(), env.CPU != nil, env.ShardCounts())
		if env.Stats() {
			printStatements(w, results, bench.LibraryRun, bench.BaselineRun)
			printStatements(w, results, bench.LibraryRides, bench.BaselineRides)
		}
		if len(nodes) > 1 && env.Stats() {
			if err := nodeCosts(ctx, env, nodes, rounds, round, w, progress); err != nil {
				return nil, err
			}
		}
	}
	if len(drain.sizes) > 0 {
		if err := drainBacklogs(ctx, env, drain, w, progress); err != nil {
			return nil, err
		}
	}
	if !large {
		return results, nil
	}
	if err := acquireLatency(ctx, cfg, rounds, round, w, progress); err != nil {
		return nil, err
	}
	return results, reaperUnderTraffic(ctx, env, w, progress)
}

// describeServer prints what the figures were measured on.
func describeServer(ctx context.Context, env *bench.Env, w io.Writer) error {
	var version string
	if err := env.Pool.QueryRow(ctx, `SELECT version()`).Scan(&version); err != nil {
		return err
	}
	rows, err := env.Pool.Query(ctx, `
SELECT name, current_setting(name) FROM pg_settings
WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', 'huge_pages', 'wal_level', 'max_connections')
ORDER BY name`)
	if err != nil {
		return err
	}
	settings, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var name, value string
		err := row.Scan(&name, &value)
		return name + "=" + value, err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Server: %s\nSettings: %s\nPool: %d connections\n", version, strings.Join(settings, ", "), bench.MaxConns)
	if env.Distributed() {
		var citus string
		var workers int
		err := env.Pool.QueryRow(ctx, `
SELECT (SELECT extversion FROM pg_extension WHERE extname = 'citus'),
       (SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND isactive)::int`).Scan(&citus, &workers)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "Citus %s: coordinator and %d workers; every table distributed by tenant, co-located with idempotency_keys\n", citus, workers)
	}
	fmt.Fprintln(w)
	return nil
}

// pairs are the kinds compared, each library kind then its baseline.
var pairs = [][2]bench.Kind{
	{bench.LibraryRun, bench.BaselineRun},
	{bench.LibraryRides, bench.BaselineRides},
	{bench.LibraryReplay, bench.BaselineReplay},
	{bench.LibraryConflict, bench.BaselineConflict},
}

// measured is every round of one kind at one concurrency.
type measured struct {
	kind        bench.Kind
	concurrency int
	rounds      []bench.Result
}

func compareAll(ctx context.Context, env *bench.Env, rounds int, round time.Duration, progress io.Writer) ([]*measured, error) {
	var all []*measured
	for _, c := range bench.Concurrencies {
		for _, pair := range pairs {
			var loads [2]*bench.Load
			for i, k := range pair {
				l, err := env.Prepare(ctx, k, c)
				if err != nil {
					return nil, err
				}
				loads[i] = l
			}
			res, err := alternate(ctx, loads, rounds, round, progress)
			if err != nil {
				return nil, err
			}
			for i, k := range pair {
				all = append(all, &measured{kind: k, concurrency: c, rounds: res[i]})
			}
		}
	}
	return all, nil
}

// alternate runs two loads for rounds rounds of d each, one after the
// other, swapping which goes first every round.
func alternate(ctx context.Context, loads [2]*bench.Load, rounds int, d time.Duration, progress io.Writer) ([2][]bench.Result, error) {
	var res [2][]bench.Result
	for r := range rounds {
		for j := range 2 {
			i := j ^ r%2
			fmt.Fprintf(progress, "%s, clients=%d: round %d/%d\n", loads[i].Kind, loads[i].Concurrency, r+1, rounds)
			out, err := loads[i].Run(ctx, 0, d)
			if err != nil {
				return res, err
			}
			res[i] = append(res[i], out)
		}
	}
	return res, nil
}

func printComparison(w io.Writer, all []*measured, stats, cpu, shards bool) {
	head, rule := "", ""
	if shards {
		head, rule = " single-shard / multi-shard statements/req |", "---:|"
	}
	fmt.Fprintln(w, "| request | clients | req/s | mean µs | p99 µs | statements/req | round trips/req | server µs/req | WAL B/req | CPU µs/req: all (Go) | Go allocs/req | throughput vs baseline: all rounds (median; min–max) |"+head)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"+rule)
	find := func(k bench.Kind, c int) *measured {
		for _, m := range all {
			if m.kind == k && m.concurrency == c {
				return m
			}
		}
		return nil
	}
	for _, m := range all {
		r := bench.Merge(m.rounds...)
		ratio := "—"
		if bk, ok := m.kind.Baseline(); ok {
			if b := find(bk, m.concurrency); b != nil {
				ratio = ratioCell(m.rounds, b.rounds)
			}
		}
		server, wal, cpuTime := "—", "—", "—"
		if stats {
			server, wal = fmt.Sprintf("%.0f", us(r.ServerPerRequest())), fmt.Sprintf("%.0f", r.WALPerRequest())
		}
		if cpu {
			cpuTime = fmt.Sprintf("%.0f (%.0f)", us(r.CPUPerRequest()), us(r.ClientCPUPerRequest()))
		}
		shardCell := ""
		if shards {
			n := float64(r.Requests())
			shardCell = fmt.Sprintf(" %.2f / %.2f |", float64(r.SingleShard)/n, float64(r.MultiShard)/n)
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %.0f | %.0f | %.2f | %.2f | %s | %s | %s | %.0f | %s |%s\n", m.kind, m.concurrency,
			r.PerSecond(), us(r.Mean()), us(r.Quantile(0.99)), r.StatementsPerRequest(), r.RoundTripsPerRequest(),
			server, wal, cpuTime, r.AllocsPerRequest(), ratio, shardCell)
	}
	fmt.Fprintln(w)
}

// roles name the statements of both implementations by what they do, in
// the order a request sends them; a statement's role is the first whose
// fragment its text (as pg_stat_statements normalises it) contains.
var roles = []struct{ name, fragment string }{
	{"take the key: acquire / upsert", "WITH found AS"},
	{"take the key: acquire / upsert", "INSERT INTO idempotency_keys"}, // on Citus
	{"take the key: acquire / upsert", "INSERT INTO baseline_keys"},
	{"replay or 409: lookup", "SELECT recovery_point, request_params"},
	{"user: insert order", "INSERT INTO orders"},
	{"user: confirm order", "SET status"},
	{"renew the lease before the call", "set_config"},
	{"renew the lease before the call", "SET lock_expires_at = now()"}, // on Citus
	{"user: record charge", "SET charge_id"},
	{"user: insert audit record", "INSERT INTO audit_records"},
	// In the rides-shaped request pg_stat_statements lists the fenced
	// advance under two entries, one with its constants as written and one
	// with them numbered; the fragment matches both.
	{"advance: fenced / plain", "SET recovery_point = $3, phase_state = $4, hold ="},
	{"advance: fenced / plain", "atomicphase_advance_from("}, // on Citus
	{"advance: fenced / plain", "UPDATE baseline_keys SET recovery_point = $2"},
	{"finish: fenced / plain", "finished_at = now()"},
	{"finish: fenced / plain", "atomicphase_finish_from("}, // on Citus
	{"finish: fenced / plain", "response_code"},
}

func role(query string) string {
	q := strings.ToLower(query)
	for _, r := range roles {
		if strings.Contains(q, strings.ToLower(r.fragment)) {
			return r.name
		}
	}
	return "other: " + strings.Join(strings.Fields(query), " ")
}

// printStatements prints what the server spent on each statement of a
// library kind and its baseline at one client, by role.
func printStatements(w io.Writer, all []*measured, lib, base bench.Kind) {
	var results [2]bench.Result
	for _, m := range all {
		for i, k := range []bench.Kind{lib, base} {
			if m.kind == k && m.concurrency == 1 {
				results[i] = bench.Merge(m.rounds...)
			}
		}
	}
	type cell struct{ calls, us, wal float64 }
	byRole := map[string]*[2]cell{}
	var order []string
	for _, r := range roles {
		if !slices.Contains(order, r.name) {
			order = append(order, r.name)
		}
	}
	for i, r := range results {
		for q, c := range r.PerStatement {
			name := role(q)
			if byRole[name] == nil {
				byRole[name] = &[2]cell{}
				if !slices.Contains(order, name) {
					order = append(order, name)
				}
			}
			n := float64(r.Requests())
			byRole[name][i].calls += float64(c.Calls) / n
			byRole[name][i].us += us(c.Time) / n
			byRole[name][i].wal += float64(c.WALBytes) / n
		}
	}
	fmt.Fprintf(w, "Server time by statement, %s vs %s, 1 client (pg_stat_statements: planning and execution; BEGIN and COMMIT aside):\n\n", lib, base)
	fmt.Fprintln(w, "| statement | library calls/req | library µs/call | library WAL B/call | baseline calls/req | baseline µs/call | baseline WAL B/call |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	perCall := func(c cell) string {
		if c.calls == 0 {
			return "— | — | —"
		}
		return fmt.Sprintf("%.2f | %.1f | %.0f", c.calls, c.us/c.calls, c.wal/c.calls)
	}
	var total [2]cell
	for _, name := range order {
		cells := byRole[name]
		if cells == nil {
			continue
		}
		for i := range cells {
			total[i].calls += cells[i].calls
			total[i].us += cells[i].us
			total[i].wal += cells[i].wal
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", name, perCall(cells[0]), perCall(cells[1]))
	}
	fmt.Fprintf(w, "| **whole request** | %.2f | **%.1f** | **%.0f** | %.2f | **%.1f** | **%.0f** |\n\n",
		total[0].calls, total[0].us, total[0].wal, total[1].calls, total[1].us, total[1].wal)
}

// ratioCell is the library's throughput over the baseline's for all rounds
// together, and the median and range of the per-round ratios.
func ratioCell(lib, base []bench.Result) string {
	total := allRounds(lib, base)
	var each []float64
	for i := range min(len(lib), len(base)) {
		each = append(each, lib[i].PerSecond()/base[i].PerSecond())
	}
	return fmt.Sprintf("**%.2f** (%.2f; %.2f–%.2f)", total, median(each), slices.Min(each), slices.Max(each))
}

// largeSizes are the table sizes acquire is compared at.
var largeSizes = [2]int{10_000, 10_000_000}

// acquireLatency measures acquire on new and finished keys with 10
// thousand and with 10 million finished keys in the table, each table in a
// schema of its own, alternating between them round by round.
func acquireLatency(ctx context.Context, cfg *pgxpool.Config, rounds int, d time.Duration, w, progress io.Writer) error {
	var envs [2]*bench.Env
	for i, rows := range largeSizes {
		env, err := openSchema(ctx, cfg, fmt.Sprintf("bench_%d_keys", rows))
		if err != nil {
			return err
		}
		defer env.Close()
		if err := env.Empty(ctx); err != nil {
			return err
		}
		fmt.Fprintf(progress, "loading %d finished keys\n", rows)
		start := time.Now()
		if err := env.LoadFinished(ctx, rows, 0); err != nil {
			return err
		}
		fmt.Fprintf(progress, "loaded in %v\n", time.Since(start).Round(time.Second))
		envs[i] = env
	}
	warmed := true
	for _, env := range envs {
		blocks, err := env.Warm(ctx)
		if err != nil {
			return err
		}
		warmed = warmed && blocks > 0
	}
	var sizes []string
	for i, env := range envs {
		var heap, indexes string
		err := env.Pool.QueryRow(ctx, `
SELECT pg_size_pretty(pg_table_size('idempotency_keys')), pg_size_pretty(pg_indexes_size('idempotency_keys'))`).Scan(&heap, &indexes)
		if err != nil {
			return err
		}
		sizes = append(sizes, fmt.Sprintf("%d keys: table %s, indexes %s", largeSizes[i], heap, indexes))
	}
	fmt.Fprintf(w, "Key table sizes: %s.\n", strings.Join(sizes, "; "))
	if warmed {
		fmt.Fprintln(w, "Both tables were read into shared buffers with pg_prewarm (table first, then indexes) before measuring.")
	} else {
		fmt.Fprintln(w, "pg_prewarm could not be created: the tables were measured as loaded, their first reads from the operating system.")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| acquire | clients | finished keys in table | p50 µs | p99 µs | mean µs | req/s | statements/req |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, k := range []bench.Kind{bench.AcquireFinished, bench.AcquireNew} {
		for _, c := range []int{1, 8} {
			var loads [2]*bench.Load
			for i, env := range envs {
				l, err := env.Prepare(ctx, k, c)
				if err != nil {
					return err
				}
				loads[i] = l
			}
			res, err := alternate(ctx, loads, rounds, d, progress)
			if err != nil {
				return err
			}
			for i, rows := range largeSizes {
				r := bench.Merge(res[i]...)
				fmt.Fprintf(w, "| %s | %d | %d | %.0f | %.0f | %.0f | %.0f | %.2f |\n", strings.TrimPrefix(k.String(), "acquire "), c, rows,
					us(r.Quantile(0.5)), us(r.Quantile(0.99)), us(r.Mean()), r.PerSecond(), r.StatementsPerRequest())
			}
		}
	}
	fmt.Fprintln(w)
	for _, env := range envs {
		if err := env.Empty(ctx); err != nil {
			return err
		}
	}
	return nil
}

// openSchema opens an Env whose tables live in schema, created if need be.
func openSchema(ctx context.Context, cfg *pgxpool.Config, schema string) (*bench.Env, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
	conn.Close(ctx)
	if err != nil {
		return nil, err
	}
	cfg = cfg.Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return bench.Open(ctx, cfg)
}

// reaperUnderTraffic loads a million expired keys and measures the
// workflow's traffic alone and while the reaper deletes them.
func reaperUnderTraffic(ctx context.Context, env *bench.Env, w, progress io.Writer) error {
	if err := env.Empty(ctx); err != nil {
		return err
	}
	fmt.Fprintln(progress, "loading 1000000 expired keys")
	if err := env.LoadFinished(ctx, 1_000_000, 25*time.Hour); err != nil {
		return err
	}
	scan, err := env.ExpireScan(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(progress, "reaping under traffic")
	res, err := env.ReapUnderTraffic(ctx, 8, 5*time.Second, recovery.ReaperConfig{})
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "| traffic (3-phase, 8 clients) | acquire p50 µs | acquire p99 µs | request p50 µs | request p99 µs | req/s | duration |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	for _, row := range []struct {
		name              string
		acquire, requests bench.Result
	}{{"before the reaper", res.AcquireBefore, res.Before}, {"while the reaper runs", res.AcquireDuring, res.During}} {
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f s |\n", row.name,
			us(row.acquire.Quantile(0.5)), us(row.acquire.Quantile(0.99)),
			us(row.requests.Quantile(0.5)), us(row.requests.Quantile(0.99)), row.requests.PerSecond(), row.requests.Elapsed.Seconds())
	}
	fmt.Fprintln(w)
	first, last := res.BatchTimes(10)
	fmt.Fprintf(w, "Reaper (batch %d, pause %v): deleted %d keys in %.1f s (%d batches; first 10 batches %.1f ms each, last 10 %.1f ms each). One search for abandoned keys: %.1f ms. Acquire p99 while it ran: %.1f× the p99 before.\n\n",
		res.BatchSize, res.Pause, res.Deleted, res.Reap.Seconds(), len(res.Batches), ms(first), ms(last), ms(scan),
		float64(res.AcquireDuring.Quantile(0.99))/float64(res.AcquireBefore.Quantile(0.99)))
	return nil
}

// drainBacklogs measures the drain of a backlog of each size, on 1 and
// then 2 nodes, and prints them in one table.
func drainBacklogs(ctx context.Context, env *bench.Env, plan drainPlan, w, progress io.Writer) error {
	conf := "the default configuration"
	if plan.concurrency != recovery.DefaultConcurrency {
		conf = fmt.Sprintf("the default configuration but %d keys at once", plan.concurrency)
	}
	fmt.Fprintf(w, "Drain of a backlog of rides-shaped keys (charge 20 ms), completers with %s, live traffic of the three-phase request from 4 clients at one each per 20 ms, served by the nodes (30 s of it before the drain):\n", conf)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| backlog | nodes | drained in | keys/s | keys at once | live p50 before → during (ms) | live p99 before → during (ms) | p99 ratio | server CPU per key | statements per key | round trips per key | machine busy | bound |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	var runs []bench.DrainResult
	for _, n := range plan.sizes {
		for _, nodes := range []int{1, 2} {
			fmt.Fprintf(progress, "draining %d keys on %d node(s)\n", n, nodes)
			r, err := env.DrainUnderTraffic(ctx, bench.DrainParams{Keys: n, Nodes: nodes, CallTook: 20 * time.Millisecond,
				Live: 4, LiveEvery: 20 * time.Millisecond, Before: 30 * time.Second, Timeout: time.Hour,
				Completer: recovery.CompleterConfig{Concurrency: plan.concurrency}})
			if err != nil {
				return err
			}
			cpu := "–"
			if env.CPU != nil {
				cpu = fmt.Sprintf("%.0f µs", us(r.ServerCPUPerKey()))
			}
			fmt.Fprintf(w, "| %d | %d | %.1f s | %.0f | %.1f of %d | %.1f → %.1f | %.1f → %.1f | %.2f | %s | %.2f | %.2f | %.0f %% | %s |\n",
				n, nodes, r.Drain.Seconds(), r.PerSecond(), r.AtOnce, nodes*plan.concurrency,
				ms(r.Before.Quantile(0.5)), ms(r.During.Quantile(0.5)), ms(r.Before.Quantile(0.99)), ms(r.During.Quantile(0.99)),
				float64(r.During.Quantile(0.99))/float64(r.Before.Quantile(0.99)),
				cpu, r.StatementsPerKey(), r.RoundTripsPerKey(), 100*r.MachineBusy, r.Bound())
			runs = append(runs, r)
		}
	}
	fmt.Fprintln(w)
	printReadings(w, runs)
	return nil
}

// readingShares are the points of a drain, as shares of its time, at
// which printReadings shows the backlog as an operator read it.
var readingShares = []float64{0.1, 0.25, 0.5, 0.75, 0.9}

// printReadings shows, for each drain, the backlog read at readingShares
// of its time: the keys left, the rate read and the span it was measured
// over, against the drain's average pace, and the time to empty read
// against the time the drain went on.
func printReadings(w io.Writer, runs []bench.DrainResult) {
	fmt.Fprintln(w, "The backlog as `atomicphase counts` read it during each drain (once a second; the completers count their keys every 5 s):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| backlog | nodes | at | unfinished | rate read (keys/s) | over | average pace (keys/s) | empty in, read | empty in, measured |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		for _, share := range readingShares {
			at := time.Duration(share * float64(r.Drain))
			i, found := slices.BinarySearchFunc(r.Readings, at, func(b bench.BacklogReading, at time.Duration) int { return cmp.Compare(b.At, at) })
			if !found && i == len(r.Readings) {
				continue
			}
			b := r.Readings[i]
			rate, over, empty := "unknown", "–", "–"
			if b.Measured {
				rate, over = fmt.Sprintf("%.1f", b.PerSecond), b.Over.Round(time.Second).String()
				if d, ok := b.EmptyIn(); ok {
					empty = d.Round(time.Second).String()
				}
			}
			fmt.Fprintf(w, "| %d | %d | %.0f s | %d | %s | %s | %.0f | %s | %s |\n", r.Keys, r.Nodes, b.At.Seconds(), b.Unfinished,
				rate, over, r.PerSecond(), empty, (r.Drain - b.At).Round(time.Second))
		}
	}
	fmt.Fprintln(w)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// nodeCostClients are the client counts at which nodeCosts measures.
var nodeCostClients = []int{1, 8}

// nodeCosts prints what each node of a Citus cluster spent on the
// three-phase request of the library and of the baseline at each of
// nodeCostClients, alternating for rounds rounds of d: the CPU time of its
// processes, and the planning and execution time and the count of its
// statements by pg_stat_statements (on the coordinator, execution includes
// waiting for the workers; on a worker, statements include the BEGIN, the
// distributed transaction id and the COMMIT that Citus sends for each
// transaction), with the requests a second the cluster served, so that
// each node's share of the work, and what one node could serve alone, can
// be read off.
func nodeCosts(ctx context.Context, env *bench.Env, nodes []node, rounds int, d time.Duration, w, progress io.Writer) error {
	conns := make([]*pgx.Conn, len(nodes))
	for i, n := range nodes {
		conn, err := pgx.Connect(ctx, n.dsn)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		conns[i] = conn
	}
	fmt.Fprintln(w, "Where the time goes, by node: three-phase request (CPU time of the node's processes; pg_stat_statements of every statement the node ran, BEGIN and COMMIT included):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| request | clients | req/s | node | CPU µs/req | planning µs/req | execution µs/req | statements/req |")
	fmt.Fprintln(w, "|---|---:|---:|---|---:|---:|---:|---:|")
	for _, clients := range nodeCostClients {
		if err := nodeCostsAt(ctx, env, nodes, conns, clients, rounds, d, w, progress); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	return nil
}

// nodeCostsAt prints nodeCosts's rows for clients clients.
func nodeCostsAt(ctx context.Context, env *bench.Env, nodes []node, conns []*pgx.Conn, clients, rounds int, d time.Duration, w, progress io.Writer) error {
	kinds := [2]bench.Kind{bench.LibraryRun, bench.BaselineRun}
	var loads [2]*bench.Load
	for i, k := range kinds {
		l, err := env.Prepare(ctx, k, clients)
		if err != nil {
			return err
		}
		loads[i] = l
	}
	type cost struct {
		cpu, plan, exec time.Duration
		calls           int64
	}
	var (
		costs    [2][]cost
		requests [2]int
		elapsed  [2]time.Duration
	)
	for i := range costs {
		costs[i] = make([]cost, len(nodes))
	}
	for r := range rounds {
		for j := range 2 {
			i := j ^ r%2
			fmt.Fprintf(progress, "%s, clients=%d, by node: round %d/%d\n", kinds[i], clients, r+1, rounds)
			before := make([]time.Duration, len(nodes))
			for n, c := range conns {
				if _, err := c.Exec(ctx, `SELECT public.pg_stat_statements_reset()`); err != nil {
					return fmt.Errorf("%s: %w", nodes[n].name, err)
				}
				before[n] = serverCPU(nodes[n].postmaster)
			}
			res, err := loads[i].Run(ctx, 0, d)
			if err != nil {
				return err
			}
			requests[i] += res.Requests()
			elapsed[i] += res.Elapsed
			for n, c := range conns {
				costs[i][n].cpu += serverCPU(nodes[n].postmaster) - before[n]
				var plan, exec float64
				var calls int64
				err := c.QueryRow(ctx, `
SELECT coalesce(sum(total_plan_time), 0), coalesce(sum(total_exec_time), 0), coalesce(sum(calls), 0)::bigint
FROM public.pg_stat_statements
WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%citus_stat_counters%'`).Scan(&plan, &exec, &calls)
				if err != nil {
					return fmt.Errorf("%s: %w", nodes[n].name, err)
				}
				costs[i][n].plan += time.Duration(plan * float64(time.Millisecond))
				costs[i][n].exec += time.Duration(exec * float64(time.Millisecond))
				costs[i][n].calls += calls
			}
		}
	}
	for i, k := range kinds {
		per := func(d time.Duration) float64 { return us(d) / float64(max(requests[i], 1)) }
		rate := float64(requests[i]) / max(elapsed[i].Seconds(), 1e-9)
		for n, c := range costs[i] {
			fmt.Fprintf(w, "| %s | %d | %.0f | %s | %.0f | %.0f | %.0f | %.2f |\n", k, clients, rate, nodes[n].name, per(c.cpu), per(c.plan), per(c.exec),
				float64(c.calls)/float64(max(requests[i], 1)))
		}
	}
	return nil
}
