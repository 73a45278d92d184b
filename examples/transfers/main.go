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
	"fmt"
	"io"
	"log/slog"
	"net/http"

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

` + exampleprog.ExitStatus

var program = exampleprog.Program{Name: "transfers", Usage: usage, Commands: map[string]exampleprog.Command{
	"demo": demo, "serve": serve, "payouts": payouts.Run, "verify": verify,
}}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program.Run(ctx, args, stdout, stderr)
}

var errInvariant = errors.New("an invariant failed")

// poolSize is the least number of connections of a command's pool: the
// demo's API, payout provider, clients and completer share one.
const poolSize = 32

// database connects to url, or to an embedded throwaway Postgres when url
// is empty, and applies migrate, which migrates what the command owns.
func database(ctx context.Context, url string, migrate func(context.Context, *pgxpool.Pool) error, log io.Writer) (*pgxpool.Pool, func(), error) {
	return exampleprog.OpenDatabase(ctx, exampleprog.Database{URL: url, PoolSize: poolSize, Migrate: migrate, Progress: log})
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
	svc := exampleprog.ServiceFlags(fs, "127.0.0.1:8080")
	payoutsURL := fs.String("payouts-url", "", "base URL of the payout provider (empty: run the fake provider in this process, on the same database, at a free local port)")
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	migrate := migrateLedger
	if *payoutsURL == "" {
		migrate = migrateAll
	}
	if err := svc.Open(ctx, exampleprog.Database{PoolSize: poolSize, Migrate: migrate, Progress: stderr}); err != nil {
		return err
	}
	defer svc.Close()
	db := svc.Pool
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
	if err := svc.Serve(ctx, exampleprog.Problems(h), "ledger API listening", "payouts", *payoutsURL); err != nil {
		return err
	}
	return exampleprog.Stop(client.Stop)
}

// payouts is transfers payouts.
var payouts = exampleprog.API{Name: "transfers payouts", Addr: "127.0.0.1:8081", PoolSize: poolSize,
	Migrate: payoutprovider.Migrate, New: func(db *pgxpool.Pool) http.Handler { return payoutprovider.New(db, payoutprovider.Config{}) },
	Listening: "fake payout provider listening", Doc: `transfers payouts: run the fake payout provider alone.

  POST /v1/payouts       {"amount":1250,"currency":"EUR","destination":"dest_x","reference":"42"}
                         with an Idempotency-Key header; destination dest_closed fails
  GET  /v1/payouts/{id}
` + payoutprovider.ControlUsage + `
Migrates only its own tables (payoutprovider_*). Run it on the ledger's
database so that verify can compare payouts with transfers.`}

func verify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := exampleprog.Flags("transfers verify", `transfers verify: check the ledger's invariants in one snapshot and print them;
exit 1 when one fails. The payout provider's tables must be in the same database.
Safe to run while the API serves traffic.`, stderr)
	dbURL := exampleprog.DatabaseURL(fs, "Postgres `URL` (default $DATABASE_URL)")
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
