package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// DrainParams describes a drain: a backlog of abandoned rides-shaped keys,
// the completers that drain it, and the live traffic that runs meanwhile.
type DrainParams struct {
	// Keys is the backlog: rides-shaped keys abandoned before their first
	// phase, idle long enough for the completer's default StuckAfter.
	Keys int
	// Nodes is how many completers drain it, each a client of its own over
	// a pool of its own, as separate processes would.
	Nodes int
	// CallTook is how long the charge stub takes to answer each charge.
	CallTook time.Duration
	// Live clients each send a three-phase request on a new key every
	// LiveEvery, for Before alone and then during the whole drain. The
	// nodes serve them, client i node i mod Nodes, as servers that also
	// complete keys would: each node's completer yields to the live runs
	// it sees slowed.
	Live      int
	LiveEvery time.Duration
	Before    time.Duration
	// Completer configures the nodes' completers; zero values are the
	// defaults, as a client's completer runs.
	Completer recovery.CompleterConfig
	// Timeout bounds the drain.
	Timeout time.Duration
}

// DrainResult is what DrainUnderTraffic measured.
type DrainResult struct {
	DrainParams
	// Drain is the time from the completers' start until every key of the
	// backlog had finished.
	Drain time.Duration
	// Completed counts the keys each node completed.
	Completed []int64
	// AtOnce is how many keys the nodes' completers ran at once, on
	// average over the drain: the time their runs took, summed, over the
	// drain's. A completer that never yielded holds it near Concurrency
	// a node, less the moments between its passes.
	AtOnce float64
	// Statements and RoundTrips count what the completers sent.
	Statements, RoundTrips int
	// Before and During are the live traffic alone and during the drain.
	Before, During Result
	// ServerCPU is the server's CPU time over the drain, and LiveServerCPU
	// the part of it the live traffic is taken to have used, at its rate
	// before the drain; zero without Env.CPU.
	ServerCPU, LiveServerCPU time.Duration
	// MachineBusy is the share of the machine's CPU time that was busy
	// over the drain, every process counted (other users of a shared
	// machine too); negative where /proc/stat cannot be read.
	MachineBusy float64
	// Readings are the backlog as an operator reads it (Client.Backlog,
	// what `atomicphase counts` prints) once a second over the drain.
	Readings []BacklogReading
}

// BacklogReading is the backlog as read at At into the drain.
type BacklogReading struct {
	At time.Duration
	phase.Backlog
}

// PerSecond is the keys drained per second.
func (r DrainResult) PerSecond() float64 { return float64(r.Keys) / r.Drain.Seconds() }

// StatementsPerKey is the completers' statements per drained key.
func (r DrainResult) StatementsPerKey() float64 { return float64(r.Statements) / float64(r.Keys) }

// RoundTripsPerKey is the completers' round trips per drained key.
func (r DrainResult) RoundTripsPerKey() float64 { return float64(r.RoundTrips) / float64(r.Keys) }

// ServerCPUPerKey is the server's CPU time over the drain, less the live
// traffic's share, per drained key.
func (r DrainResult) ServerCPUPerKey() time.Duration {
	return max(r.ServerCPU-r.LiveServerCPU, 0) / time.Duration(r.Keys)
}

// CPUBound reports whether the machine was nearly saturated over the
// drain (90 % busy or more), so that its rate says more about this
// machine's CPU than about the calls' latency.
func (r DrainResult) CPUBound() bool { return r.MachineBusy >= 0.9 }

// yieldedShare is the share of its keys at once below which a drain is
// taken as bound by the completers' yielding: a completer that never
// yielded ran 0.86 to 0.93 of them, the rest its passes' claims and the
// last keys of each batch (docs/operating.md).
const yieldedShare = 0.85

// Yielded reports whether the completers ran markedly fewer keys at once
// than their Concurrency, having yielded to live requests (or to a busy
// store), so that the rate says more about that priority than about the
// calls' latency.
func (r DrainResult) Yielded() bool {
	return r.AtOnce < yieldedShare*float64(r.Nodes*cmp.Or(r.Completer.Concurrency, recovery.DefaultConcurrency))
}

// Bound names what bound the drain: this machine's CPU, the completers'
// yielding, or the calls' latency.
func (r DrainResult) Bound() string {
	switch {
	case r.CPUBound():
		return "this machine's CPU"
	case r.Yielded():
		return "yielding to live requests"
	default:
		return "the calls' latency"
	}
}

// atOnce sums the time of a completer's runs, as a RunWrapper.
type atOnce struct {
	phase.HookDefaults
	took *atomic.Int64
}

func (a atOnce) WrapRun(ctx context.Context, run *phase.RunInfo, next func(context.Context) (*phase.Outcome, error)) (*phase.Outcome, error) {
	if !run.ByCompleter {
		return next(ctx)
	}
	began := time.Now()
	defer func() { a.took.Add(int64(time.Since(began))) }()
	return next(ctx)
}

// abandonSQL stores keys numbered $1 to $2 of the rides-shaped workflow
// ($3, definition $4) as requests that took their lease and crashed before
// their first phase, an hour ago: idle past any StuckAfter, their lease
// long run out. Their tenants are spread as loadedTenant spreads them.
const abandonSQL = `
INSERT INTO idempotency_keys
    (created_at, last_run_at, tenant, idempotency_key, workflow, definition,
     request_fingerprint, request_params, attempts)
SELECT now() - interval '1 hour', now() - interval '1 hour', $7 || (i % $8), 'drain-' || i, $3, $4, $5, $6, 1
FROM generate_series($1::int, $2::int) AS i`

// DrainUnderTraffic abandons a backlog of p.Keys rides-shaped keys, runs
// live traffic alone for p.Before, then starts p.Nodes completers and
// times how long they take to finish every key while the traffic goes on.
// It checks the protocol as it goes: each key's charge was sent once and
// its order created once. It empties the tables first.
func (e *Env) DrainUnderTraffic(ctx context.Context, p DrainParams) (DrainResult, error) {
	res := DrainResult{DrainParams: p, Completed: make([]int64, p.Nodes)}
	if err := e.Empty(ctx); err != nil {
		return res, err
	}
	e.charges.took.Store(int64(p.CallTook))
	defer e.charges.took.Store(0)

	counter := completerStatements{&pgtest.StatementCounter{}}
	var completed, ran atomic.Int64
	done := make(chan struct{})
	nodes := make([]*phase.Client, p.Nodes)
	for i := range nodes {
		cfg := e.Pool.Config().Copy()
		cfg.ConnConfig.Tracer = counter
		cfg.MaxConns = int32(max(p.Completer.Concurrency, recovery.DefaultConcurrency) + 2 + p.Live)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return res, err
		}
		defer pool.Close()
		count := phase.ObserverFunc(func(_ context.Context, ev keyrow.Event) {
			if ev.Kind != keyrow.EventCompleted || ev.Workflow != e.rides.Name() {
				return
			}
			atomic.AddInt64(&res.Completed[i], int64(ev.Count))
			if completed.Add(int64(ev.Count)) == int64(p.Keys) {
				close(done)
			}
		})
		nodes[i], err = phase.NewClient(pool, &phase.Config{LeaseTTL: leaseTTL, Completer: p.Completer,
			Reaper: recovery.ReaperConfig{Interval: -1}, Hooks: []phase.Hook{count, atOnce{took: &ran}}}, e.rides, e.workflow)
		if err != nil {
			return res, err
		}
	}
	live, err := e.Prepare(ctx, LibraryRun, p.Live)
	if err != nil {
		return res, err
	}
	live.send = func(ctx context.Context, client int) error {
		ctx = context.WithValue(ctx, liveRun{}, true)
		return e.runLibraryOn(ctx, nodes[client%len(nodes)], e.workflow, uuid.NewString(), phase.OutcomeNew)
	}
	// Every node's connections prepare their statements first.
	if _, err := live.run(ctx, warmRequests*p.Live, nil); err != nil {
		return res, err
	}
	live.Every = p.LiveEvery
	if res.Before, err = live.Run(ctx, 0, p.Before); err != nil {
		return res, err
	}
	if err := e.abandon(ctx, p.Keys); err != nil {
		return res, err
	}
	stop := live.start(ctx)
	e.charges.count()
	busy := machineCPU()
	var server time.Duration
	if e.CPU != nil {
		_, server, _ = e.CPU()
	}
	start := time.Now()
	for _, n := range nodes {
		if err := n.Start(ctx); err != nil {
			return res, err
		}
	}
	stopReading := e.readBacklog(ctx, start, &res.Readings)
	timeout := time.NewTimer(p.Timeout)
	defer timeout.Stop()
	select {
	case <-done:
	case <-timeout.C:
		err = fmt.Errorf("bench: drain: %d of %d keys completed in %s", completed.Load(), p.Keys, p.Timeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	res.Drain = time.Since(start)
	res.AtOnce = float64(ran.Load()) / float64(res.Drain)
	stopReading()
	res.MachineBusy = busy()
	if e.CPU != nil {
		_, now, _ := e.CPU()
		res.ServerCPU = now - server
		if before := res.Before.CPU - res.Before.ClientCPU; res.Before.Elapsed > 0 {
			res.LiveServerCPU = time.Duration(float64(before) * res.Drain.Seconds() / res.Before.Elapsed.Seconds())
		}
	}
	res.Statements, res.RoundTrips = counter.Statements(), counter.RoundTrips()
	var liveErr error
	res.During, liveErr = stop()
	for _, n := range nodes {
		err = errors.Join(err, n.Stop(ctx))
	}
	err = errors.Join(err, liveErr)
	if err != nil {
		return res, err
	}
	return res, e.checkDrained(ctx, p.Keys, e.charges.counted())
}

// readBacklog reads the backlog into readings once a second from start,
// through a client of its own on e.Pool, whose statements the completers'
// count leaves out, until the function it returns is called. A failed
// reading is left out.
func (e *Env) readBacklog(ctx context.Context, start time.Time, readings *[]BacklogReading) (stop func()) {
	reader, err := phase.NewClient(e.Pool, &phase.Config{})
	if err != nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if b, err := reader.Backlog(ctx); err == nil {
				*readings = append(*readings, BacklogReading{At: time.Since(start), Backlog: b})
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// liveRun marks the context of a live request's run.
type liveRun struct{}

// completerStatements counts the statements of the nodes' completers, not
// those of the live requests they serve.
type completerStatements struct{ *pgtest.StatementCounter }

func (c completerStatements) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if ctx.Value(liveRun{}) != nil {
		return ctx
	}
	return c.StatementCounter.TraceQueryStart(ctx, conn, data)
}

func (c completerStatements) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if ctx.Value(liveRun{}) != nil {
		return ctx
	}
	return c.StatementCounter.TraceBatchStart(ctx, conn, data)
}

// abandon stores the backlog, in chunks so that no statement runs long.
func (e *Env) abandon(ctx context.Context, n int) error {
	req, err := e.keyRequest("", "", leaseTTL)
	if err != nil {
		return err
	}
	const chunk = 50_000
	for from := 0; from < n; from += chunk {
		_, err := e.Pool.Exec(ctx, abandonSQL, from+1, min(from+chunk, n), e.rides.Name(), e.rides.Definition(),
			req.Fingerprint[:], req.Params, loadedTenantPrefix, tenants)
		if err != nil {
			return fmt.Errorf("bench: abandon keys: %w", err)
		}
	}
	_, err = e.Pool.Exec(ctx, `ANALYZE idempotency_keys`)
	return err
}

// checkDrained checks the protocol after a drain of n keys: every key
// finished, each created its order once, and each was charged once under
// its downstream key (sent, the charges counted per key).
func (e *Env) checkDrained(ctx context.Context, n int, sent map[string]int) error {
	var unfinished, orders, distinct int
	err := e.Pool.QueryRow(ctx, `
SELECT (SELECT count(*) FROM idempotency_keys WHERE workflow = $1 AND finished_at IS NULL),
       count(*), count(DISTINCT (tenant, ikey))
FROM orders WHERE ikey LIKE 'drain-%'`, e.rides.Name()).Scan(&unfinished, &orders, &distinct)
	if err != nil {
		return err
	}
	if unfinished != 0 || orders != n || distinct != n {
		return fmt.Errorf("bench: drain: %d keys unfinished, %d orders over %d keys; want %d keys each finished with one order",
			unfinished, orders, distinct, n)
	}
	if len(sent) != n {
		return fmt.Errorf("bench: drain: %d downstream keys charged, want %d", len(sent), n)
	}
	for k, c := range sent {
		if c != 1 {
			return fmt.Errorf("bench: drain: downstream key %s charged %d times, want once", k, c)
		}
	}
	return nil
}

// machineCPU starts measuring how busy the machine's CPUs are, from Linux's
// /proc/stat, and returns the function that reads the busy share since;
// it reads -1 where /proc/stat cannot be read.
func machineCPU() func() float64 {
	busy0, total0, err := procStat()
	return func() float64 {
		busy1, total1, err1 := procStat()
		if err != nil || err1 != nil || total1 <= total0 {
			return -1
		}
		return float64(busy1-busy0) / float64(total1-total0)
	}
}

// procStat returns the busy and total CPU ticks of the machine so far.
func procStat() (busy, total int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, errors.New("bench: /proc/stat: no cpu line")
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, err
		}
		total += n
		// idle and iowait are the 4th and 5th fields.
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total, nil
}
