package fakestripe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// DeclineCustomer is the customer whose card is always declined: a charge
// for it is answered with 402 card_error card_declined (decline code
// generic_decline) and creates nothing, and the answer is stored under the
// request's idempotency key like a success.
const DeclineCustomer = "cus_declined"

// maxAmount is Stripe's largest charge amount: eight digits.
const maxAmount = 99_999_999

// Charge is a charge the server created.
type Charge struct {
	ID          string
	Amount      int64
	Currency    string
	Customer    string
	Description string
	Metadata    map[string]string
	// IdempotencyKey is the Idempotency-Key of the request that created the
	// charge, or empty if it carried none.
	IdempotencyKey string
	Created        time.Time
}

// chargeObject is a Charge as the API renders it. The constant fields
// describe a charge captured in full at creation, the only kind this server
// makes.
type chargeObject struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountCaptured int64             `json:"amount_captured"`
	AmountRefunded int64             `json:"amount_refunded"`
	Captured       bool              `json:"captured"`
	Created        int64             `json:"created"`
	Currency       string            `json:"currency"`
	Customer       string            `json:"customer"`
	Description    *string           `json:"description"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Paid           bool              `json:"paid"`
	Refunded       bool              `json:"refunded"`
	Status         string            `json:"status"`
}

func (c Charge) object() chargeObject {
	o := chargeObject{
		ID:             c.ID,
		Object:         "charge",
		Amount:         c.Amount,
		AmountCaptured: c.Amount,
		Captured:       true,
		Created:        c.Created.Unix(),
		Currency:       c.Currency,
		Customer:       c.Customer,
		Metadata:       c.Metadata,
		Paid:           true,
		Status:         "succeeded",
	}
	if c.Description != "" {
		o.Description = &c.Description
	}
	if o.Metadata == nil {
		o.Metadata = map[string]string{}
	}
	return o
}

const chargeColumns = `id, amount, currency, customer, description, metadata, idempotency_key, created_at`

func scanCharge(row pgx.CollectableRow) (Charge, error) {
	var c Charge
	err := row.Scan(&c.ID, &c.Amount, &c.Currency, &c.Customer, &c.Description, &c.Metadata, &c.IdempotencyKey, &c.Created)
	return c, err
}

// Charges returns every charge in the database, oldest first, whichever
// Server created it.
func (s *Server) Charges(ctx context.Context) ([]Charge, error) {
	// CollectRows returns Query's error too.
	rows, _ := s.DB().Query(ctx, `SELECT `+chargeColumns+` FROM fakestripe_charges ORDER BY seq`)
	charges, err := pgx.CollectRows(rows, scanCharge)
	if err != nil {
		return nil, fmt.Errorf("fakestripe: charges: %w", err)
	}
	return charges, nil
}

// chargeParams are the parameters of POST /v1/charges.
type chargeParams struct {
	amount      int64
	currency    string
	customer    string
	description string
	metadata    map[string]string
}

// parseChargeParams validates form as Stripe validates a charge before
// executing it. A rejection is returned as the 400 to answer.
func parseChargeParams(form url.Values) (chargeParams, *fakeapi.Response) {
	var p chargeParams
	if bad := unknownParam(form, func(name string) bool {
		_, isMetadata := metadataKey(name)
		return isMetadata || name == "amount" || name == "currency" || name == "customer" || name == "description"
	}); bad != nil {
		return p, bad
	}

	if !form.Has("amount") {
		return p, fakeapi.InvalidParam("amount", "parameter_missing", "Missing required param: amount.")
	}
	amount, err := strconv.ParseInt(form.Get("amount"), 10, 64)
	switch {
	case err != nil:
		return p, fakeapi.InvalidParam("amount", "parameter_invalid_integer", "Invalid integer: "+form.Get("amount"))
	case amount < 1:
		return p, fakeapi.InvalidParam("amount", "amount_too_small", "Amount must be at least 1.")
	case amount > maxAmount:
		return p, fakeapi.InvalidParam("amount", "amount_too_large", fmt.Sprintf("Amount must be no more than %d.", maxAmount))
	}
	p.amount = amount

	if !form.Has("currency") {
		return p, fakeapi.InvalidParam("currency", "parameter_missing", "Missing required param: currency.")
	}
	p.currency = strings.ToLower(form.Get("currency"))
	if len(p.currency) != 3 || strings.Trim(p.currency, "abcdefghijklmnopqrstuvwxyz") != "" {
		return p, fakeapi.InvalidParam("currency", "", "Invalid currency: "+form.Get("currency")+".")
	}

	// Stripe also charges a card source directly; this server knows only
	// customers, so a charge without one cannot be made.
	p.customer = form.Get("customer")
	if p.customer == "" {
		return p, fakeapi.InvalidParam("", "parameter_missing", "Must provide source or customer.")
	}
	if !strings.HasPrefix(p.customer, "cus_") {
		return p, fakeapi.InvalidParam("customer", "resource_missing", fmt.Sprintf("No such customer: '%s'", p.customer))
	}

	p.description = form.Get("description")
	for name, values := range form {
		key, ok := metadataKey(name)
		// An empty value unsets a key in Stripe, which on creation means
		// leaving it out.
		if !ok || values[0] == "" {
			continue
		}
		if p.metadata == nil {
			p.metadata = map[string]string{}
		}
		p.metadata[key] = values[0]
	}
	return p, nil
}

// metadataKey returns the key of a metadata[key] form parameter.
func metadataKey(name string) (string, bool) {
	key, ok := strings.CutPrefix(name, "metadata[")
	if !ok {
		return "", false
	}
	key, ok = strings.CutSuffix(key, "]")
	return key, ok && key != ""
}

// declined is the answer to every charge for DeclineCustomer.
var declined = fakeapi.ErrorResponse(http.StatusPaymentRequired, fakeapi.Error{
	Type:        "card_error",
	Code:        "card_declined",
	DeclineCode: "generic_decline",
	Message:     "Your card was declined.",
})

// createCharge serves POST /v1/charges: it validates the charge and has
// fakeapi execute it under its Idempotency-Key, so that the charge and its
// stored response commit together.
func (s *Server) createCharge(w http.ResponseWriter, r *http.Request, c fakeapi.Call) {
	if err := r.ParseForm(); err != nil {
		fakeapi.Write(w, *fakeapi.InvalidParam("", "", "Invalid request body: "+err.Error()))
		return
	}
	p, bad := parseChargeParams(r.PostForm)
	if bad != nil {
		fakeapi.Write(w, *bad)
		return
	}
	isDeclined := p.customer == DeclineCustomer
	s.Execute(w, r, c, fakeapi.Execution{
		// The canonical encoding sorts names.
		Params: []byte(r.PostForm.Encode()),
		Run: func(ctx context.Context, tx pgx.Tx, key string) (fakeapi.Response, error) {
			if isDeclined {
				return declined, nil
			}
			charge, err := insertCharge(ctx, tx, p, key)
			if err != nil {
				return fakeapi.Response{}, err
			}
			return fakeapi.JSON(http.StatusOK, charge.object()), nil
		},
		Committed: func() {
			if isDeclined {
				s.Count(countDeclined)
			} else {
				s.Count(countCharges)
			}
		},
	})
}

const insertChargeSQL = `
INSERT INTO fakestripe_charges (id, amount, currency, customer, description, metadata, idempotency_key)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING ` + chargeColumns

func insertCharge(ctx context.Context, tx pgx.Tx, p chargeParams, key string) (Charge, error) {
	metadata := p.metadata
	if metadata == nil {
		metadata = map[string]string{}
	}
	// CollectExactlyOneRow returns Query's error too.
	rows, _ := tx.Query(ctx, insertChargeSQL,
		fakeapi.NewID("ch_"), p.amount, p.currency, p.customer, p.description, metadata, key)
	charge, err := pgx.CollectExactlyOneRow(rows, scanCharge)
	if err != nil {
		return Charge{}, fmt.Errorf("insert charge: %w", err)
	}
	return charge, nil
}

// retrieveCharge serves GET /v1/charges/{id}.
func (s *Server) retrieveCharge(w http.ResponseWriter, r *http.Request, c fakeapi.Call) {
	if bad := unknownParam(r.URL.Query(), func(string) bool { return false }); bad != nil {
		fakeapi.Write(w, *bad)
		return
	}
	s.Retrieve(w, r, c, "charge", func(ctx context.Context, id string) (any, error) {
		// CollectExactlyOneRow returns Query's error too.
		rows, _ := s.DB().Query(ctx, `SELECT `+chargeColumns+` FROM fakestripe_charges WHERE id = $1`, id)
		charge, err := pgx.CollectExactlyOneRow(rows, scanCharge)
		return charge.object(), err
	})
}

// List limits, as on Stripe.
const (
	defaultListLimit = 10
	maxListLimit     = 100
)

// listChargesSQL pages through charges newest first. Charges are never
// deleted or reordered, so a cursor's seq stays a stable position.
const listChargesSQL = `
SELECT ` + chargeColumns + ` FROM fakestripe_charges
WHERE ($1 = '' OR customer = $1)
  AND ($2::bigint IS NULL OR seq < $2)
ORDER BY seq DESC
LIMIT $3`

// listCharges serves GET /v1/charges with the parameters customer, limit
// and starting_after.
func (s *Server) listCharges(w http.ResponseWriter, r *http.Request, c fakeapi.Call) {
	ctx := r.Context()
	query := r.URL.Query()
	if bad := unknownParam(query, func(name string) bool {
		return name == "customer" || name == "limit" || name == "starting_after"
	}); bad != nil {
		fakeapi.Write(w, *bad)
		return
	}
	limit := int64(defaultListLimit)
	if query.Has("limit") {
		var err error
		limit, err = strconv.ParseInt(query.Get("limit"), 10, 64)
		var bad *fakeapi.Response
		switch {
		case err != nil:
			bad = fakeapi.InvalidParam("limit", "parameter_invalid_integer", "Invalid integer: "+query.Get("limit"))
		case limit < 1:
			bad = fakeapi.InvalidParam("limit", "parameter_invalid_integer", "This value must be greater than or equal to 1.")
		case limit > maxListLimit:
			bad = fakeapi.InvalidParam("limit", "parameter_invalid_integer", fmt.Sprintf("This value must be less than or equal to %d.", maxListLimit))
		}
		if bad != nil {
			fakeapi.Write(w, *bad)
			return
		}
	}
	if err := s.Delay(ctx); err != nil {
		return
	}

	var after *int64
	if id := query.Get("starting_after"); id != "" {
		err := s.DB().QueryRow(ctx, `SELECT seq FROM fakestripe_charges WHERE id = $1`, id).Scan(&after)
		if errors.Is(err, pgx.ErrNoRows) {
			fakeapi.Write(w, *fakeapi.InvalidParam("starting_after", "resource_missing", fmt.Sprintf("No such charge: '%s'", id)))
			return
		}
		if err != nil {
			s.Fail(w, c, err)
			return
		}
	}
	// One row past the page tells whether there is another.
	rows, err := s.DB().Query(ctx, listChargesSQL, query.Get("customer"), after, limit+1)
	if err != nil {
		s.Fail(w, c, err)
		return
	}
	charges, err := pgx.CollectRows(rows, scanCharge)
	if err != nil {
		s.Fail(w, c, err)
		return
	}
	page := struct {
		Object  string         `json:"object"`
		Data    []chargeObject `json:"data"`
		HasMore bool           `json:"has_more"`
		URL     string         `json:"url"`
	}{Object: "list", Data: []chargeObject{}, URL: "/v1/charges"}
	for i, charge := range charges {
		if int64(i) == limit {
			page.HasMore = true
			break
		}
		page.Data = append(page.Data, charge.object())
	}
	fakeapi.Write(w, fakeapi.JSON(http.StatusOK, page))
}
