package fakestripe_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stripe/stripe-go/v85"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
)

func TestCreateChargeReturnsSucceededCharge(t *testing.T) {
	t.Parallel()
	f := setup(t)

	ch, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ch.ID, "ch_") || ch.Amount != 2000 || ch.Currency != "usd" ||
		ch.Customer == nil || ch.Customer.ID != "cus_rider" || ch.Description != "Charge for ride 123" ||
		ch.Metadata["ride_id"] != "123" || ch.Status != stripe.ChargeStatusSucceeded || !ch.Paid || !ch.Captured ||
		ch.Created == 0 {
		t.Errorf("charge = %+v", ch)
	}
	if got := ch.LastResponse.Header.Get("Idempotent-Replayed"); got != "" {
		t.Errorf("first response has Idempotent-Replayed %q", got)
	}

	charges := f.charges(t)
	if len(charges) != 1 {
		t.Fatalf("stored %d charges, want 1", len(charges))
	}
	if c := charges[0]; c.ID != ch.ID || c.IdempotencyKey != "ride-123" || c.Metadata["ride_id"] != "123" || c.Amount != 2000 {
		t.Errorf("stored charge = %+v", c)
	}
}

func TestCreateChargeRejectsInvalidParams(t *testing.T) {
	t.Parallel()
	f := setup(t)

	tests := []struct {
		name      string
		change    func(*stripe.ChargeCreateParams)
		wantParam string
		wantCode  stripe.ErrorCode
	}{
		{"missing amount", func(p *stripe.ChargeCreateParams) { p.Amount = nil }, "amount", stripe.ErrorCodeParameterMissing},
		{"zero amount", func(p *stripe.ChargeCreateParams) { p.Amount = stripe.Int64(0) }, "amount", stripe.ErrorCodeAmountTooSmall},
		{"huge amount", func(p *stripe.ChargeCreateParams) { p.Amount = stripe.Int64(100_000_000) }, "amount", stripe.ErrorCodeAmountTooLarge},
		{"missing currency", func(p *stripe.ChargeCreateParams) { p.Currency = nil }, "currency", stripe.ErrorCodeParameterMissing},
		{"bad currency", func(p *stripe.ChargeCreateParams) { p.Currency = stripe.String("dollars") }, "currency", ""},
		{"missing customer", func(p *stripe.ChargeCreateParams) { p.Customer = nil }, "", stripe.ErrorCodeParameterMissing},
		{"unknown customer", func(p *stripe.ChargeCreateParams) { p.Customer = stripe.String("rider") }, "customer", stripe.ErrorCodeResourceMissing},
		{"unknown param", func(p *stripe.ChargeCreateParams) { p.Capture = stripe.Bool(false) }, "capture", stripe.ErrorCodeParameterUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := rideCharge("", "cus_rider")
			tt.change(p)
			_, err := f.stripe.V1Charges.Create(t.Context(), p)
			se := stripeError(t, err)
			if se.HTTPStatusCode != http.StatusBadRequest || se.Type != stripe.ErrorTypeInvalidRequest ||
				se.Param != tt.wantParam || se.Code != tt.wantCode {
				t.Errorf("error = %d %s %s param %q: %s", se.HTTPStatusCode, se.Type, se.Code, se.Param, se.Msg)
			}
		})
	}
	if n := len(f.charges(t)); n != 0 {
		t.Errorf("stored %d charges, want 0", n)
	}
}

func TestDeclineCustomerIsDeclinedWithoutCharge(t *testing.T) {
	t.Parallel()
	f := setup(t)

	_, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("", fakestripe.DeclineCustomer))
	se := stripeError(t, err)
	if se.HTTPStatusCode != http.StatusPaymentRequired || se.Type != stripe.ErrorTypeCard ||
		se.Code != stripe.ErrorCodeCardDeclined || se.DeclineCode != stripe.DeclineCodeGenericDecline ||
		se.Msg != "Your card was declined." {
		t.Errorf("error = %d %s %s %s: %s", se.HTTPStatusCode, se.Type, se.Code, se.DeclineCode, se.Msg)
	}
	if n := len(f.charges(t)); n != 0 {
		t.Errorf("stored %d charges, want 0", n)
	}
	if got := f.server.Stats().Counts["declined"]; got != 1 {
		t.Errorf("Stats().Declined = %d, want 1", got)
	}
}

func TestRetrieveCharge(t *testing.T) {
	t.Parallel()
	f := setup(t)

	created, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.stripe.V1Charges.Retrieve(t.Context(), created.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.LastResponse.RawJSON) != string(created.LastResponse.RawJSON) {
		t.Errorf("retrieved\n%s\nwant the created charge\n%s", got.LastResponse.RawJSON, created.LastResponse.RawJSON)
	}

	_, err = f.stripe.V1Charges.Retrieve(t.Context(), "ch_missing", nil)
	se := stripeError(t, err)
	if se.HTTPStatusCode != http.StatusNotFound || se.Code != stripe.ErrorCodeResourceMissing || se.Param != "id" {
		t.Errorf("error = %d %s param %q", se.HTTPStatusCode, se.Code, se.Param)
	}
}

func TestListChargesPagesNewestFirst(t *testing.T) {
	t.Parallel()
	f := setup(t)

	var alice []string // newest first
	for i, customer := range []string{"cus_alice", "cus_bob", "cus_alice", "cus_alice", "cus_bob", "cus_alice", "cus_alice"} {
		ch, err := f.stripe.V1Charges.Create(t.Context(), rideCharge(fmt.Sprint("ride-", i), customer))
		if err != nil {
			t.Fatal(err)
		}
		if customer == "cus_alice" {
			alice = slices.Insert(alice, 0, ch.ID)
		}
	}

	page := f.stripe.V1Charges.List(t.Context(), &stripe.ChargeListParams{
		Customer:   stripe.String("cus_alice"),
		ListParams: stripe.ListParams{Limit: stripe.Int64(2), Single: true},
	})
	if err := page.Err(); err != nil {
		t.Fatal(err)
	}
	if got := ids(page.Data()); !slices.Equal(got, alice[:2]) || !page.Meta().HasMore {
		t.Errorf("first page = %v has_more %v, want %v has_more true", got, page.Meta().HasMore, alice[:2])
	}

	// stripe-go follows has_more with starting_after set to the last ID.
	var all []*stripe.Charge
	for ch, err := range f.stripe.V1Charges.List(t.Context(), &stripe.ChargeListParams{
		Customer:   stripe.String("cus_alice"),
		ListParams: stripe.ListParams{Limit: stripe.Int64(2)},
	}).All(t.Context()) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ch)
	}
	if got := ids(all); !slices.Equal(got, alice) {
		t.Errorf("all pages = %v, want %v", got, alice)
	}

	everyone := f.stripe.V1Charges.List(t.Context(), &stripe.ChargeListParams{ListParams: stripe.ListParams{Single: true}})
	if n := len(everyone.Data()); n != 7 || everyone.Meta().HasMore {
		t.Errorf("unfiltered default page has %d charges, has_more %v; want 7, false", n, everyone.Meta().HasMore)
	}

	for _, params := range []*stripe.ChargeListParams{
		{ListParams: stripe.ListParams{StartingAfter: stripe.String("ch_missing")}},
		{ListParams: stripe.ListParams{Limit: stripe.Int64(101)}},
	} {
		params.Single = true
		list := f.stripe.V1Charges.List(t.Context(), params)
		if se := stripeError(t, list.Err()); se.HTTPStatusCode != http.StatusBadRequest {
			t.Errorf("list error status = %d, want 400", se.HTTPStatusCode)
		}
	}
}

func ids(charges []*stripe.Charge) []string {
	var ids []string
	for _, ch := range charges {
		ids = append(ids, ch.ID)
	}
	return ids
}

func TestRequestsWithoutTestKeyGet401(t *testing.T) {
	t.Parallel()
	f := setup(t)

	res, body := f.do(t, http.MethodPost, "/v1/charges", "amount=2000&currency=usd&customer=cus_rider",
		http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, `"type": "invalid_request_error"`) {
		t.Errorf("without a key: %d %s", res.StatusCode, body)
	}

	_, err := f.client("sk_live_rides", 0).V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if se := stripeError(t, err); se.HTTPStatusCode != http.StatusUnauthorized {
		t.Errorf("live key: status %d, want 401", se.HTTPStatusCode)
	}

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.url+"/v1/charges", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(testKey, "")
	basic, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	basic.Body.Close()
	if basic.StatusCode != http.StatusOK {
		t.Errorf("Basic auth with a test key: status %d, want 200", basic.StatusCode)
	}

	if n := len(f.charges(t)); n != 0 {
		t.Errorf("stored %d charges, want 0", n)
	}
}

func TestUnrecognizedURLGets404(t *testing.T) {
	t.Parallel()
	f := setup(t)

	res, body := f.do(t, http.MethodDelete, "/v1/charges/ch_1", "", nil)
	if res.StatusCode != http.StatusNotFound || !strings.Contains(body, "Unrecognized request URL (DELETE: /v1/charges/ch_1)") {
		t.Errorf("%d %s", res.StatusCode, body)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	f := setup(t)

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = fakestripe.Migrate(t.Context(), f.pool) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}
