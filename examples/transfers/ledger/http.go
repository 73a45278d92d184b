package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/phase"
)

// maxAmount caps one transfer, far below what int64 minor units can hold,
// so that sums of many transfers cannot overflow.
const maxAmount = 1_000_000_000_000

// Handler serves the ledger's API:
//
//	POST /transfers   run a Transfer under the request's Idempotency-Key
//	GET  /accounts    the caller's accounts
//
// The caller is the account owner named by "Authorization: Bearer <owner>";
// idempotency keys belong to their owner. POST /transfers answers 201 with a
// Receipt when the transfer settled, or a Problem: 404 or 422 when the
// ledger refused it (stored and replayed like a success, see the Problem
// types), 400 or 422 for a request that is not a valid transfer (not
// stored: fix it and send it again), and the atomicphase handler's answers
// for the rest (409 while the key is in flight, 5xx when the request
// stopped part-way and a retry with the same key resumes it). Every other
// error is a problem+json too: 401 and 500 from GET /accounts, 405 for
// another method on either path, 404 for any other path. transfers must be
// registered with c; the accounts are read from db.
func Handler(db *pgxpool.Pool, c *phase.Client, transfers *phase.Workflow[Transfer, State]) (http.Handler, error) {
	post, err := phase.Handler(c, transfers, phase.HTTPConfig[Transfer]{Tenant: owner, Decode: decodeTransfer})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", post)
	mux.HandleFunc("GET /accounts", func(w http.ResponseWriter, r *http.Request) {
		who, err := owner(r)
		if err != nil {
			phase.WriteProblem(w, http.StatusUnauthorized, "unauthorized", "Unauthorized", err.Error(), 0)
			return
		}
		accounts, err := Accounts(r.Context(), db, who)
		if err != nil {
			phase.WriteProblem(w, http.StatusInternalServerError, "internal-error", "Internal server error",
				"could not read the accounts; retry later", 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(accounts)
	})
	// The patterns without a method catch the methods the ones above do
	// not serve, which ServeMux would answer in text/plain.
	mux.HandleFunc("/transfers", onlyMethod(http.MethodPost))
	mux.HandleFunc("/accounts", onlyMethod(http.MethodGet+", "+http.MethodHead))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		phase.WriteProblem(w, http.StatusNotFound, "not-found", "Not found",
			fmt.Sprintf("there is no %s; the API is POST /transfers and GET /accounts", r.URL.Path), 0)
	})
	return mux, nil
}

// onlyMethod answers 405 naming the methods a path allows.
func onlyMethod(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		phase.WriteProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed",
			fmt.Sprintf("%s %s is not served; use %s", r.Method, r.URL.Path, allow), 0)
	}
}

// owner returns the account owner a request authenticates as. A real
// service would verify a token here; the example trusts the name.
func owner(r *http.Request) (string, error) {
	who, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	who = strings.TrimSpace(who)
	if !ok || who == "" || len(who) > 255 {
		return "", errors.New(`send the account owner's name as "Authorization: Bearer NAME"`)
	}
	return who, nil
}

// decodeTransfer reads a Transfer and refuses, before anything is stored,
// one that could never be carried out.
func decodeTransfer(r *http.Request) (Transfer, error) {
	t, err := phase.DecodeJSON[Transfer](r)
	if err != nil {
		return t, err
	}
	t.Currency = strings.ToUpper(t.Currency)
	switch {
	case t.FromAccount <= 0:
		return t, phase.Invalid("from_account", "the id of the account to take the money from is required")
	case t.Amount <= 0 || t.Amount > maxAmount:
		return t, phase.Invalid("amount", "amount must be a whole number of minor units between 1 and 10^12")
	case !currencyCode.MatchString(t.Currency):
		return t, phase.Invalid("currency", "currency must be an ISO 4217 code such as EUR")
	case (t.ToAccount == 0) == (t.PayoutDestination == ""):
		return t, phase.Invalid("to_account", "give either to_account (a transfer inside the ledger) or payout_destination (a payout out of it), not both")
	case t.ToAccount < 0:
		return t, phase.Invalid("to_account", "to_account must be an account id")
	case t.ToAccount == t.FromAccount:
		return t, phase.Invalid("to_account", "to_account must differ from from_account")
	case len(t.PayoutDestination) > 100:
		return t, phase.Invalid("payout_destination", "payout_destination must be at most 100 characters")
	}
	return t, nil
}
