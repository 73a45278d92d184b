// Command rides is the rides example: a Stripe-charging ride API that is
// safe to retry, and a demo that proves it under duplicates, dropped
// connections, server crashes and Stripe timeouts.
//
// Usage:
//
//	rides                 run the demo (embedded Postgres unless DATABASE_URL is set)
//	rides serve           run the API with its completer, reaper and receipt worker
//	rides fakestripe      run the fake Stripe API
//	rides simulate        drive a running API with simulated riders
//	rides <command> -h    document a command's flags
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/examples/rides/sim"
	"github.com/atomicphase/atomicphase/internal/exampleprog"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

func main() { program.Main() }

const usage = `rides: the atomicphase rides example.

Usage:
  rides [demo flags]     run the demo: API, fake Stripe, completer, reaper and
                         receipt worker in one process, driven by simulated riders
                         with duplicates, dropped connections, server crashes and
                         Stripe timeouts; prints a summary and exits non-zero if an
                         invariant fails. Uses DATABASE_URL, or an embedded
                         throwaway Postgres when it is not set.
  rides serve            run the rides API
  rides fakestripe       run the fake Stripe API
  rides simulate         drive a running API with simulated riders
  rides <command> -h     document a command's flags
`

var program = exampleprog.Program{
	Name:  "rides",
	Usage: usage,
	Commands: map[string]exampleprog.Command{
		"demo":       demo,
		"serve":      serve,
		"fakestripe": fakeStripe,
		"simulate":   simulate,
	},
}

var errInvariant = errors.New("invariant violated")

// dbURLUsage documents -database-url.
const dbURLUsage = "Postgres URL (default $DATABASE_URL; embedded throwaway Postgres when empty)"

// database connects to url, or to an embedded throwaway Postgres when url
// is empty, and applies the schemas.
func database(ctx context.Context, url string, log io.Writer) (*pgxpool.Pool, func(), error) {
	return exampleprog.OpenDatabase(ctx, exampleprog.Database{URL: url, PoolSize: 40, Migrate: migrate, Progress: log})
}

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := ride.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := fakestripe.Migrate(ctx, pool); err != nil {
		return err
	}
	return ride.Seed(ctx, pool)
}

// crashes returns an injector that crashes a run at a random fault point
// with probability rate, as a killed process would, while enabled.
func crashes(rate float64, enabled *atomic.Bool) phase.Injector {
	return phase.InjectorFunc(func(_ context.Context, at phase.Point) error {
		if enabled.Load() && rand.Float64() < rate {
			return phase.ErrCrash
		}
		return nil
	})
}

func serve(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := exampleprog.Flags("rides serve", "rides serve: run the rides API (POST /rides) with its completer, reaper and River receipt worker.\nMigrates the database and seeds user@example.com and declined@example.com.", stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	dbURL := exampleprog.DatabaseURL(fs, dbURLUsage)
	stripeURL := fs.String("stripe-url", ride.DefaultStripeURL, "Stripe API base URL (the fake Stripe, stripe-mock, or Stripe)")
	stripeKey := fs.String("stripe-key", envOr("STRIPE_API_KEY", "sk_test_rides"), "Stripe secret key (default $STRIPE_API_KEY)")
	lockTTL := fs.Duration("lock-ttl", 0, "idempotency key lease (default 90s)")
	crashRate := fs.Float64("crash-rate", 0, "probability of a simulated crash at each fault point (for chaos testing)")
	noCompleter := fs.Bool("no-completer", false, "do not run the completer")
	completerInterval := fs.Duration("completer-interval", 0, "how often the completer looks for unfinished keys (default 5s)")
	completerMinIdle := fs.Duration("completer-min-idle", 0, "how long a key must sit idle before the completer takes it (default 1m)")
	noReaper := fs.Bool("no-reaper", false, "do not run the reaper")
	noWorker := fs.Bool("no-worker", false, "do not run the River receipt worker")
	pollOnly := fs.Bool("poll-only", false, "River polls instead of using LISTEN/NOTIFY: needed behind PgBouncer in transaction pooling mode\n(whose URL also needs default_query_exec_mode=cache_describe)")
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	pool, closeDB, err := database(ctx, *dbURL, stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	var enabled atomic.Bool
	enabled.Store(true)
	cfg := ride.Config{
		Pool:   pool,
		Stripe: ride.NewStripeClient(*stripeURL, *stripeKey, nil),
		Client: phase.Config{
			LockTTL:   *lockTTL,
			Completer: recovery.CompleterConfig{Interval: *completerInterval, MinIdle: *completerMinIdle},
		},
		WithoutWorker: *noWorker,
		PollOnly:      *pollOnly,
	}
	if *noCompleter {
		cfg.Client.Completer.Interval = -1
	}
	if *noReaper {
		cfg.Client.Reaper.Interval = -1
	}
	if *crashRate > 0 {
		cfg.Client.Injector = crashes(*crashRate, &enabled)
	}
	app, err := ride.New(cfg)
	if err != nil {
		return err
	}
	if err := app.Start(ctx); err != nil {
		return err
	}
	if err := exampleprog.Serve(ctx, *addr, app.Handler(), "rides API listening", "stripe", *stripeURL); err != nil {
		return err
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return app.Stop(stopCtx)
}

func fakeStripe(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := exampleprog.Flags("rides fakestripe", "rides fakestripe: run the fake Stripe API (charges create, retrieve, list; Idempotency-Key as Stripe;\ncustomer cus_declined is declined; faults via POST /_faults).", stderr)
	addr := fs.String("addr", "127.0.0.1:12111", "address to listen on")
	dbURL := exampleprog.DatabaseURL(fs, dbURLUsage)
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	pool, closeDB, err := database(ctx, *dbURL, stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	return exampleprog.Serve(ctx, *addr, fakestripe.New(pool, fakestripe.Config{}), "fake Stripe listening")
}

func simulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := exampleprog.Flags("rides simulate", "rides simulate: drive a running rides API with simulated riders who send duplicates,\ndrop connections and retry with the same Idempotency-Key.", stderr)
	apiURL := fs.String("api-url", "http://127.0.0.1:8080", "rides API base URL")
	n := fs.Int("n", 200, "rides to request")
	concurrency := fs.Int("concurrency", 8, "riders acting at once")
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	st, err := sim.Run(ctx, sim.Config{APIURL: *apiURL, Rides: *n, Concurrency: *concurrency, Progress: stderr})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range []struct {
		name string
		v    int64
	}{{"rides", st.Rides}, {"requests", st.Requests}, {"created", st.Created}, {"replayed", st.Replayed},
		{"409s", st.Conflicts}, {"declined", st.Declined}, {"503s", st.Unavailable}, {"dropped", st.Dropped},
		{"abandoned", st.Abandoned}, {"inconsistent answers", st.Inconsistent}} {
		fmt.Fprintf(tw, "%s\t%d\t\n", row.name, row.v)
	}
	tw.Flush()
	if st.Inconsistent > 0 {
		return fmt.Errorf("%w: %d keys answered two different final responses", errInvariant, st.Inconsistent)
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// silence is a logger for the demo, whose output is the progress line and
// the summary; warnings about injected crashes would drown them.
var silence = slog.New(slog.NewTextHandler(io.Discard, nil))

// metrics counts run and recovery events for the demo's summary.
func metrics() (*recovery.Metrics, phase.Observer) {
	m := &recovery.Metrics{}
	return m, func(_ context.Context, ev phase.Event) { m.Count(string(ev.Kind), 1) }
}
