package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog"
	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/examples/rides/sim"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// demoDoc is rides -h: the program's commands, then the demo's flags.
const demoDoc = usage + `
The demo runs the API, fake Stripe, completer, reaper and receipt worker in one
process, drives them with simulated riders, then checks that no ride was charged
twice. Its flags:`

// demo runs everything in one process against one database and prints what
// happened and whether the invariants held.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := exampleprog.Flags("rides", demoDoc, stderr)
	duration := fs.Duration("duration", 20*time.Second, "how long the riders send requests")
	concurrency := fs.Int("concurrency", 8, "riders acting at once")
	crashRate := fs.Float64("crash-rate", 0.01, "probability of a server crash at each fault point")
	stripeTimeouts := fs.Float64("stripe-timeout-rate", 0.05, "share of Stripe charges that time out after charging")
	stripeFailures := fs.Float64("stripe-failure-rate", 0.03, "share of Stripe charges that fail before charging")
	dbURL := exampleprog.DatabaseURL(fs, exampleprog.DatabaseUsage)
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	start := time.Now()
	pool, closeDB, err := database(ctx, *dbURL, migrateAll, stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	// Telemetry shuts down before the database closes: its last export
	// reads the key counts.
	tel, err := startTelemetry(ctx, "rides-demo")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tel.shutdown()) }()
	// The run's rows are those created from now on, by the database's
	// clock: a database that earlier runs used keeps theirs.
	var since time.Time
	var earlier int
	if err := pool.QueryRow(ctx, `SELECT now(), (SELECT count(*) FROM rides)`).Scan(&since, &earlier); err != nil {
		return err
	}
	if earlier > 0 {
		fmt.Fprintf(stderr, "the database holds %d rides of earlier runs; the summary counts this run's only\n", earlier)
	}

	stripeSrv := fakestripe.New(pool, fakestripe.Config{Logger: silence})
	if err := stripeSrv.SetRates(*stripeFailures, *stripeTimeouts); err != nil {
		return err
	}
	stripeURL, stopStripe, err := exampleprog.Listen("127.0.0.1:0", stripeSrv)
	if err != nil {
		return err
	}
	defer stopStripe()

	sc := ride.NewStripeClient(stripeURL, "sk_test_rides_demo", tel.httpClient())
	m := &recovery.Metrics{}
	var crashing atomic.Bool
	crashing.Store(true)
	app, err := ride.New(ride.Config{
		Pool:   pool,
		Stripe: sc,
		Client: phase.Config{
			// A short lease so crashed requests are resumed within the demo.
			LeaseTTL: 2 * time.Second,
			Completer: recovery.CompleterConfig{Interval: 250 * time.Millisecond, StuckAfter: time.Second,
				Backoff: 250 * time.Millisecond, MaxBackoff: 2 * time.Second},
			Hooks: append(tel.hooks(), crashes(*crashRate, &crashing), phase.ObserverFunc(m.Observe)),
		},
		Logger: silence,
	})
	if err != nil {
		return err
	}
	if err := tel.observeKeys(app.Client); err != nil {
		return err
	}
	if err := app.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = app.Stop(stopCtx)
	}()
	apiURL, stopAPI, err := exampleprog.Listen("127.0.0.1:0", tel.handler(exampleprog.Problems(app.Handler())))
	if err != nil {
		return err
	}
	defer stopAPI()
	fmt.Fprintf(stderr, "rides API at %s, fake Stripe at %s; riding for %v...\n", apiURL, stripeURL, *duration)

	st, err := sim.Run(ctx, sim.Config{APIURL: apiURL, Duration: *duration, Concurrency: *concurrency, Progress: stderr})
	if err != nil {
		return err
	}

	// Whatever the riders gave up on, the completer finishes: stop the
	// chaos and wait for every key to finish and every receipt to go out.
	crashing.Store(false)
	if err := stripeSrv.SetRates(0, 0); err != nil {
		return err
	}
	fmt.Fprintln(stderr, "riders done; waiting for the completer and the receipt worker...")
	report, err := settle(ctx, pool, sc, since)
	if err != nil {
		return err
	}
	completed, err := finalStatuses(ctx, pool, st.AbandonedKeys)
	if err != nil {
		return err
	}
	counts := m.Snapshot()
	keys := report.FinishedKeys + report.UnfinishedKey
	fmt.Fprintln(stdout, "\nWhat the riders saw:")
	writeRiders(stdout, st)
	fmt.Fprintln(stdout, "\nWhat the database holds for this run, and what the server did:")
	writeRows(stdout, []row{
		{"keys", int64(keys), "one per ride that reached the API"},
		{"  created (201)", int64(report.Created), fmt.Sprintf("%d seen by riders + %d of abandoned rides",
			st.Created, completed[http.StatusCreated])},
		{"  declined (402)", int64(report.Declined), fmt.Sprintf("%d seen by riders + %d of abandoned rides",
			st.Declined, completed[http.StatusPaymentRequired])},
		{"  payment failed (502)", int64(report.PaymentFailed), fmt.Sprintf("%d seen by riders + %d of abandoned rides",
			st.PaymentFailed, completed[http.StatusBadGateway])},
		{"  unfinished", int64(report.UnfinishedKey), "must be 0"},
		{"rides", int64(report.Rides), "one per key: the ride is the first phase"},
		{"charges at Stripe", int64(report.Charges), "one per created ride"},
		{"receipts", int64(report.Receipts), "one per created ride"},
		{"server crashes", counts[string(keyrow.EventCrashed)], "runs stopped at a random fault point"},
		{"resumed", counts[string(keyrow.EventResumed)], "runs that took over an unfinished key"},
		{"finished by the completer", counts[string(keyrow.EventCompleted)], "keys it finished before any retry did"},
		{"Stripe faults", stripeSrv.Stats().FaultsInjected, "failures before a charge, drops after"},
		{"double charges", int64(report.DoubleCharged), "must be 0"},
		{"charges without a ride", int64(report.ChargesWithoutRide), "must be 0"},
	})
	fmt.Fprintf(stdout, "\ntook %v\n", time.Since(start).Round(100*time.Millisecond))

	failures := report.Failures()
	if report.UnfinishedKey > 0 {
		failures = append(failures, fmt.Sprintf("%d keys still unfinished", report.UnfinishedKey))
	}
	if report.Charges != report.Created {
		failures = append(failures, fmt.Sprintf("%d charges for %d created rides", report.Charges, report.Created))
	}
	if report.Receipts != report.Created {
		failures = append(failures, fmt.Sprintf("%d receipts for %d created rides", report.Receipts, report.Created))
	}
	if st.Inconsistent > 0 {
		failures = append(failures, fmt.Sprintf("%d keys answered two different final responses, or rides refused", st.Inconsistent))
	}
	if len(failures) > 0 {
		return fmt.Errorf("%w: %v", errInvariant, failures)
	}
	fmt.Fprintln(stdout, "OK: no ride charged twice, every charge has its ride, every key finished.")
	return nil
}

// settle waits until no key of the run is unfinished and every created ride
// has its receipt, or 30 seconds pass, and returns the final report.
func settle(ctx context.Context, pool *pgxpool.Pool, sc *ride.Stripe, since time.Time) (ride.Report, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		report, err := ride.Verify(ctx, pool, sc, since)
		if err != nil {
			return report, err
		}
		if (report.UnfinishedKey == 0 && report.Receipts == report.Created) || time.Now().After(deadline) {
			return report, nil
		}
		select {
		case <-ctx.Done():
			return report, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// finalStatuses counts the stored statuses of the rides keys among keys.
func finalStatuses(ctx context.Context, pool *pgxpool.Pool, keys []string) (map[int]int64, error) {
	rows, err := pool.Query(ctx, `
		SELECT response_status, count(*) FROM idempotency_keys
		WHERE workflow = $1 AND idempotency_key = ANY($2) AND response_status IS NOT NULL
		GROUP BY response_status`, ride.WorkflowName, keys)
	if err != nil {
		return nil, err
	}
	counts := map[int]int64{}
	for rows.Next() {
		var status int
		var n int64
		if err := rows.Scan(&status, &n); err != nil {
			return nil, err
		}
		counts[status] = n
	}
	return counts, rows.Err()
}
