package fakestripe_test

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v85"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
)

func TestSameKeyReplaysTheSameBytes(t *testing.T) {
	t.Parallel()
	f := setup(t)

	first, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}

	if second.ID != first.ID {
		t.Errorf("replayed charge %s, want %s", second.ID, first.ID)
	}
	if !bytes.Equal(second.LastResponse.RawJSON, first.LastResponse.RawJSON) {
		t.Errorf("replayed body\n%s\nwant\n%s", second.LastResponse.RawJSON, first.LastResponse.RawJSON)
	}
	h := second.LastResponse.Header
	if h.Get("Idempotent-Replayed") != "true" || h.Get("Original-Request") != first.LastResponse.RequestID ||
		h.Get("Idempotency-Key") != "ride-123" {
		t.Errorf("replay headers: Idempotent-Replayed %q, Original-Request %q (want %q), Idempotency-Key %q",
			h.Get("Idempotent-Replayed"), h.Get("Original-Request"), first.LastResponse.RequestID, h.Get("Idempotency-Key"))
	}

	// The same parameters in another order are the same request.
	res, body := f.do(t, http.MethodPost, "/v1/charges",
		"metadata[ride_id]=123&description=Charge+for+ride+123&customer=cus_rider&currency=usd&amount=2000",
		http.Header{
			"Authorization":   {"Bearer " + testKey},
			"Content-Type":    {"application/x-www-form-urlencoded"},
			"Idempotency-Key": {"ride-123"},
		})
	if res.Header.Get("Idempotent-Replayed") != "true" || body != string(first.LastResponse.RawJSON) {
		t.Errorf("reordered parameters: %d Idempotent-Replayed %q\n%s", res.StatusCode, res.Header.Get("Idempotent-Replayed"), body)
	}

	if n := len(f.charges(t)); n != 1 {
		t.Errorf("stored %d charges, want 1", n)
	}
	if s := f.server.Stats(); s.Counts["charges"] != 1 || s.Replays != 2 {
		t.Errorf("stats = %+v, want 1 charge and 2 replays", s)
	}
}

func TestSameKeyOtherParamsIsIdempotencyError(t *testing.T) {
	t.Parallel()
	f := setup(t)

	if _, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider")); err != nil {
		t.Fatal(err)
	}
	other := rideCharge("ride-123", "cus_rider")
	other.Amount = stripe.Int64(3000)
	_, err := f.stripe.V1Charges.Create(t.Context(), other)
	se := stripeError(t, err)
	if se.HTTPStatusCode != http.StatusBadRequest || se.Type != stripe.ErrorTypeIdempotency ||
		!strings.Contains(se.Msg, "a key other than 'ride-123'") {
		t.Errorf("error = %d %s: %s", se.HTTPStatusCode, se.Type, se.Msg)
	}
	if n := len(f.charges(t)); n != 1 {
		t.Errorf("stored %d charges, want 1", n)
	}
}

func TestKeysAreScopedToTheAPIKey(t *testing.T) {
	t.Parallel()
	f := setup(t)

	a, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.client("sk_test_other", 0).V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID || b.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("a second API key replayed the first key's charge %s", a.ID)
	}
	if n := len(f.charges(t)); n != 2 {
		t.Errorf("stored %d charges, want 2", n)
	}
}

func TestDeclineIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	f := setup(t)

	_, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", fakestripe.DeclineCustomer))
	first := stripeError(t, err)
	_, err = f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", fakestripe.DeclineCustomer))
	second := stripeError(t, err)

	if second.HTTPStatusCode != http.StatusPaymentRequired || second.Code != stripe.ErrorCodeCardDeclined {
		t.Errorf("replayed error = %d %s", second.HTTPStatusCode, second.Code)
	}
	if !bytes.Equal(second.LastResponse.RawJSON, first.LastResponse.RawJSON) ||
		second.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("decline was not replayed: Idempotent-Replayed %q, body\n%s\nwant\n%s",
			second.LastResponse.Header.Get("Idempotent-Replayed"), second.LastResponse.RawJSON, first.LastResponse.RawJSON)
	}
	if n := len(f.charges(t)); n != 0 {
		t.Errorf("stored %d charges, want 0", n)
	}
}

func TestValidationFailureStoresNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)

	bad := rideCharge("ride-123", "cus_rider")
	bad.Currency = nil
	_, err := f.stripe.V1Charges.Create(t.Context(), bad)
	if se := stripeError(t, err); se.HTTPStatusCode != http.StatusBadRequest || se.Param != "currency" {
		t.Fatalf("error = %d param %q", se.HTTPStatusCode, se.Param)
	}

	ch, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatalf("corrected request with the same key: %v", err)
	}
	if ch.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Error("corrected request was answered from a stored result")
	}
}

func TestRequestWhileKeyExecutesGets409(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.server.SetDelay(time.Second)

	type outcome struct {
		ch  *stripe.Charge
		err error
	}
	firstDone := make(chan outcome, 1)
	go func() {
		ch, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
		firstDone <- outcome{ch, err}
	}()
	f.waitForKeyLock(t)

	_, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	se := stripeError(t, err)
	if se.HTTPStatusCode != http.StatusConflict || se.Type != stripe.ErrorTypeIdempotency ||
		se.Code != stripe.ErrorCodeIdempotencyKeyInUse {
		t.Errorf("concurrent request: %d %s %s", se.HTTPStatusCode, se.Type, se.Code)
	}

	first := <-firstDone
	if first.err != nil {
		t.Fatal(first.err)
	}
	f.server.SetDelay(0)
	retry, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	if retry.ID != first.ch.ID {
		t.Errorf("retry after the 409 got %s, want the first request's %s", retry.ID, first.ch.ID)
	}
	if n := len(f.charges(t)); n != 1 {
		t.Errorf("stored %d charges, want 1", n)
	}
	if got := f.server.Stats().Conflicts; got != 1 {
		t.Errorf("Stats().Conflicts = %d, want 1", got)
	}
}

// waitForKeyLock waits until a request holds an idempotency key's advisory
// lock in the fixture's database.
func (f fixture) waitForKeyLock(t *testing.T) {
	t.Helper()
	const heldSQL = `
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		if err := f.pool.QueryRow(t.Context(), heldSQL).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no request took an idempotency key's lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConcurrentRequestsWithOneKeyChargeOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)

	var wg sync.WaitGroup
	results := make([]*stripe.Charge, 20)
	errs := make([]error, len(results))
	for i := range results {
		wg.Go(func() {
			results[i], errs[i] = f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
		})
	}
	wg.Wait()

	charges := f.charges(t)
	if len(charges) != 1 {
		t.Fatalf("stored %d charges, want 1", len(charges))
	}
	for i, err := range errs {
		if err != nil {
			if se := stripeError(t, err); se.Code != stripe.ErrorCodeIdempotencyKeyInUse {
				t.Errorf("request %d: %d %s", i, se.HTTPStatusCode, se.Code)
			}
			continue
		}
		if results[i].ID != charges[0].ID {
			t.Errorf("request %d got charge %s, want %s", i, results[i].ID, charges[0].ID)
		}
	}
}

func TestKeyIsNewAgainAfterRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)

	if _, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider")); err != nil {
		t.Fatal(err)
	}
	_, err := f.pool.Exec(t.Context(), `UPDATE fakestripe_idempotency_keys SET created_at = created_at - make_interval(secs => $1)`,
		(fakestripe.KeyRetention + time.Minute).Seconds())
	if err != nil {
		t.Fatal(err)
	}
	other := rideCharge("ride-123", "cus_rider")
	other.Amount = stripe.Int64(3000)
	if _, err := f.stripe.V1Charges.Create(t.Context(), other); err != nil {
		t.Fatalf("expired key reused with other params: %v", err)
	}
	replay, err := f.stripe.V1Charges.Create(t.Context(), other)
	if err != nil {
		t.Fatal(err)
	}
	if replay.Amount != 3000 || replay.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the key's new result was not stored: amount %d", replay.Amount)
	}
	if n := len(f.charges(t)); n != 2 {
		t.Errorf("stored %d charges, want 2", n)
	}
}
