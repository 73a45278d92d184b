package payoutprovider

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// maxBodyBytes caps a request body.
const maxBodyBytes = 64 << 10

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
func (p PayoutParams) check() *response {
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

// Config configures a Server. The zero value is ready to use.
type Config struct {
	// Logger receives a record for every injected fault and every failed
	// database operation. Nil means slog.Default().
	Logger *slog.Logger
}

// Server is the fake payout provider, an http.Handler. Its payouts and
// idempotency keys live in Postgres, so several Servers on one database
// behave as one provider; its faults and Stats are its own. It is safe for
// concurrent use.
type Server struct {
	db     *pgxpool.Pool
	logger *slog.Logger
	mux    *http.ServeMux
	faults faultPlan
	stats  counters
}

// New returns a Server that keeps its data in db, which must already carry
// Schema (see Migrate). It starts with no faults planned.
func New(db *pgxpool.Pool, cfg Config) *Server {
	s := &Server{db: db, logger: cfg.Logger}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/payouts", s.createPayout)
	s.mux.HandleFunc("GET /v1/payouts/{id}", s.retrievePayout)
	s.mux.HandleFunc("GET /_faults", s.getFaults)
	s.mux.HandleFunc("POST /_faults", s.postFaults)
	s.mux.HandleFunc("GET /_stats", s.getStats)
	return s
}

// ServeHTTP answers the API under /v1 and the control routes /_faults and
// /_stats.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// createPayout serves POST /v1/payouts. It runs in one transaction that
// holds the key's lock, finds no stored result for it, makes the payout and
// stores the response: a crash at any point leaves both the payout and its
// stored response, or neither.
func (s *Server) createPayout(w http.ResponseWriter, r *http.Request) {
	s.stats.requests.Add(1)
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 255 {
		writeResponse(w, *invalidParam("", "every payout request needs an Idempotency-Key header of 1 to 255 characters"))
		return
	}
	var p PayoutParams
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		writeResponse(w, *invalidParam("", "request body is not a valid payout: "+err.Error()))
		return
	}
	if bad := p.check(); bad != nil {
		writeResponse(w, *bad)
		return
	}
	fp := fingerprint(p)
	log := s.logger.With(slog.String("key", key))

	tx, err := s.db.Begin(ctx)
	if err != nil {
		s.fail(w, log, err)
		return
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	held, err := lockKey(ctx, tx, key)
	if err != nil {
		s.fail(w, log, err)
		return
	}
	if !held {
		s.stats.conflicts.Add(1)
		writeResponse(w, errorResponse(http.StatusConflict, apiError{Type: "idempotency_error", Code: "idempotency_key_in_use",
			Message: "another request with this Idempotency-Key is executing; retry later"}))
		return
	}
	// The delay is spent holding the key, as a slow provider would, so that
	// concurrent requests with the key meet the 409.
	if err := sleep(ctx, s.faults.delay()); err != nil {
		return // the client has gone; nothing was executed or stored
	}
	stored, err := loadResult(ctx, tx, key)
	if err != nil {
		s.fail(w, log, err)
		return
	}
	if stored != nil {
		if !stored.matches(fp) {
			writeResponse(w, errorResponse(http.StatusBadRequest, apiError{Type: "idempotency_error",
				Message: "this Idempotency-Key was used with other parameters; use a new key for a new payout"}))
			return
		}
		s.stats.replays.Add(1)
		w.Header().Set("Idempotent-Replayed", "true")
		writeResponse(w, stored.response)
		return
	}

	f := s.faults.draw()
	if f == failBeforePayout {
		s.stats.faults.Add(1)
		log.Info("payoutprovider: injected failure before payout")
		writeResponse(w, serverError)
		return
	}
	payout, err := insertPayout(ctx, tx, p, key)
	if err != nil {
		s.fail(w, log, err)
		return
	}
	res := jsonResponse(http.StatusOK, payout)
	if err := storeResult(ctx, tx, key, result{fingerprint: fp, response: res}); err != nil {
		s.fail(w, log, err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		s.fail(w, log, err)
		return
	}
	if payout.Status == StatusPaid {
		s.stats.paid.Add(1)
	} else {
		s.stats.failed.Add(1)
	}
	if f == dropAfterPayout {
		s.stats.faults.Add(1)
		log.Info("payoutprovider: injected connection drop after payout", slog.String("payout", payout.ID))
		drop(w)
		return
	}
	writeResponse(w, res)
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
	rows, err := tx.Query(ctx, insertPayoutSQL,
		"po_"+rand.Text(), p.Amount, p.Currency, p.Destination, p.Reference, status, failure, key)
	if err != nil {
		return Payout{}, fmt.Errorf("insert payout: %w", err)
	}
	payout, err := pgx.CollectExactlyOneRow(rows, scanPayout)
	if err != nil {
		return Payout{}, fmt.Errorf("insert payout: %w", err)
	}
	return payout, nil
}

// retrievePayout serves GET /v1/payouts/{id}.
func (s *Server) retrievePayout(w http.ResponseWriter, r *http.Request) {
	s.stats.requests.Add(1)
	ctx := r.Context()
	if err := sleep(ctx, s.faults.delay()); err != nil {
		return
	}
	rows, err := s.db.Query(ctx, `SELECT `+payoutColumns+` FROM payoutprovider_payouts WHERE id = $1`, r.PathValue("id"))
	if err != nil {
		s.fail(w, s.logger, err)
		return
	}
	payout, err := pgx.CollectExactlyOneRow(rows, scanPayout)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		writeResponse(w, errorResponse(http.StatusNotFound, apiError{Type: "invalid_request_error", Code: "resource_missing",
			Message: fmt.Sprintf("no such payout: %q", r.PathValue("id"))}))
	case err != nil:
		s.fail(w, s.logger, err)
	default:
		writeResponse(w, jsonResponse(http.StatusOK, payout))
	}
}

// Querier is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Payouts returns every payout in the database, oldest first, whichever
// Server made it. Reading them in the caller's transaction lets the caller
// compare them with its own tables in one snapshot.
func Payouts(ctx context.Context, q Querier) ([]Payout, error) {
	rows, err := q.Query(ctx, `SELECT `+payoutColumns+` FROM payoutprovider_payouts ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("payoutprovider: payouts: %w", err)
	}
	payouts, err := pgx.CollectRows(rows, scanPayout)
	if err != nil {
		return nil, fmt.Errorf("payoutprovider: payouts: %w", err)
	}
	return payouts, nil
}

// fail answers 500 for a failure of the server itself. Its transaction
// rolls back, so nothing it did is kept, and a retry with the same key
// executes afresh.
func (s *Server) fail(w http.ResponseWriter, log *slog.Logger, err error) {
	if errors.Is(err, context.Canceled) {
		return // the client has gone and will not read an answer
	}
	log.Error("payoutprovider: request failed", slog.Any("error", err))
	writeResponse(w, serverError)
}

// response is a status and JSON body: what an executed request answers, and
// what its idempotency key stores for replay.
type response struct {
	status int
	body   []byte
}

// apiError is the "error" object of the API's error responses.
type apiError struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
}

func errorResponse(status int, e apiError) response {
	return jsonResponse(status, struct {
		Error apiError `json:"error"`
	}{e})
}

// serverError is the answer to a failure of the server itself.
var serverError = errorResponse(http.StatusInternalServerError, apiError{Type: "api_error", Message: "an unknown error occurred"})

func invalidParam(param, message string) *response {
	res := errorResponse(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "parameter_invalid", Message: message, Param: param})
	return &res
}

// jsonResponse renders v, indented with two spaces. The types passed here
// always marshal.
func jsonResponse(status int, v any) response {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("payoutprovider: marshal %T: %v", v, err))
	}
	return response{status: status, body: append(body, '\n')}
}

func writeResponse(w http.ResponseWriter, res response) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(res.status)
	_, _ = w.Write(res.body)
}

// sleep waits for d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// counters back Stats.
type counters struct {
	requests, paid, failed, replays, conflicts, faults atomic.Int64
}

// Stats counts what a Server has done since New. They are the Server's own,
// not the database's: a second Server on the same database counts separately.
type Stats struct {
	// Requests is every API request received, rejected ones included.
	Requests int64 `json:"requests"`
	// Paid is the payouts made with status paid.
	Paid int64 `json:"paid"`
	// Failed is the payouts made with status failed.
	Failed int64 `json:"failed"`
	// Replays is the requests answered from a stored result.
	Replays int64 `json:"replays"`
	// Conflicts is the requests refused with 409 because another request
	// with their key was executing.
	Conflicts int64 `json:"conflicts"`
	// FaultsInjected is the payout requests failed or dropped on purpose.
	FaultsInjected int64 `json:"faults_injected"`
}

// Stats returns the Server's counts so far.
func (s *Server) Stats() Stats {
	return Stats{
		Requests:       s.stats.requests.Load(),
		Paid:           s.stats.paid.Load(),
		Failed:         s.stats.failed.Load(),
		Replays:        s.stats.replays.Load(),
		Conflicts:      s.stats.conflicts.Load(),
		FaultsInjected: s.stats.faults.Load(),
	}
}

func (s *Server) getStats(w http.ResponseWriter, _ *http.Request) {
	writeResponse(w, jsonResponse(http.StatusOK, s.Stats()))
}

// drop closes the client's connection without an answer, as a network
// failure after the payout would.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 connections cannot be hijacked; aborting the handler
		// resets the stream, which the client sees the same way.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}
