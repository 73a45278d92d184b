// Command transfers is the transfers example: a double-entry ledger whose
// transfers, inside the ledger or paid out through an external provider,
// are safe to retry, and a demo that shows money conserved under crashes,
// duplicates, provider faults and contention.
//
// Usage:
//
//	transfers [demo flags]   run the demo (embedded Postgres unless -database-url or DATABASE_URL is set)
//	transfers serve          run the ledger API with its completer and reaper
//	transfers payouts        run the fake payout provider alone
//	transfers verify         check a ledger's invariants
//	transfers <command> -h   document a command's flags
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/transfers/ledger"
	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `transfers: the atomicphase transfers example, a ledger with external payouts.

Usage:
  transfers [demo flags]   run the demo: the ledger API, the fake payout provider and
                           the completer in one process, driven by concurrent clients
                           with injected crashes, duplicate requests, provider faults
                           and contention; prints the invariant report and exits 1 if
                           an invariant fails
  transfers serve          run the ledger API (POST /transfers, GET /accounts)
  transfers payouts        run the fake payout provider alone
  transfers verify         check the invariants of a ledger's database
  transfers <command> -h   document a command's flags
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "demo"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "demo":
		err = demo(ctx, args, stdout, stderr)
	case "serve":
		err = serve(ctx, args, stderr)
	case "payouts":
		err = payouts(ctx, args, stderr)
	case "verify":
		err = verify(ctx, args, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "transfers: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintln(stderr, "transfers:", err)
	return 1
}

var (
	errUsage     = errors.New("usage")
	errInvariant = errors.New("an invariant failed")
)

func newFlags(name, doc string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nFlags:\n", doc)
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %v\n", fs.Args())
		return errUsage
	}
	return nil
}

func databaseFlag(fs *flag.FlagSet, embedded bool) *string {
	doc := "Postgres URL (default $DATABASE_URL)"
	if embedded {
		doc = "Postgres URL (default $DATABASE_URL; an embedded throwaway Postgres when empty)"
	}
	return fs.String("database-url", os.Getenv("DATABASE_URL"), doc)
}

// database connects to url, or to an embedded throwaway Postgres when url
// is empty, and applies the ledger's and the payout provider's schemas.
func database(ctx context.Context, url string, log io.Writer) (*pgxpool.Pool, func(), error) {
	stop := func() {}
	if url == "" {
		fmt.Fprintln(log, "no database URL given: starting an embedded throwaway Postgres...")
		dsn, stopPG, err := pgtest.Embedded(ctx)
		if err != nil {
			return nil, nil, err
		}
		url, stop = dsn, stopPG
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, 32)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = ledger.Migrate(ctx, pool)
	}
	if err == nil {
		err = payoutprovider.Migrate(ctx, pool)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		stop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); stop() }, nil
}

// listen serves h on addr and returns its base URL and a shutdown func.
func listen(addr string, h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// demoAccounts are the accounts serve opens on an empty ledger and the demo
// opens on every run: five accounts of three owners, one in another
// currency.
var demoAccounts = []struct {
	owner, currency string
	deposit         int64
}{
	{"alice", "EUR", 50_000},
	{"alice", "EUR", 50_000},
	{"bob", "EUR", 50_000},
	{"bob", "USD", 50_000},
	{"carol", "EUR", 50_000},
}

func openDemoAccounts(ctx context.Context, db *pgxpool.Pool) ([]ledger.Account, error) {
	accounts := make([]ledger.Account, 0, len(demoAccounts))
	for _, a := range demoAccounts {
		acct, err := ledger.Open(ctx, db, a.owner, a.currency, a.deposit)
		if err != nil {
			return nil, err
		}
		accounts = append(accounts, acct)
	}
	return accounts, nil
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlags("transfers serve", `transfers serve: run the ledger API with its completer and reaper.

  POST /transfers   {"from_account":2,"to_account":4,"amount":1250,"currency":"EUR"}
                    or {"from_account":2,"payout_destination":"dest_x","amount":1250,"currency":"EUR"}
                    with "Authorization: Bearer <owner>" and an Idempotency-Key header
  GET  /accounts    the caller's accounts

Migrates the database and, when alice has no account yet, opens the demo
accounts (alice: 2 EUR; bob: 1 EUR, 1 USD; carol: 1 EUR) and logs their ids.`, stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	dbURL := databaseFlag(fs, true)
	payoutsURL := fs.String("payouts-url", "", "base URL of the payout provider (empty: run the fake provider in this process, on the same database, at a free local port)")
	if err := parse(fs, args); err != nil {
		return err
	}
	db, closeDB, err := database(ctx, *dbURL, stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	if existing, err := ledger.Accounts(ctx, db, "alice"); err != nil {
		return err
	} else if len(existing) == 0 {
		accounts, err := openDemoAccounts(ctx, db)
		if err != nil {
			return err
		}
		for _, a := range accounts {
			slog.Info("opened account", "id", a.ID, "owner", a.Owner, "currency", a.Currency, "balance", a.Balance)
		}
	}
	if *payoutsURL == "" {
		url, stop, err := listen("127.0.0.1:0", payoutprovider.New(db, payoutprovider.Config{}))
		if err != nil {
			return err
		}
		defer stop()
		*payoutsURL = url
		slog.Info("fake payout provider listening", "url", url)
	}
	transfers, err := ledger.Transfers(payoutprovider.NewClient(*payoutsURL, nil))
	if err != nil {
		return err
	}
	rn, err := phase.NewRunner(phase.Config{Pool: db}, transfers)
	if err != nil {
		return err
	}
	h, err := ledger.Handler(rn, transfers)
	if err != nil {
		return err
	}
	completer, err := recovery.NewCompleter(recovery.CompleterConfig{Pool: db, Resumer: rn})
	if err != nil {
		return err
	}
	reaper, err := recovery.NewReaper(recovery.ReaperConfig{Pool: db})
	if err != nil {
		return err
	}
	if err := completer.Start(ctx); err != nil {
		return err
	}
	if err := reaper.Start(ctx); err != nil {
		return err
	}
	url, shutdown, err := listen(*addr, h)
	if err != nil {
		return err
	}
	slog.Info("ledger API listening", "url", url, "payouts", *payoutsURL)
	<-ctx.Done()
	shutdown()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return errors.Join(completer.Stop(stopCtx), reaper.Stop(stopCtx))
}

func payouts(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlags("transfers payouts", `transfers payouts: run the fake payout provider alone.

  POST /v1/payouts       {"amount":1250,"currency":"EUR","destination":"dest_x","reference":"42"}
                         with an Idempotency-Key header; destination dest_closed fails
  GET  /v1/payouts/{id}
  GET  /_faults, POST /_faults   {"fail_before_payout":1,"timeout_after_payout":1,
                                  "fail_before_payout_rate":0.1,"timeout_after_payout_rate":0.1,"delay_ms":50}
  GET  /_stats

Run it on the ledger's database so that verify can compare payouts with transfers.`, stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "address to listen on")
	dbURL := databaseFlag(fs, true)
	if err := parse(fs, args); err != nil {
		return err
	}
	db, closeDB, err := database(ctx, *dbURL, stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	url, shutdown, err := listen(*addr, payoutprovider.New(db, payoutprovider.Config{}))
	if err != nil {
		return err
	}
	slog.Info("fake payout provider listening", "url", url)
	<-ctx.Done()
	shutdown()
	return nil
}

func verify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("transfers verify", `transfers verify: check the ledger's invariants in one snapshot and print them;
exit 1 when one fails. The payout provider's tables must be in the same database.
Safe to run while the API serves traffic.`, stderr)
	dbURL := databaseFlag(fs, false)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *dbURL == "" {
		fmt.Fprintln(stderr, "verify needs -database-url or DATABASE_URL")
		return errUsage
	}
	// Connect without migrating: verify reads, and a URL pointing at the
	// wrong database should fail rather than get the ledger's tables.
	db, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	defer db.Close()
	report, err := ledger.Verify(ctx, db)
	if err != nil {
		return err
	}
	if err := report.Write(stdout); err != nil {
		return err
	}
	if !report.OK() {
		return errInvariant
	}
	return nil
}
