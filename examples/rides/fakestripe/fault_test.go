package fakestripe_test

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v85"
)

func TestFailBeforeChargeThenRetryChargesOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.server.FailBeforeCharge(1)

	_, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if se := stripeError(t, err); se.HTTPStatusCode != http.StatusInternalServerError || se.Type != stripe.ErrorTypeAPI {
		t.Fatalf("error = %d %s", se.HTTPStatusCode, se.Type)
	}
	if n := len(f.charges(t)); n != 0 {
		t.Fatalf("stored %d charges after a failure before the charge, want 0", n)
	}

	ch, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	if ch.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Error("the retry replayed the injected 500")
	}
	if charges := f.charges(t); len(charges) != 1 || charges[0].ID != ch.ID {
		t.Errorf("stored %+v, want exactly %s", charges, ch.ID)
	}
	if got := f.server.Stats().FaultsInjected; got != 1 {
		t.Errorf("Stats().FaultsInjected = %d, want 1", got)
	}
}

func TestTimeoutAfterChargeThenRetryReplaysTheCharge(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.server.TimeoutAfterCharge(1)

	_, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if se := (*stripe.Error)(nil); err == nil || errors.As(err, &se) {
		t.Fatalf("got %v, want a network error", err)
	}
	charges := f.charges(t)
	if len(charges) != 1 {
		t.Fatalf("stored %d charges, want the 1 made before the connection dropped", len(charges))
	}

	ch, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	if ch.ID != charges[0].ID || ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry got %s (replayed %q), want the replay of %s",
			ch.ID, ch.LastResponse.Header.Get("Idempotent-Replayed"), charges[0].ID)
	}
	if n := len(f.charges(t)); n != 1 {
		t.Errorf("stored %d charges, want 1", n)
	}
}

// stripe-go resends a request whose connection dropped with the same
// Idempotency-Key, so its own retry gets the charge made before the drop.
func TestStripeGoRetryReplaysChargeAfterDrop(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.server.TimeoutAfterCharge(1)

	ch, err := f.client(testKey, 2).V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	if ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Error("the retry was not answered from the stored result")
	}
	if charges := f.charges(t); len(charges) != 1 || charges[0].ID != ch.ID {
		t.Errorf("stored %+v, want exactly %s", charges, ch.ID)
	}
	if s := f.server.Stats(); s.FaultsInjected != 1 || s.Requests != 2 || s.Replays != 1 {
		t.Errorf("stats = %+v, want 1 fault and 1 replay in 2 requests", s)
	}
}

// A Stripe error body is returned to the caller, not retried by stripe-go,
// even when it is a 500.
func TestStripeGoReturnsInjected500(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.server.FailBeforeCharge(1)

	_, err := f.client(testKey, 2).V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if se := stripeError(t, err); se.HTTPStatusCode != http.StatusInternalServerError {
		t.Errorf("status %d, want 500", se.HTTPStatusCode)
	}
	if s := f.server.Stats(); s.Requests != 1 {
		t.Errorf("stripe-go sent %d requests, want 1", s.Requests)
	}
}

func TestRatesInjectFaults(t *testing.T) {
	t.Parallel()
	f := setup(t)

	if err := f.server.SetRates(1, 0); err != nil {
		t.Fatal(err)
	}
	_, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-1", "cus_rider"))
	if se := stripeError(t, err); se.HTTPStatusCode != http.StatusInternalServerError {
		t.Errorf("fail-before rate 1: status %d, want 500", se.HTTPStatusCode)
	}

	if err := f.server.SetRates(0, 1); err != nil {
		t.Fatal(err)
	}
	_, err = f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-2", "cus_rider"))
	if se := (*stripe.Error)(nil); err == nil || errors.As(err, &se) {
		t.Errorf("timeout-after rate 1: got %v, want a network error", err)
	}

	if err := f.server.SetRates(1.5, 0); err == nil {
		t.Error("SetRates(1.5, 0) succeeded")
	}
	if got := f.server.Faults(); got.FailBeforeRate != 0 || got.TimeoutAfterRate != 1 {
		t.Errorf("a rejected SetRates changed the plan to %+v", got)
	}
	if n := len(f.charges(t)); n != 1 {
		t.Errorf("stored %d charges, want the 1 made before the drop", n)
	}
}

func TestFaultsOverHTTP(t *testing.T) {
	t.Parallel()
	f := setup(t)
	jsonHeader := http.Header{"Content-Type": {"application/json"}}

	res, body := f.do(t, http.MethodPost, "/_faults", `{"fail_before_charge": 1, "delay_ms": 5}`, jsonHeader)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST /_faults: %d %s", res.StatusCode, body)
	}
	if got := f.server.Faults(); got.FailBefore != 1 || got.Delay != 5*time.Millisecond {
		t.Errorf("plan after POST = %+v", got)
	}
	// Fields left out keep their values.
	f.do(t, http.MethodPost, "/_faults", `{"timeout_after_charge_rate": 0.25}`, jsonHeader)
	_, body = f.do(t, http.MethodGet, "/_faults", "", nil)
	var plan map[string]float64
	if err := json.Unmarshal([]byte(body), &plan); err != nil {
		t.Fatal(err)
	}
	if plan["fail_before_charge"] != 1 || plan["delay_ms"] != 5 || plan["timeout_after_charge_rate"] != 0.25 {
		t.Errorf("GET /_faults = %s", body)
	}
	f.do(t, http.MethodPost, "/_faults", `{"timeout_after_charge_rate": 0}`, jsonHeader)

	_, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider"))
	if se := stripeError(t, err); se.HTTPStatusCode != http.StatusInternalServerError {
		t.Errorf("charge after POST /_faults: status %d, want 500", se.HTTPStatusCode)
	}
	if _, err := f.stripe.V1Charges.Create(t.Context(), rideCharge("ride-123", "cus_rider")); err != nil {
		t.Errorf("retry: %v", err)
	}

	_, body = f.do(t, http.MethodGet, "/_stats", "", nil)
	var stats map[string]int64
	if err := json.Unmarshal([]byte(body), &stats); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"requests": 2, "charges": 1, "declined": 0, "replays": 0, "conflicts": 0, "faults_injected": 1}
	if !maps.Equal(stats, want) {
		t.Errorf("GET /_stats = %v, want %v", stats, want)
	}

	for _, bad := range []string{
		`{"fail_before_charge_rate": 1.5}`,
		`{"timeout_after_charge": -1}`,
		`{"fail_before": 1}`,
		`not json`,
	} {
		res, body := f.do(t, http.MethodPost, "/_faults", bad, jsonHeader)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Invalid fault plan") {
			t.Errorf("POST /_faults %s: %d %s", bad, res.StatusCode, body)
		}
	}
}

// reuseRecorder is a transport with keep-alives, as every Go client has by
// default, that records whether each request went out on a connection an
// earlier request had used.
type reuseRecorder struct {
	transport *http.Transport
	mu        sync.Mutex
	reused    []bool
}

func (rr *reuseRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		rr.mu.Lock()
		defer rr.mu.Unlock()
		rr.reused = append(rr.reused, info.Reused)
	}}
	return rr.transport.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
}

// Go's transport resends by itself a request carrying an Idempotency-Key
// whose reused connection closes before any byte of the answer, so a drop
// with no answer at all would reach the server twice and the caller never.
// The drop after the charge must reach a caller on a kept-alive connection
// as the network error it stands for.
func TestTimeoutAfterChargeReachesACallerOnAReusedConnection(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rr := &reuseRecorder{transport: &http.Transport{}}
	t.Cleanup(rr.transport.CloseIdleConnections)
	sc := newClient(f.url, testKey, stripe.BackendConfig{
		HTTPClient:        &http.Client{Transport: rr},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	if _, err := sc.V1Charges.Create(t.Context(), rideCharge("ride-1", "cus_rider")); err != nil {
		t.Fatal(err)
	}

	f.server.TimeoutAfterCharge(1)
	_, err := sc.V1Charges.Create(t.Context(), rideCharge("ride-2", "cus_rider"))
	if se := (*stripe.Error)(nil); err == nil || errors.As(err, &se) {
		t.Fatalf("got %v, want the network error of the drop", err)
	}
	rr.mu.Lock()
	reused := slices.Clone(rr.reused)
	rr.mu.Unlock()
	if len(reused) < 2 || !reused[1] {
		t.Fatalf("connections reused: %v; the faulted request must go out on the first request's connection", reused)
	}
	if s := f.server.Stats(); s.Requests != 2 || s.Counts["charges"] != 2 || s.Replays != 0 || s.FaultsInjected != 1 {
		t.Errorf("stats = %+v, want 2 requests, 2 charges, no replay: nothing resent behind the caller's back", s)
	}

	ch, err := sc.V1Charges.Create(t.Context(), rideCharge("ride-2", "cus_rider"))
	if err != nil {
		t.Fatal(err)
	}
	if ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Error("the caller's retry was not answered with the charge made before the drop")
	}
	if n := len(f.charges(t)); n != 2 {
		t.Errorf("stored %d charges, want 2", n)
	}
}
