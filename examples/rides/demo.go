package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v85"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/examples/rides/sim"
	"github.com/atomicphase/atomicphase/internal/exampleprog"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// demo runs everything in one process against one database and prints what
// happened and whether the invariants held.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := exampleprog.Flags("rides", "rides (demo): run the API, fake Stripe, completer, reaper and receipt worker in one process,\ndrive them with simulated riders, then check that no ride was charged twice.", stderr)
	duration := fs.Duration("duration", 20*time.Second, "how long the riders send requests")
	concurrency := fs.Int("concurrency", 8, "riders acting at once")
	crashRate := fs.Float64("crash-rate", 0.01, "probability of a server crash at each fault point")
	stripeTimeouts := fs.Float64("stripe-timeout-rate", 0.05, "share of Stripe charges that time out after charging")
	stripeFailures := fs.Float64("stripe-failure-rate", 0.03, "share of Stripe charges that fail before charging")
	dbURL := exampleprog.DatabaseURL(fs, dbURLUsage)
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	start := time.Now()
	pool, closeDB, err := database(ctx, *dbURL, stderr)
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
	m, observe := metrics()
	var crashing atomic.Bool
	crashing.Store(true)
	app, err := ride.New(ride.Config{
		Pool:   pool,
		Stripe: sc,
		Client: phase.Config{
			// A short lease so crashed requests are resumed within the demo.
			LockTTL:  2 * time.Second,
			Injector: crashes(*crashRate, &crashing),
			Observer: observe,
			Completer: recovery.CompleterConfig{Interval: 250 * time.Millisecond, MinIdle: time.Second,
				Backoff: 250 * time.Millisecond, MaxBackoff: 2 * time.Second, Observer: m.Observe},
			Reaper:     recovery.ReaperConfig{Observer: m.Observe},
			Middleware: tel.middleware(),
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
	apiURL, stopAPI, err := exampleprog.Listen("127.0.0.1:0", tel.handler(app.Handler()))
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
	report, err := settle(ctx, pool, sc)
	if err != nil {
		return err
	}
	counts := m.Snapshot()
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\t\t")
	for _, row := range []struct {
		name string
		v    int64
	}{
		{"rides requested", st.Rides},
		{"requests sent", st.Requests},
		{"created (201)", int64(report.Created)},
		{"replayed", st.Replayed},
		{"409s", st.Conflicts},
		{"503s (retried)", st.Unavailable},
		{"dropped connections", st.Dropped},
		{"server crashes", counts[string(phase.EventCrashed)]},
		{"resumed", counts[string(phase.EventResumed)]},
		{"finished by the completer", counts[string(recovery.EventCompleted)]},
		{"declined (402)", int64(report.Declined)},
		{"charges at Stripe", int64(report.Charges)},
		{"rides", int64(report.Rides)},
		{"receipts", int64(report.Receipts)},
		{"unfinished keys", int64(report.UnfinishedKey)},
		{"double charges", int64(report.DoubleCharged)},
		{"charges without a ride", int64(report.ChargesWithoutRide)},
		{"inconsistent answers", st.Inconsistent},
	} {
		fmt.Fprintf(tw, "%s\t%d\t\n", row.name, row.v)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\ntook %v\n", time.Since(start).Round(100*time.Millisecond))

	failures := report.Failures()
	if report.UnfinishedKey > 0 {
		failures = append(failures, fmt.Sprintf("%d keys still unfinished", report.UnfinishedKey))
	}
	if report.Receipts != report.Created {
		failures = append(failures, fmt.Sprintf("%d receipts for %d created rides", report.Receipts, report.Created))
	}
	if st.Inconsistent > 0 {
		failures = append(failures, fmt.Sprintf("%d keys answered two different final responses", st.Inconsistent))
	}
	if len(failures) > 0 {
		return fmt.Errorf("%w: %v", errInvariant, failures)
	}
	fmt.Fprintln(stdout, "OK: every ride charged at most once, every charge has its ride, every key finished.")
	return nil
}

// settle waits until no key is unfinished and every created ride has its
// receipt, or 30 seconds pass, and returns the final report.
func settle(ctx context.Context, pool *pgxpool.Pool, sc *stripe.Client) (ride.Report, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		report, err := ride.Verify(ctx, pool, sc)
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
