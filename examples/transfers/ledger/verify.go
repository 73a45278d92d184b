package ledger

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
)

// Check is one invariant and whether it held.
type Check struct {
	Name   string
	OK     bool
	Detail string
}

// Report is what Verify found: the invariants, and the transfers it saw.
type Report struct {
	Checks []Check
	// Settled counts settled transfers; SettledExternal those of them that
	// paid out of the ledger.
	Settled, SettledExternal int
	// PayoutFailed counts transfers whose payout the provider refused.
	PayoutFailed int
	// InFlight counts transfers with money on hold, not yet finished.
	InFlight int
}

// OK reports whether every check held.
func (r *Report) OK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// Write prints the report as a table, one check per line.
func (r *Report) Write(w io.Writer) error {
	fmt.Fprintf(w, "transfers: %d settled (%d paid out), %d payouts refused, %d in flight\n",
		r.Settled, r.SettledExternal, r.PayoutFailed, r.InFlight)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INVARIANT\tRESULT\tDETAIL")
	for _, c := range r.Checks {
		result := "ok"
		if !c.OK {
			result = "FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, result, c.Detail)
	}
	return tw.Flush()
}

// Verify checks the ledger's invariants in one snapshot of the database:
//
//   - money conserved: per currency, the customer accounts' balances, holds
//     and payouts add up to what was deposited;
//   - double entry: every movement is two entries in one currency that sum
//     to zero, and every account's buckets equal the sum of its entries;
//   - no negative balance;
//   - each transfer moved once: two entries for a transfer in flight, four
//     for a finished one;
//   - one payout per external transfer: every external transfer past its
//     payout has exactly one payout at the provider, with its amount,
//     currency and destination, and no payout belongs to anything else;
//   - no hold left behind: a finished transfer holds nothing, and every
//     account's hold is exactly its transfers in flight.
//
// The payout provider's tables must be in the same database (as in this
// example), so that both sides are read in the same snapshot: then the
// invariants hold at every moment, not only when traffic has stopped, and
// Verify can run against a live system.
func Verify(ctx context.Context, db *pgxpool.Pool) (*Report, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("ledger: verify: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	r := &Report{}
	for _, check := range []func(context.Context, pgx.Tx, *Report) (Check, error){
		checkConserved, checkDoubleEntry, checkNonNegative, checkMovedOnce, checkPayouts, checkHolds,
	} {
		c, err := check(ctx, tx, r)
		if err != nil {
			return nil, fmt.Errorf("ledger: verify: %w", err)
		}
		r.Checks = append(r.Checks, c)
	}
	return r, nil
}

const conservedSQL = `
SELECT currency,
       coalesce(sum(balance)  FILTER (WHERE kind = 'customer'), 0),
       coalesce(sum(held)     FILTER (WHERE kind = 'customer'), 0),
       coalesce(sum(paid_out) FILTER (WHERE kind = 'customer'), 0),
       coalesce(-sum(balance) FILTER (WHERE kind = 'funding'), 0)
FROM ledger_accounts
GROUP BY currency
ORDER BY currency`

func checkConserved(ctx context.Context, tx pgx.Tx, _ *Report) (Check, error) {
	c := Check{Name: "money conserved", OK: true}
	rows, err := tx.Query(ctx, conservedSQL)
	if err != nil {
		return c, err
	}
	var details []string
	var currency string
	var balances, holds, paidOut, initial int64
	_, err = pgx.ForEachRow(rows, []any{&currency, &balances, &holds, &paidOut, &initial}, func() error {
		sign := "="
		if balances+holds+paidOut != initial {
			c.OK, sign = false, "≠"
		}
		details = append(details, fmt.Sprintf("%s: balances %d + holds %d + paid out %d %s initial %d",
			currency, balances, holds, paidOut, sign, initial))
		return nil
	})
	c.Detail = strings.Join(details, "; ")
	if c.Detail == "" {
		c.Detail = "no accounts"
	}
	return c, err
}

// doubleEntrySQL counts entries, movements that are not two entries in one
// currency summing to zero, and accounts whose stored buckets differ from
// the sum of their entries.
const doubleEntrySQL = `
SELECT
    (SELECT count(*) FROM ledger_entries),
    (SELECT count(*) FROM (
        SELECT e.movement FROM ledger_entries e JOIN ledger_accounts a ON a.id = e.account_id
        GROUP BY e.movement
        HAVING count(*) <> 2 OR sum(e.amount) <> 0 OR count(DISTINCT a.currency) <> 1) AS m),
    (SELECT count(*) FROM ledger_accounts a
     CROSS JOIN LATERAL (
         SELECT coalesce(sum(amount) FILTER (WHERE bucket = 'balance'), 0)  AS balance,
                coalesce(sum(amount) FILTER (WHERE bucket = 'held'), 0)     AS held,
                coalesce(sum(amount) FILTER (WHERE bucket = 'paid_out'), 0) AS paid_out
         FROM ledger_entries e WHERE e.account_id = a.id) AS s
     WHERE (a.balance, a.held, a.paid_out) <> (s.balance, s.held, s.paid_out))`

func checkDoubleEntry(ctx context.Context, tx pgx.Tx, _ *Report) (Check, error) {
	var entries, unbalanced, drifted int
	err := tx.QueryRow(ctx, doubleEntrySQL).Scan(&entries, &unbalanced, &drifted)
	return Check{
		Name: "double entry",
		OK:   unbalanced == 0 && drifted == 0,
		Detail: fmt.Sprintf("%d entries; %d movements not a zero-sum pair; %d accounts differing from their entries",
			entries, unbalanced, drifted),
	}, err
}

func checkNonNegative(ctx context.Context, tx pgx.Tx, _ *Report) (Check, error) {
	var accounts, negative int
	err := tx.QueryRow(ctx, `
SELECT count(*), count(*) FILTER (WHERE balance < 0 OR held < 0 OR paid_out < 0)
FROM ledger_accounts WHERE kind = 'customer'`).Scan(&accounts, &negative)
	return Check{
		Name:   "no negative balance",
		OK:     negative == 0,
		Detail: fmt.Sprintf("%d of %d accounts below zero", negative, accounts),
	}, err
}

// movedOnceSQL lists transfers whose entries are not one hold (two
// entries) while in flight, or one hold and one settlement or release
// (four) once finished: a phase that committed twice would show here.
const movedOnceSQL = `
SELECT t.id FROM ledger_transfers t
WHERE (SELECT count(*) FROM ledger_entries e WHERE e.transfer_id = t.id)
      <> CASE WHEN t.status IN ('held', 'payout_sent') THEN 2 ELSE 4 END
ORDER BY t.id`

func checkMovedOnce(ctx context.Context, tx pgx.Tx, r *Report) (Check, error) {
	c := Check{Name: "each transfer moved once"}
	err := tx.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE status = 'settled'),
       count(*) FILTER (WHERE status = 'settled' AND payout_destination IS NOT NULL),
       count(*) FILTER (WHERE status = 'payout_failed'),
       count(*) FILTER (WHERE status IN ('held', 'payout_sent'))
FROM ledger_transfers`).Scan(&r.Settled, &r.SettledExternal, &r.PayoutFailed, &r.InFlight)
	if err != nil {
		return c, err
	}
	rows, err := tx.Query(ctx, movedOnceSQL)
	if err != nil {
		return c, err
	}
	wrong, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	c.OK = len(wrong) == 0
	c.Detail = fmt.Sprintf("%d transfers; %d with other than one hold and one settlement%s",
		r.Settled+r.PayoutFailed+r.InFlight, len(wrong), firstIDs("transfers", wrong))
	return c, err
}

// externalTransfer is what checkPayouts compares with the provider.
type externalTransfer struct {
	ID          int64
	Status      string
	Amount      int64
	Currency    string
	Destination string
	PayoutID    string
}

func checkPayouts(ctx context.Context, tx pgx.Tx, _ *Report) (Check, error) {
	c := Check{Name: "one payout per external transfer"}
	rows, err := tx.Query(ctx, `
SELECT id, status, amount, currency, payout_destination, coalesce(payout_id, '')
FROM ledger_transfers WHERE payout_destination IS NOT NULL ORDER BY id`)
	if err != nil {
		return c, err
	}
	transfers, err := pgx.CollectRows(rows, pgx.RowToStructByPos[externalTransfer])
	if err != nil {
		return c, err
	}
	// Read after the ledger in the same snapshot: a payout is made only
	// after its transfer committed, so every payout seen here has its
	// transfer in the snapshot too.
	payouts, err := payoutprovider.Payouts(ctx, tx)
	if err != nil {
		return c, fmt.Errorf("%w (verify reads the payout provider's tables from the ledger's database)", err)
	}
	byReference := map[string][]payoutprovider.Payout{}
	for _, p := range payouts {
		byReference[p.Reference] = append(byReference[p.Reference], p)
	}
	var wrong []int64
	paid := 0
	for _, t := range transfers {
		ref := strconv.FormatInt(t.ID, 10)
		got := byReference[ref]
		delete(byReference, ref)
		if t.Status == "held" {
			// In flight: the payout may be out and not yet recorded.
			if len(got) > 1 {
				wrong = append(wrong, t.ID)
			}
			continue
		}
		want := payoutprovider.StatusPaid
		if t.Status == "payout_failed" {
			want = payoutprovider.StatusFailed
		}
		if len(got) != 1 || got[0].ID != t.PayoutID || got[0].Status != want ||
			got[0].Amount != t.Amount || got[0].Currency != t.Currency || got[0].Destination != t.Destination {
			wrong = append(wrong, t.ID)
			continue
		}
		if want == payoutprovider.StatusPaid {
			paid++
		}
	}
	orphans := 0
	for _, ps := range byReference {
		orphans += len(ps)
	}
	c.OK = len(wrong) == 0 && orphans == 0
	c.Detail = fmt.Sprintf("%d external transfers, %d paid out; %d without exactly one matching payout%s; %d payouts of no transfer",
		len(transfers), paid, len(wrong), firstIDs("transfers", wrong), orphans)
	return c, nil
}

// holdsSQL counts finished transfers whose hold entries do not cancel out,
// and accounts whose hold is not the sum of their transfers in flight.
const holdsSQL = `
SELECT
    (SELECT count(*) FROM ledger_transfers t
     WHERE t.status IN ('settled', 'payout_failed')
       AND (SELECT coalesce(sum(amount), 0) FROM ledger_entries e WHERE e.transfer_id = t.id AND e.bucket = 'held') <> 0),
    (SELECT count(*) FROM ledger_accounts a
     WHERE a.kind = 'customer'
       AND a.held <> (SELECT coalesce(sum(amount), 0) FROM ledger_transfers t
                      WHERE t.from_account = a.id AND t.status IN ('held', 'payout_sent'))),
    (SELECT coalesce(sum(held), 0) FROM ledger_accounts)`

func checkHolds(ctx context.Context, tx pgx.Tx, r *Report) (Check, error) {
	var leftBehind, drifted, held int64
	err := tx.QueryRow(ctx, holdsSQL).Scan(&leftBehind, &drifted, &held)
	return Check{
		Name: "no hold left behind",
		OK:   leftBehind == 0 && drifted == 0,
		Detail: fmt.Sprintf("%d finished transfers still holding money; %d accounts holding other than their %d transfers in flight (%d held)",
			leftBehind, drifted, r.InFlight, held),
	}, err
}

// firstIDs lists the first few ids, for a detail line.
func firstIDs(what string, ids []int64) string {
	if len(ids) == 0 {
		return ""
	}
	shown := make([]string, 0, 5)
	for _, id := range ids[:min(len(ids), 5)] {
		shown = append(shown, strconv.FormatInt(id, 10))
	}
	more := ""
	if len(ids) > 5 {
		more = ", ..."
	}
	return fmt.Sprintf(" (%s %s%s)", what, strings.Join(shown, ", "), more)
}
