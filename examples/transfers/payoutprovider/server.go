package payoutprovider

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// ClosedDestination is the destination whose bank account is closed: a payout
// to it is made with status failed and failure code account_closed, moves no
// money, and is stored under its key like any other result.
const ClosedDestination = "dest_closed"

// Payout statuses.
const (
	StatusPaid   = "paid"
	StatusFailed = "failed"
)

// FailureAccountClosed is the failure code of a payout to ClosedDestination.
const FailureAccountClosed = "account_closed"

// Payout is a payout the provider made, as the API renders it.
type Payout struct {
	ID          string `json:"id"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Destination string `json:"destination"`
	Reference   string `json:"reference"`
	// Status is StatusPaid, or StatusFailed when the destination refused
	// the money (FailureCode says why).
	Status      string `json:"status"`
	FailureCode string `json:"failure_code,omitempty"`
	// Created is the Unix time the payout was made.
	Created int64 `json:"created"`
	// IdempotencyKey is the key of the request that made the payout. The
	// API does not render it.
	IdempotencyKey string `json:"-"`
}

// PayoutParams are the parameters of POST /v1/payouts.
type PayoutParams struct {
	// Amount in minor units (cents), at least 1.
	Amount int64 `json:"amount"`
	// Currency is an upper-case ISO 4217 code.
	Currency    string `json:"currency"`
	Destination string `json:"destination"`
	// Reference is the caller's own, for finding the payout later.
	Reference string `json:"reference,omitempty"`
}

var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

// check validates p as the API does before executing a request, and
// returns the 400 to answer when p is refused.
func (p PayoutParams) check() *fakeapi.Response {
	switch {
	case p.Amount < 1:
		return invalidParam("amount", "amount must be a positive integer number of minor units")
	case !currencyCode.MatchString(p.Currency):
		return invalidParam("currency", "currency must be an upper-case ISO 4217 code such as EUR")
	case p.Destination == "" || len(p.Destination) > 100:
		return invalidParam("destination", "destination must be 1 to 100 characters")
	case len(p.Reference) > 255:
		return invalidParam("reference", "reference must be at most 255 characters")
	}
	return nil
}

// invalidParam is a 400 naming the parameter at fault.
func invalidParam(param, message string) *fakeapi.Response {
	return fakeapi.InvalidParam(param, "parameter_invalid", message)
}

// Config configures a Server: its Logger (see fakeapi.Options). The zero
// value is ready to use.
type Config = fakeapi.Options

// Server is the fake payout provider, an http.Handler that serves the API
// under /v1 and fakeapi's control routes /_faults and /_stats. Its payouts
// and idempotency keys live in Postgres, so several Servers on one database
// behave as one provider; its faults and Stats are its own. It is safe for
// concurrent use.
type Server struct{ *fakeapi.Server }

// Stats counts what a Server has done since New (see fakeapi.Stats); its
// Counts are the payouts made by status: StatusPaid and StatusFailed.
type Stats = fakeapi.Stats

// New returns a Server that keeps its data in db, which must already carry
// Schema (see Migrate). It starts with no faults planned.
func New(db *pgxpool.Pool, cfg Config) *Server {
	s := &Server{fakeapi.New(db, api, cfg)}
	s.Handle("POST /v1/payouts", s.createPayout)
	s.Handle("GET /v1/payouts/{id}", s.retrievePayout)
	return s
}

// api is the payout provider as fakeapi serves it: every payout request
// needs a key, and the payouts made are counted by status. Its name starts
// the server's log messages and the names of its tables.
var api = fakeapi.Config{Name: "payoutprovider", Action: "payout", RequireKey: true,
	Counts: []string{StatusPaid, StatusFailed}, Tables: payoutsTable}

// ControlUsage documents the control routes /_stats and /_faults, for the
// -h of a command that runs a Server.
var ControlUsage = api.ControlUsage()

// createPayout serves POST /v1/payouts: it validates the payout and has
// fakeapi execute it under its Idempotency-Key, so that the payout and its
// stored response commit together.
func (s *Server) createPayout(w http.ResponseWriter, r *http.Request, c fakeapi.Call) {
	var p PayoutParams
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		fakeapi.Write(w, *invalidParam("", "request body is not a valid payout: "+err.Error()))
		return
	}
	if bad := p.check(); bad != nil {
		fakeapi.Write(w, *bad)
		return
	}
	// The struct's encoding fixes the field order, whatever order the
	// client sent; a struct of strings and an int always encodes.
	params, _ := json.Marshal(p)
	var payout Payout
	s.Execute(w, r, c, fakeapi.Execution{
		Params: params,
		Run: func(ctx context.Context, tx pgx.Tx, key string) (fakeapi.Response, error) {
			var err error
			if payout, err = insertPayout(ctx, tx, p, key); err != nil {
				return fakeapi.Response{}, err
			}
			return fakeapi.JSON(http.StatusOK, payout), nil
		},
		Committed: func() {
			s.Count(payout.Status)
		},
	})
}

const payoutColumns = `id, amount, currency, destination, reference, status, failure_code, extract(epoch FROM created_at)::bigint, idempotency_key`

func scanPayout(row pgx.CollectableRow) (Payout, error) {
	var p Payout
	err := row.Scan(&p.ID, &p.Amount, &p.Currency, &p.Destination, &p.Reference, &p.Status, &p.FailureCode, &p.Created, &p.IdempotencyKey)
	return p, err
}

const insertPayoutSQL = `
INSERT INTO payoutprovider_payouts (id, amount, currency, destination, reference, status, failure_code, idempotency_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING ` + payoutColumns

func insertPayout(ctx context.Context, tx pgx.Tx, p PayoutParams, key string) (Payout, error) {
	status, failure := StatusPaid, ""
	if p.Destination == ClosedDestination {
		status, failure = StatusFailed, FailureAccountClosed
	}
	// CollectExactlyOneRow returns Query's error too.
	rows, _ := tx.Query(ctx, insertPayoutSQL,
		fakeapi.NewID("po_"), p.Amount, p.Currency, p.Destination, p.Reference, status, failure, key)
	payout, err := pgx.CollectExactlyOneRow(rows, scanPayout)
	if err != nil {
		return Payout{}, fmt.Errorf("insert payout: %w", err)
	}
	return payout, nil
}

// retrievePayout serves GET /v1/payouts/{id}.
func (s *Server) retrievePayout(w http.ResponseWriter, r *http.Request, c fakeapi.Call) {
	s.Retrieve(w, r, c, "payout", func(ctx context.Context, id string) (any, error) {
		// CollectExactlyOneRow returns Query's error too.
		rows, _ := s.DB().Query(ctx, `SELECT `+payoutColumns+` FROM payoutprovider_payouts WHERE id = $1`, id)
		return pgx.CollectExactlyOneRow(rows, scanPayout)
	})
}

// Querier is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Payouts returns every payout in the database, oldest first, whichever
// Server made it. Reading them in the caller's transaction lets the caller
// compare them with its own tables in one snapshot.
func Payouts(ctx context.Context, q Querier) ([]Payout, error) {
	// CollectRows returns Query's error too.
	rows, _ := q.Query(ctx, `SELECT `+payoutColumns+` FROM payoutprovider_payouts ORDER BY seq`)
	payouts, err := pgx.CollectRows(rows, scanPayout)
	if err != nil {
		return nil, fmt.Errorf("payoutprovider: payouts: %w", err)
	}
	return payouts, nil
}
