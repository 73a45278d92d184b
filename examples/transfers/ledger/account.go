package ledger

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Account is a customer account: money in one currency, owned by one owner,
// in minor units (cents).
type Account struct {
	ID       int64  `json:"id"`
	Owner    string `json:"owner"`
	Currency string `json:"currency"`
	// Balance is free to spend.
	Balance int64 `json:"balance"`
	// Held is reserved by the account's transfers in flight.
	Held int64 `json:"held"`
	// PaidOut is what the account's external transfers have sent out of the
	// ledger, in all.
	PaidOut int64 `json:"paid_out"`
}

// The buckets an account keeps money in; entries name one.
const (
	bucketBalance = "balance"
	bucketHeld    = "held"
	bucketPaidOut = "paid_out"
)

var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

// Open opens an account for owner in currency (an upper-case ISO 4217 code)
// and deposits deposit into it from the currency's funding account, which
// it creates on first use. The deposit is the only way money enters the
// ledger; Verify counts it as the initial money that must be conserved.
func Open(ctx context.Context, db *pgxpool.Pool, owner, currency string, deposit int64) (Account, error) {
	switch {
	case owner == "" || len(owner) > 255:
		return Account{}, errors.New("ledger: open: owner must be 1 to 255 characters")
	case !currencyCode.MatchString(currency):
		return Account{}, fmt.Errorf("ledger: open: currency %q is not an upper-case ISO 4217 code", currency)
	case deposit < 0:
		return Account{}, errors.New("ledger: open: deposit must not be negative")
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return Account{}, fmt.Errorf("ledger: open: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var funding int64
	if deposit > 0 {
		if funding, err = fundingAccount(ctx, tx, currency); err != nil {
			return Account{}, fmt.Errorf("ledger: open: %w", err)
		}
	}
	a := Account{Owner: owner, Currency: currency}
	err = tx.QueryRow(ctx, `INSERT INTO ledger_accounts (owner, currency) VALUES ($1, $2) RETURNING id`, owner, currency).Scan(&a.ID)
	if err != nil {
		return Account{}, fmt.Errorf("ledger: open: %w", err)
	}
	if deposit > 0 {
		if err := move(ctx, tx, nil, deposit, leg{funding, bucketBalance}, leg{a.ID, bucketBalance}); err != nil {
			return Account{}, fmt.Errorf("ledger: open: %w", err)
		}
		a.Balance = deposit
	}
	if err := tx.Commit(ctx); err != nil {
		return Account{}, fmt.Errorf("ledger: open: %w", err)
	}
	return a, nil
}

// fundingSQL creates the currency's funding account, or returns it when a
// concurrent Open created it first. DO UPDATE rather than DO NOTHING so that
// RETURNING yields the row in both cases. It runs only when the plain
// SELECT found no funding account, because every upsert, even a conflicting
// one, uses up an identity value and would leave gaps in account ids.
const fundingSQL = `
INSERT INTO ledger_accounts (kind, currency) VALUES ('funding', $1)
ON CONFLICT (currency) WHERE kind = 'funding' DO UPDATE SET currency = excluded.currency
RETURNING id`

func fundingAccount(ctx context.Context, tx pgx.Tx, currency string) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `SELECT id FROM ledger_accounts WHERE kind = 'funding' AND currency = $1`, currency).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		err = tx.QueryRow(ctx, fundingSQL, currency).Scan(&id)
	}
	if err != nil {
		return 0, fmt.Errorf("funding account: %w", err)
	}
	return id, nil
}

const accountColumns = `id, owner, currency, balance, held, paid_out`

func scanAccount(row pgx.CollectableRow) (Account, error) {
	var a Account
	err := row.Scan(&a.ID, &a.Owner, &a.Currency, &a.Balance, &a.Held, &a.PaidOut)
	return a, err
}

// Accounts returns owner's accounts by id, as last committed.
func Accounts(ctx context.Context, db *pgxpool.Pool, owner string) ([]Account, error) {
	rows, err := db.Query(ctx, `SELECT `+accountColumns+` FROM ledger_accounts WHERE owner = $1 ORDER BY id`, owner)
	if err != nil {
		return nil, fmt.Errorf("ledger: accounts: %w", err)
	}
	accounts, err := pgx.CollectRows(rows, scanAccount)
	if err != nil {
		return nil, fmt.Errorf("ledger: accounts: %w", err)
	}
	return accounts, nil
}

// lockAccountsSQL locks the customer accounts a phase moves money between,
// lowest id first. Every phase that touches accounts takes its locks with
// this one statement, so two transfers between the same accounts, in
// either direction, queue on the first account they share instead of each
// holding one lock and waiting for the other (a deadlock). The locks are
// taken in the sorted order because the locking step runs above the sort.
// Rows that do not exist, or are funding accounts, are simply not returned.
const lockAccountsSQL = `SELECT ` + accountColumns + ` FROM ledger_accounts
WHERE id = ANY($1) AND kind = 'customer'
ORDER BY id
FOR UPDATE`

// lockAccounts locks the accounts ids names that exist and returns them by id.
func lockAccounts(ctx context.Context, tx pgx.Tx, ids ...int64) (map[int64]Account, error) {
	rows, err := tx.Query(ctx, lockAccountsSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("lock accounts: %w", err)
	}
	accounts, err := pgx.CollectRows(rows, scanAccount)
	if err != nil {
		return nil, fmt.Errorf("lock accounts: %w", err)
	}
	byID := make(map[int64]Account, len(accounts))
	for _, a := range accounts {
		byID[a.ID] = a
	}
	return byID, nil
}

// leg is one side of a movement: a bucket of an account.
type leg struct {
	account int64
	bucket  string
}

// moveSQL records one movement and applies it, in one statement: the two
// entries (minus the amount on the source leg, plus on the destination)
// under a fresh movement number, and the change to each account's stored
// buckets. The change is summed per account before the update because both
// legs can be buckets of one account (a hold moves balance to held), and an
// UPDATE ... FROM applies only one joined row per target row.
const moveSQL = `
WITH legs (account_id, bucket, amount) AS (
    VALUES ($2::bigint, $3::text, -$6::bigint), ($4::bigint, $5::text, $6::bigint)
), movement AS MATERIALIZED (
    SELECT nextval('ledger_movement_seq') AS id
), entries AS (
    INSERT INTO ledger_entries (movement, transfer_id, account_id, bucket, amount)
    SELECT movement.id, $1::bigint, legs.account_id, legs.bucket, legs.amount FROM movement, legs
)
UPDATE ledger_accounts AS a
SET balance  = a.balance  + d.balance,
    held     = a.held     + d.held,
    paid_out = a.paid_out + d.paid_out
FROM (
    SELECT account_id,
           coalesce(sum(amount) FILTER (WHERE bucket = 'balance'), 0)  AS balance,
           coalesce(sum(amount) FILTER (WHERE bucket = 'held'), 0)     AS held,
           coalesce(sum(amount) FILTER (WHERE bucket = 'paid_out'), 0) AS paid_out
    FROM legs
    GROUP BY account_id
) AS d
WHERE a.id = d.account_id`

// move moves amount from one leg to the other as a pair of entries for
// transferID (nil for a deposit). The caller holds the accounts' locks and
// has checked that the source can give the amount; the table's CHECK
// constraints refuse the movement otherwise.
func move(ctx context.Context, tx pgx.Tx, transferID *int64, amount int64, from, to leg) error {
	_, err := tx.Exec(ctx, moveSQL, transferID, from.account, from.bucket, to.account, to.bucket, amount)
	if err != nil {
		return fmt.Errorf("move %d from %d/%s to %d/%s: %w", amount, from.account, from.bucket, to.account, to.bucket, err)
	}
	return nil
}
