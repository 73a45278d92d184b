package ride

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Stripe calls the two Stripe API endpoints the example uses: it creates a
// charge and lists charges. It is plain net/http, so that the request the
// charge phase sends is in plain view: a form-encoded POST /v1/charges
// with the secret key as a Bearer token and the Idempotency-Key header
// that makes Stripe answer a repeated call with the first call's charge
// instead of charging again. The official client, stripe-go, sends the same
// request; examples/rides/README.md shows the charge phase written with it.
//
// It never retries by itself: a charge whose outcome is unknown is repeated
// by the workflow, with the same key.
type Stripe struct {
	baseURL string
	key     string
	hc      *http.Client
}

// NewStripeClient returns a client for the Stripe API at baseURL (Stripe
// itself, https://api.stripe.com, the example's fake Stripe, or
// stripe-mock), authenticating with the secret key, sending its requests
// through hc. A nil hc means a client with DefaultStripeTimeout.
func NewStripeClient(baseURL, key string, hc *http.Client) *Stripe {
	if hc == nil {
		hc = &http.Client{Timeout: DefaultStripeTimeout}
	}
	return &Stripe{baseURL: strings.TrimRight(baseURL, "/"), key: key, hc: hc}
}

// DefaultStripeTimeout bounds a Stripe call made through NewStripeClient's
// default HTTP client: a call that times out has an unknown outcome, and
// the workflow repeats it with the same key.
const DefaultStripeTimeout = 10 * time.Second

// ChargeParams are the parameters of a new charge.
type ChargeParams struct {
	Amount      int64  // in the currency's smallest unit
	Currency    string // ISO code, lower case
	Customer    string
	Description string
	Metadata    map[string]string
}

// Charge is a Stripe charge, as much of it as the example reads.
type Charge struct {
	ID       string            `json:"id"`
	Amount   int64             `json:"amount"`
	Customer string            `json:"customer"`
	Metadata map[string]string `json:"metadata"`
}

// StripeError is an answer from Stripe that carries an error object: a
// decline, a refused request, a key in use.
type StripeError struct {
	HTTPStatusCode int    `json:"-"`
	Type           string `json:"type"`
	Code           string `json:"code"`
	Msg            string `json:"message"`
}

// The error types the workflow tells apart (StripeError.Type).
const (
	// ErrorTypeCard is a declined card: no charge was made.
	ErrorTypeCard = "card_error"
	// ErrorTypeIdempotency is a key already used with other parameters.
	ErrorTypeIdempotency = "idempotency_error"
)

func (e *StripeError) Error() string {
	return fmt.Sprintf("stripe: %d %s: %s", e.HTTPStatusCode, e.Type, e.Msg)
}

// CreateCharge creates a charge, sending idempotencyKey as the
// Idempotency-Key header: a second call with the same key and parameters
// returns the first call's charge, or its error, without charging again.
// An error answer is a *StripeError; any other error (the network, an answer
// that is not Stripe's) leaves the outcome unknown.
func (s *Stripe) CreateCharge(ctx context.Context, p ChargeParams, idempotencyKey string) (Charge, error) {
	form := url.Values{
		"amount":   {strconv.FormatInt(p.Amount, 10)},
		"currency": {p.Currency},
		"customer": {p.Customer},
	}
	if p.Description != "" {
		form.Set("description", p.Description)
	}
	for k, v := range p.Metadata {
		form.Set("metadata["+k+"]", v)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.baseURL+"/v1/charges", strings.NewReader(form.Encode()))
	if err != nil {
		return Charge{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	var ch Charge
	err = s.do(req, &ch)
	return ch, err
}

// Charges returns every charge, newest first, reading the list a page of
// 100 at a time.
func (s *Stripe) Charges(ctx context.Context) ([]Charge, error) {
	var all []Charge
	query := url.Values{"limit": {"100"}}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.baseURL+"/v1/charges?"+query.Encode(), nil)
		if err != nil {
			return nil, err
		}
		var page struct {
			Data    []Charge `json:"data"`
			HasMore bool     `json:"has_more"`
		}
		if err := s.do(req, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Data...)
		if !page.HasMore || len(page.Data) == 0 {
			return all, nil
		}
		query.Set("starting_after", page.Data[len(page.Data)-1].ID)
	}
}

// do sends req with the secret key and decodes a 2xx answer into out, or
// returns the error the answer carries.
func (s *Stripe) do(req *http.Request, out any) error {
	req.Header.Set("Authorization", "Bearer "+s.key)
	res, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	// A connection that drops mid-answer fails here: the request may have
	// been carried out.
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return fmt.Errorf("stripe: read the answer to %s %s: %w", req.Method, req.URL.Path, err)
	}
	if res.StatusCode/100 == 2 {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("stripe: decode the answer to %s %s: %w", req.Method, req.URL.Path, err)
		}
		return nil
	}
	var e struct {
		Error *StripeError `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error == nil {
		// Not Stripe's answer (a proxy's, say): no proof of anything.
		return fmt.Errorf("stripe: %s %s answered %s without a Stripe error object", req.Method, req.URL.Path, res.Status)
	}
	e.Error.HTTPStatusCode = res.StatusCode
	return e.Error
}
