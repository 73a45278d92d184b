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
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog"
	"github.com/atomicphase/atomicphase/examples/transfers/ledger"
	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/phase"
)

func main() { program.Main() }

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

Exit status: 0 success, 1 error or failed invariant, 2 usage error.
`

var program = exampleprog.Program{
	Name:  "transfers",
	Usage: usage,
	Commands: map[string]exampleprog.Command{
		"demo":    demo,
		"serve":   serve,
		"payouts": payouts,
		"verify":  verify,
	},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program.Run(ctx, args, stdout, stderr)
}

var errInvariant = errors.New("an invariant failed")

func databaseFlag(fs *flag.FlagSet, embedded bool) *string {
	if embedded {
		return exampleprog.DatabaseURL(fs, "Postgres `URL` (default $DATABASE_URL; an embedded throwaway Postgres, deleted on exit, when empty)")
	}
	return exampleprog.DatabaseURL(fs, "Postgres `URL` (default $DATABASE_URL)")
}

// database connects to url, or to an embedded throwaway Postgres when url
// is empty, and applies migrate, which migrates what the command owns.
func database(ctx context.Context, url string, migrate func(context.Context, *pgxpool.Pool) error, log io.Writer) (*pgxpool.Pool, func(), error) {
	return exampleprog.OpenDatabase(ctx, exampleprog.Database{URL: url, PoolSize: 32, Migrate: migrate, Progress: log})
}

// migrateAll applies the ledger's and the payout provider's schemas, for a
// command that runs both on one database.
func migrateAll(ctx context.Context, db *pgxpool.Pool) error {
	if err := migrateLedger(ctx, db); err != nil {
		return err
	}
	return payoutprovider.Migrate(ctx, db)
}

func migrateLedger(ctx context.Context, db *pgxpool.Pool) error { return ledger.Migrate(ctx, db) }

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

func serve(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := exampleprog.Flags("transfers serve", `transfers serve: run the ledger API with its completer and reaper.

  POST /transfers   {"from_account":2,"to_account":4,"amount":1250,"currency":"EUR"}
                    or {"from_account":2,"payout_destination":"dest_x","amount":1250,"currency":"EUR"}
                    with "Authorization: Bearer <owner>" and an Idempotency-Key header
  GET  /accounts    the caller's accounts

Migrates the database and, when alice has no account yet, opens the demo
accounts (alice: 2 EUR; bob: 1 EUR, 1 USD; carol: 1 EUR) and logs their ids.`, stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	dbURL := databaseFlag(fs, true)
	payoutsURL := fs.String("payouts-url", "", "base URL of the payout provider (empty: run the fake provider in this process, on the same database, at a free local port)")
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	migrate := migrateLedger
	if *payoutsURL == "" {
		migrate = migrateAll
	}
	db, closeDB, err := database(ctx, *dbURL, migrate, stderr)
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
		url, stop, err := exampleprog.Listen("127.0.0.1:0", payoutprovider.New(db, payoutprovider.Config{}))
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
	client, err := phase.NewClient(db, nil, transfers)
	if err != nil {
		return err
	}
	h, err := ledger.Handler(db, client, transfers)
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	if err := exampleprog.Serve(ctx, ln, exampleprog.Problems(h), "ledger API listening", "payouts", *payoutsURL); err != nil {
		return err
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return client.Stop(stopCtx)
}

func payouts(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := exampleprog.Flags("transfers payouts", `transfers payouts: run the fake payout provider alone.

  POST /v1/payouts       {"amount":1250,"currency":"EUR","destination":"dest_x","reference":"42"}
                         with an Idempotency-Key header; destination dest_closed fails
  GET  /v1/payouts/{id}
  GET  /_stats     requests, paid, failed, replays, conflicts, faults_injected
  GET  /_faults    the faults still planned
  POST /_faults    plan faults, as JSON; fields left out keep their value, 0 clears:
    fail_before_payout N         the next N payouts answer 500 without paying;
                                 a retry with the same key pays
    timeout_after_payout N       the next N payouts are made, then the connection
                                 drops mid-answer; a retry with the key replays the payout
    fail_before_payout_rate P    probability (0 to 1) of a failure before any other payout
    timeout_after_payout_rate P  probability of a drop after any other payout
    delay_ms MS                  added to every API request (the key is held meanwhile)

Migrates only its own tables (payoutprovider_*). Run it on the ledger's
database so that verify can compare payouts with transfers.`, stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "address to listen on")
	dbURL := databaseFlag(fs, true)
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	db, closeDB, err := database(ctx, *dbURL, payoutprovider.Migrate, stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	return exampleprog.Serve(ctx, ln, payoutprovider.New(db, payoutprovider.Config{}), "fake payout provider listening")
}

func verify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := exampleprog.Flags("transfers verify", `transfers verify: check the ledger's invariants in one snapshot and print them;
exit 1 when one fails. The payout provider's tables must be in the same database.
Safe to run while the API serves traffic.`, stderr)
	dbURL := databaseFlag(fs, false)
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	if *dbURL == "" {
		fmt.Fprintln(stderr, "verify needs -database-url or DATABASE_URL")
		return exampleprog.ErrUsage
	}
	// Connect without migrating: verify reads, and a URL pointing at the
	// wrong database should fail rather than get the ledger's tables.
	db, closeDB, err := exampleprog.OpenDatabase(ctx, exampleprog.Database{URL: *dbURL, Progress: stderr})
	if err != nil {
		return err
	}
	defer closeDB()
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
