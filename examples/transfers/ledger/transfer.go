package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/phase"
)

// Transfer is the request of POST /transfers: move Amount of Currency from
// one of the caller's accounts to another account (an internal transfer),
// or out of the ledger to a payout destination (an external transfer).
type Transfer struct {
	// FromAccount is the account the money leaves; the caller must own it.
	FromAccount int64 `json:"from_account"`
	// ToAccount receives an internal transfer; zero for an external one.
	ToAccount int64 `json:"to_account,omitempty"`
	// Amount in minor units (cents), at least 1.
	Amount int64 `json:"amount"`
	// Currency is an upper-case ISO 4217 code; both accounts must hold it.
	Currency string `json:"currency"`
	// PayoutDestination makes the transfer external: the payout provider
	// sends the money to it. Empty for an internal transfer.
	PayoutDestination string `json:"payout_destination,omitempty"`
}

// External reports whether t pays out of the ledger.
func (t Transfer) External() bool { return t.PayoutDestination != "" }

// accounts returns the customer accounts t moves money between.
func (t Transfer) accounts() []int64 {
	if t.External() {
		return []int64{t.FromAccount}
	}
	return []int64{t.FromAccount, t.ToAccount}
}

// State is the transfers workflow's typed state. It is committed with every
// phase, so later phases, retries and the completer read the ids earlier
// phases produced without looking them up.
type State struct {
	// TransferID is the ledger_transfers row, set by funds_held.
	TransferID int64 `json:"transfer_id,omitempty"`
	// PayoutID is the provider's payout, set by payout_sent.
	PayoutID string `json:"payout_id,omitempty"`
}

// The transfers workflow's name and its phases, which are also the recovery
// points its keys go through: started, funds_held, payout_sent (external
// transfers only), then finished once settled has answered.
const (
	WorkflowName    = "transfers"
	PhaseFundsHeld  = "funds_held"
	PhasePayoutSent = "payout_sent"
	PhaseSettled    = "settled"
)

// isolation is the isolation level of every phase that moves money.
//
// READ COMMITTED with row locks: each phase first locks the accounts it
// touches, lowest id first (lockAccountsSQL), and decides on the rows it
// then reads, which are the latest committed versions and cannot change
// until it commits. Transfers sharing an account queue on its row lock and
// each one sees the balance the previous one left; transfers in opposite
// directions cannot deadlock because every phase locks in the same order.
//
// SERIALIZABLE (or REPEATABLE READ) would keep the balances right too, but
// a transaction's snapshot is taken before it waits for the lock, so when
// the holder commits, every transaction queued behind it fails with a
// serialization failure and starts over: under contention most of a
// phase's bounded retries are spent on that, and some runs exhaust them.
// Serialization failures and deadlocks are still retried
// (phase.Config.MaxPhaseRetries), so a mistake in the lock order would cost
// a retry, never money. The level is set rather than left to the database
// default, which could be SERIALIZABLE.
const isolation = pgx.ReadCommitted

// Transfers returns the transfers workflow, whose external payouts go
// through payouts. Register it with a phase.Client and serve it with Handler.
func Transfers(payouts *payoutprovider.Client) (*phase.Workflow[Transfer, State], error) {
	return transfers(payouts)
}

// transfers is Transfers with afterHold declared between the hold and the
// payout, as a later definition of the workflow might add them.
func transfers(payouts *payoutprovider.Client, afterHold ...phase.Phase[Transfer, State]) (*phase.Workflow[Transfer, State], error) {
	if payouts == nil {
		return nil, errors.New("ledger: transfers: a payout provider client is required")
	}
	phases := append([]phase.Phase[Transfer, State]{phase.Local(PhaseFundsHeld, holdFunds).Isolation(isolation)}, afterHold...)
	return phase.NewWorkflow(WorkflowName, append(phases,
		phase.Foreign(PhasePayoutSent, sendPayout(payouts), recordPayout).
			Repeatable().
			Isolation(isolation).
			When(func(in *transferRun) bool { return in.Req.External() }),
		phase.Local(PhaseSettled, settle).Isolation(isolation),
	)...)
}

type transferRun = phase.Input[Transfer, State]

// holdFunds checks the transfer against the accounts, under their locks, and
// moves the amount from the source's balance into its hold. A transfer the
// ledger refuses ends here with a stored answer, and nothing moves.
func holdFunds(ctx context.Context, tx pgx.Tx, in *transferRun) (phase.Result, error) {
	req := in.Req
	accounts, err := lockAccounts(ctx, tx, req.accounts()...)
	if err != nil {
		return phase.Result{}, err
	}
	from, ok := accounts[req.FromAccount]
	if !ok || from.Owner != in.Tenant {
		// Someone else's account is reported as missing, so that account
		// ids cannot be probed.
		return refuse(Problem{Type: ProblemUnknownAccount, Status: http.StatusNotFound, Field: "from_account",
			Detail: fmt.Sprintf("you have no account %d", req.FromAccount)}), nil
	}
	to, ok := accounts[req.ToAccount]
	if !req.External() && !ok {
		return refuse(Problem{Type: ProblemUnknownAccount, Status: http.StatusNotFound, Field: "to_account",
			Detail: fmt.Sprintf("there is no account %d", req.ToAccount)}), nil
	}
	for _, a := range []Account{from, to} {
		if a.ID != 0 && a.Currency != req.Currency {
			return refuse(Problem{Type: ProblemCurrencyMismatch, Status: http.StatusUnprocessableEntity, Field: "currency",
				Detail: fmt.Sprintf("account %d holds %s, not %s", a.ID, a.Currency, req.Currency)}), nil
		}
	}
	if from.Balance < req.Amount {
		return refuse(Problem{Type: ProblemInsufficientFunds, Status: http.StatusUnprocessableEntity, Field: "amount",
			Detail: fmt.Sprintf("account %d has %d %s available; the transfer needs %d", from.ID, from.Balance, req.Currency, req.Amount)}), nil
	}
	err = tx.QueryRow(ctx, insertTransferSQL, in.Tenant, in.Key, in.ID, req.FromAccount, nullIfZero(req.ToAccount),
		nullIfEmpty(req.PayoutDestination), req.Amount, req.Currency).Scan(&in.State.TransferID)
	if err != nil {
		return phase.Result{}, fmt.Errorf("insert transfer: %w", err)
	}
	return phase.Next(), move(ctx, tx, &in.State.TransferID, req.Amount,
		leg{req.FromAccount, bucketBalance}, leg{req.FromAccount, bucketHeld})
}

const insertTransferSQL = `
INSERT INTO ledger_transfers (owner, idempotency_key, key_id, from_account, to_account, payout_destination, amount, currency)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING id`

// sendPayout asks the provider for the payout under the phase's downstream
// key, which is the same on every retry, so the provider pays once however
// often the call is repeated. An answer that never came is an unknown
// outcome; the phase is repeatable, so the next run repeats the call.
func sendPayout(payouts *payoutprovider.Client) phase.CallFunc[Transfer, State, payoutprovider.Payout] {
	return func(ctx context.Context, in *transferRun) (payoutprovider.Payout, error) {
		p, err := payouts.CreatePayout(ctx, in.DownstreamKey(), payoutprovider.PayoutParams{
			Amount:      in.Req.Amount,
			Currency:    in.Req.Currency,
			Destination: in.Req.PayoutDestination,
			Reference:   strconv.FormatInt(in.State.TransferID, 10),
		})
		if errors.Is(err, payoutprovider.ErrOutcomeUnknown) {
			return p, phase.MaybeHappened(err)
		}
		return p, err
	}
}

// recordPayout records the payout. A payout the destination refused moved
// no money, so the hold goes back to the balance and the transfer ends with
// a stored refusal.
func recordPayout(ctx context.Context, tx pgx.Tx, in *transferRun, p payoutprovider.Payout) (phase.Result, error) {
	in.State.PayoutID = p.ID
	id := in.State.TransferID
	if p.Status == payoutprovider.StatusPaid {
		return phase.Next(), setStatus(ctx, tx, id, "payout_sent", p.ID)
	}
	if _, err := lockAccounts(ctx, tx, in.Req.FromAccount); err != nil {
		return phase.Result{}, err
	}
	if err := move(ctx, tx, &id, in.Req.Amount, leg{in.Req.FromAccount, bucketHeld}, leg{in.Req.FromAccount, bucketBalance}); err != nil {
		return phase.Result{}, err
	}
	if err := setStatus(ctx, tx, id, "payout_failed", p.ID); err != nil {
		return phase.Result{}, err
	}
	return refuse(Problem{Type: ProblemPayoutFailed, Status: http.StatusUnprocessableEntity, Field: "payout_destination", TransferID: id,
		Detail: fmt.Sprintf("the payout provider refused payout %s (%s); the money is back in account %d", p.ID, p.FailureCode, in.Req.FromAccount)}), nil
}

// settle moves the held amount to its destination (the receiving account,
// or the source's paid-out bucket once the provider has paid) and answers
// 201 with the receipt.
func settle(ctx context.Context, tx pgx.Tx, in *transferRun) (phase.Result, error) {
	req, id := in.Req, in.State.TransferID
	if _, err := lockAccounts(ctx, tx, req.accounts()...); err != nil {
		return phase.Result{}, err
	}
	to := leg{req.ToAccount, bucketBalance}
	if req.External() {
		to = leg{req.FromAccount, bucketPaidOut}
	}
	if err := move(ctx, tx, &id, req.Amount, leg{req.FromAccount, bucketHeld}, to); err != nil {
		return phase.Result{}, err
	}
	if err := setStatus(ctx, tx, id, "settled", ""); err != nil {
		return phase.Result{}, err
	}
	return phase.JSON(http.StatusCreated, Receipt{
		TransferID:        id,
		Status:            "settled",
		FromAccount:       req.FromAccount,
		ToAccount:         req.ToAccount,
		Amount:            req.Amount,
		Currency:          req.Currency,
		PayoutDestination: req.PayoutDestination,
		PayoutID:          in.State.PayoutID,
	}), nil
}

// setStatusSQL moves a transfer to status; a non-empty $3 records its
// payout. settled and payout_failed are final.
const setStatusSQL = `
UPDATE ledger_transfers
SET status = $2,
    payout_id = coalesce(nullif($3, ''), payout_id),
    finished_at = CASE WHEN $2 IN ('settled', 'payout_failed') THEN now() END
WHERE id = $1`

func setStatus(ctx context.Context, tx pgx.Tx, id int64, status, payoutID string) error {
	tag, err := tx.Exec(ctx, setStatusSQL, id, status, payoutID)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("no such transfer")
	}
	if err != nil {
		return fmt.Errorf("transfer %d to %s: %w", id, status, err)
	}
	return nil
}

// Receipt is the body of the 201 answer to a settled transfer.
type Receipt struct {
	TransferID        int64  `json:"transfer_id"`
	Status            string `json:"status"`
	FromAccount       int64  `json:"from_account"`
	ToAccount         int64  `json:"to_account,omitempty"`
	Amount            int64  `json:"amount"`
	Currency          string `json:"currency"`
	PayoutDestination string `json:"payout_destination,omitempty"`
	PayoutID          string `json:"payout_id,omitempty"`
}

// The problem types of transfers the ledger refuses. Each refusal is a
// final answer: it is stored under the request's Idempotency-Key and
// replayed, and nothing moved (a refused payout's hold went back).
const (
	// ProblemUnknownAccount (404): the source account is not the caller's,
	// or the receiving account does not exist.
	ProblemUnknownAccount = "urn:transfers:problem:unknown-account"
	// ProblemCurrencyMismatch (422): an account holds another currency.
	ProblemCurrencyMismatch = "urn:transfers:problem:currency-mismatch"
	// ProblemInsufficientFunds (422): the source's balance is below the
	// amount.
	ProblemInsufficientFunds = "urn:transfers:problem:insufficient-funds"
	// ProblemPayoutFailed (422): the payout provider refused the payout.
	ProblemPayoutFailed = "urn:transfers:problem:payout-failed"
)

// Problem is an RFC 9457 problem details body, as the ledger and the
// atomicphase handler answer failures.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Field names the request field at fault, when there is one.
	Field string `json:"field,omitempty"`
	// TransferID is set when the refusal came after the transfer was
	// recorded (a refused payout).
	TransferID int64 `json:"transfer_id,omitempty"`
}

var problemTitles = map[string]string{
	ProblemUnknownAccount:    "Unknown account",
	ProblemCurrencyMismatch:  "Currency mismatch",
	ProblemInsufficientFunds: "Insufficient funds",
	ProblemPayoutFailed:      "Payout failed",
}

// refuse ends the workflow with p as its stored answer.
func refuse(p Problem) phase.Result {
	p.Title = problemTitles[p.Type]
	body, _ := json.Marshal(p) // strings and ints always encode
	return phase.Respond(p.Status, http.Header{"Content-Type": {"application/problem+json"}}, append(body, '\n'))
}

func nullIfZero(n int64) *int64 {
	if n == 0 {
		return nil
	}
	return &n
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
