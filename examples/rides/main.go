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
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog"
	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/examples/rides/sim"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

func main() { program.Main() }

const usage = `rides: the atomicphase rides example.

Usage:
  rides [demo flags]     run the demo: API, fake Stripe, completer, reaper and
                         receipt worker in one process, driven by simulated riders
                         with duplicates, dropped connections, server crashes and
                         Stripe timeouts; prints a summary and exits 1 if an
                         invariant fails. Uses DATABASE_URL, or an embedded
                         throwaway Postgres when it is not set.
  rides serve            run the rides API
  rides fakestripe       run the fake Stripe API
  rides simulate         drive a running API with simulated riders
  rides <command> -h     document a command's flags

` + exampleprog.ExitStatus

var program = exampleprog.Program{Name: "rides", Usage: usage, Commands: map[string]exampleprog.Command{
	"demo": demo, "serve": serve, "fakestripe": fakeStripe.Run, "simulate": simulate,
}}

var errInvariant = errors.New("invariant violated")

// poolSize is the least number of connections of a command's pool: the
// demo's API, fake Stripe, riders and background workers share one.
const poolSize = 40

// database connects to url, or to an embedded throwaway Postgres when url
// is empty, and applies migrate, which migrates what the command owns.
func database(ctx context.Context, url string, migrate func(context.Context, *pgxpool.Pool) error, log io.Writer) (*pgxpool.Pool, func(), error) {
	return exampleprog.OpenDatabase(ctx, exampleprog.Database{URL: url, PoolSize: poolSize, Migrate: migrate, Progress: log})
}

// migrateRides applies what the API owns: the atomicphase schema, River's,
// the rides tables, and the demo riders.
func migrateRides(ctx context.Context, pool *pgxpool.Pool) error {
	return seeded(ride.Migrate)(ctx, pool)
}

// seeded returns migrate followed by the demo riders' seeding.
func seeded(migrate func(context.Context, *pgxpool.Pool) error) func(context.Context, *pgxpool.Pool) error {
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := migrate(ctx, pool); err != nil {
			return err
		}
		return ride.Seed(ctx, pool)
	}
}

// migrateAll applies the schemas of the API and of the fake Stripe, for the
// demo, which runs both on one database.
func migrateAll(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrateRides(ctx, pool); err != nil {
		return err
	}
	return fakestripe.Migrate(ctx, pool)
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

// serveDoc is rides serve -h.
const serveDoc = `rides serve: run the rides API (POST /rides) with its completer, reaper and River
receipt worker. Migrates what it owns (the atomicphase schema, River's, the rides
tables) and seeds user@example.com and declined@example.com.

Give it a database that outlives it (DATABASE_URL): the idempotency keys in it are
what make a retry after a restart replay its answer instead of charging again.`

func serve(ctx context.Context, args []string, _, stderr io.Writer) (err error) {
	fs := exampleprog.Flags("rides serve", serveDoc, stderr)
	svc := exampleprog.ServiceFlags(fs, "127.0.0.1:8080")
	stripeURL := fs.String("stripe-url", "", "Stripe API base `URL`, required: the fake Stripe's (rides fakestripe), stripe-mock's,\nor https://api.stripe.com with -stripe-key")
	stripeKey := exampleprog.SecretString(fs, "stripe-key", "STRIPE_API_KEY", "sk_test_rides", "Stripe secret `key` (default $STRIPE_API_KEY, or sk_test_rides when it is empty)")
	leaseTTL := fs.Duration("lease-ttl", 0, "idempotency key lease (default 20s)")
	crashRate := fs.Float64("crash-rate", 0, "probability of a simulated crash at each fault point (for chaos testing)")
	noCompleter := fs.Bool("no-completer", false, "do not run the completer")
	completerInterval := fs.Duration("completer-interval", 0, "how often the completer looks for unfinished keys (default 5s)")
	completerStuckAfter := fs.Duration("completer-stuck-after", 0, "how long a key must sit idle before the completer takes it (default 1m)")
	noReaper := fs.Bool("no-reaper", false, "do not run the reaper")
	noWorker := fs.Bool("no-worker", false, "do not run the River receipt worker")
	accept := fs.Bool("accept", false, "answer 202 Accepted once the ride is created, with its status at GET /rides/status/{key},\nand charge in the background")
	fraudCheck := fs.Bool("fraud-check", false, "serve the workflow's next definition, which checks for fraud before the charge;\nrides started under the first one finish under it")
	citus := fs.Bool("citus", false, "the database is a Citus coordinator with its workers added: distribute the key table and\n"+
		"the rides tables by tenant, the rider's email (see the README's \"On Citus\")")
	pollOnly := fs.Bool("poll-only", false, "River polls instead of using LISTEN/NOTIFY: needed behind PgBouncer in transaction pooling mode\n(whose URL also needs default_query_exec_mode=cache_describe)")
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	if *stripeURL == "" {
		// No default: a demo that quietly charged through the real Stripe
		// API, or failed to reach it, would surprise either way.
		fmt.Fprintln(stderr, "rides serve: -stripe-url is required: the fake Stripe's URL (start it with rides fakestripe), stripe-mock's, or https://api.stripe.com with -stripe-key")
		return exampleprog.ErrUsage
	}
	migrate := migrateRides
	if *citus {
		migrate = seeded(ride.Distribute)
	}
	if err := svc.Open(ctx, exampleprog.Database{PoolSize: poolSize, Migrate: migrate, Progress: stderr}); err != nil {
		return err
	}
	defer svc.Close()
	// Telemetry shuts down before the database closes: its last export
	// reads the key counts.
	tel, err := startTelemetry(ctx, "rides")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tel.shutdown()) }()
	var enabled atomic.Bool
	enabled.Store(true)
	cfg := ride.Config{
		Pool:   svc.Pool,
		Stripe: ride.NewStripeClient(*stripeURL, *stripeKey, tel.httpClient()),
		Client: phase.Config{
			LeaseTTL:  *leaseTTL,
			Completer: recovery.CompleterConfig{Interval: *completerInterval, StuckAfter: *completerStuckAfter},
			Hooks:     tel.hooks(),
		},
		WithoutWorker: *noWorker,
		PollOnly:      *pollOnly,
		Accept:        *accept,
		FraudCheck:    *fraudCheck,
	}
	if *noCompleter {
		cfg.Client.Completer.Interval = -1
	}
	if *noReaper {
		cfg.Client.Reaper.Interval = -1
	}
	if *crashRate > 0 {
		cfg.Client.Hooks = append(cfg.Client.Hooks, crashes(*crashRate, &enabled))
	}
	app, err := ride.New(cfg)
	if err != nil {
		return err
	}
	if err := tel.observeKeys(app.Client); err != nil {
		return err
	}
	if err := app.Start(ctx); err != nil {
		return err
	}
	if err := svc.Serve(ctx, tel.handler(exampleprog.Problems(app.Handler())), "rides API listening", "stripe", *stripeURL); err != nil {
		return err
	}
	return exampleprog.Stop(app.Stop)
}

// fakeStripeDoc is rides fakestripe -h.
var fakeStripeDoc = `rides fakestripe: run the fake Stripe API: charges created, retrieved and listed
over HTTP with any sk_test_ key, kept in Postgres, with Idempotency-Key honoured as
Stripe does; customer cus_declined is declined (402 card_error).

  POST /v1/charges  GET /v1/charges  GET /v1/charges/{id}
` + fakestripe.ControlUsage + `
  curl -d '{"timeout_after_charge": 1}' http://127.0.0.1:12111/_faults

Migrates only its own tables (fakestripe_*); it may share the API's database.`

// fakeStripe is rides fakestripe.
var fakeStripe = exampleprog.API{Name: "rides fakestripe", Doc: fakeStripeDoc, Addr: "127.0.0.1:12111", PoolSize: poolSize,
	Migrate: fakestripe.Migrate, New: func(pool *pgxpool.Pool) http.Handler { return fakestripe.New(pool, fakestripe.Config{}) },
	Listening: "fake Stripe listening"}

func simulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := exampleprog.Flags("rides simulate", "rides simulate: drive a running rides API with simulated riders who send duplicates,\ndrop connections and retry with the same Idempotency-Key; print what they saw.", stderr)
	apiURL := fs.String("api-url", "http://127.0.0.1:8080", "rides API base URL")
	n := fs.Int("n", 200, "rides to request")
	concurrency := fs.Int("concurrency", 8, "riders acting at once")
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "riding against the rides API at %s...\n", *apiURL)
	if err := probe(ctx, *apiURL); err != nil {
		return err
	}
	st, err := sim.Run(ctx, sim.Config{APIURL: *apiURL, Rides: *n, Concurrency: *concurrency, Progress: stderr})
	if err != nil {
		return err
	}
	writeRiders(stdout, st)
	if st.Inconsistent > 0 {
		return fmt.Errorf("%w: %d keys answered two different final responses, or rides refused", errInvariant, st.Inconsistent)
	}
	return nil
}

// probeTimeout bounds the check that the API answers at all.
const probeTimeout = 10 * time.Second

// probe checks that a rides API answers at url, so that riders do not spend
// minutes retrying against nothing: a GET /rides is answered 405.
func probe(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(url, "/")+"/rides", nil)
	if err != nil {
		return fmt.Errorf("-api-url: %w", err)
	}
	res, err := http.DefaultClient.Do(req)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no rides API answers at %s: nothing within %v", url, probeTimeout)
	}
	if err != nil {
		return fmt.Errorf("no rides API answers at %s: %w", url, err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		return fmt.Errorf("%s does not look like the rides API: GET /rides answered %s, want 405", url, res.Status)
	}
	return nil
}

// writeRiders prints what the riders saw, each total followed by the
// counts it is the sum of.
func writeRiders(w io.Writer, st sim.Stats) {
	rows := []row{
		{"rides requested", st.Rides, "one Idempotency-Key each"},
		{"  created (201)", st.Created, ""},
		{"  declined (402)", st.Declined, "declined@example.com's card"},
		{"  payment failed (502)", st.PaymentFailed, ""},
		{"  abandoned", st.Abandoned, "the rider gave up; the completer finishes it"},
		{"  refused (other 4xx)", st.Rejected, "must be 0"},
		{"requests sent", st.Requests, "copies and retries included"},
		{"  answered", st.Answered, "final answer from the request's own run"},
		{"  replayed", st.Replayed, "the key's stored answer, replayed"},
		{"  409s", st.Conflicts, "the key was in use; retried"},
		{"  503s", st.Unavailable, "retried"},
		{"  other 5xx", st.ServerErrors, "retried"},
		{"  dropped by the rider", st.Dropped, "hung up before the answer; retried"},
		{"  no answer", st.Lost, "crash or timeout; retried (see below)"},
		{"  other 4xx", st.Unexpected, "must be 0"},
		{"inconsistent answers", st.Inconsistent, "must be 0"},
	}
	writeRows(w, rows)
	fmt.Fprintln(w, "A crashed request's connection closes unanswered. Go's HTTP client resends such\n"+
		"a request by itself, same key, when the connection was a kept-alive one, so\n"+
		"riders count few crashes as \"no answer\".")
}

// row is a line of a summary: a count and what it means.
type row struct {
	name string
	n    int64
	note string
}

// writeRows prints rows as a table: names left, counts right, notes left.
func writeRows(w io.Writer, rows []row) {
	var names, digits int
	for _, r := range rows {
		names = max(names, len(r.name))
		digits = max(digits, len(strconv.FormatInt(r.n, 10)))
	}
	for _, r := range rows {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("%-*s  %*d  %s", names, r.name, digits, r.n, r.note), " "))
	}
}

// silence is a logger for the demo, whose output is the progress line and
// the summary; warnings about injected crashes would drown them.
var silence = slog.New(slog.NewTextHandler(io.Discard, nil))
