package ride_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
)

// With Accept, the API answers 202 once the ride exists and charges in the
// background; a caller follows the status location to the ride's final
// answer, charged once, and the status of a declined ride is its 402.
func TestAcceptedRideIsChargedInTheBackgroundAndFollowedByTheCaller(t *testing.T) {
	t.Parallel()
	e := setupWith(t, 5, &configurer{app: func(cfg *ride.Config) { cfg.Accept = true }})
	if rec := e.post("ride-1", ride.UserEmail, ridePayload); rec.Code != http.StatusAccepted ||
		rec.Header().Get("Location") != "/rides/status/ride-1" {
		t.Fatalf("POST: %d %v %s; want 202 with Location /rides/status/ride-1", rec.Code, rec.Header(), rec.Body)
	}

	api := httptest.NewServer(e.api)
	t.Cleanup(api.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := caller.New(caller.Config{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key, rider string
		status     int
	}{{"ride-1", ride.UserEmail, http.StatusCreated}, {"ride-2", ride.UserEmail, http.StatusCreated}, {"ride-3", ride.DeclinedEmail, http.StatusPaymentRequired}} {
		req, err := http.NewRequest(http.MethodPost, api.URL+"/rides", strings.NewReader(ridePayload))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", tc.rider)
		req.Header.Set(caller.KeyHeader, tc.key)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status {
			t.Fatalf("%s: the caller got %d %s, want %d", tc.key, res.StatusCode, body, tc.status)
		}
		if tc.status == http.StatusCreated {
			if _, charges := e.chargesForKey(t, tc.key); charges != 1 {
				t.Fatalf("%s: %d charges, want 1", tc.key, charges)
			}
		}
	}
	if r := e.verify(t); r.Charges != 2 || r.Created != 2 || r.Declined != 1 {
		t.Fatalf("report %+v; want two charged rides and one declined", r)
	}
}
