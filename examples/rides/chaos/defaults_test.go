//go:build linux

package chaos_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
)

// TestACallerOnEveryDefaultGetsTheAnswerFromAServerKilledMidCall kills the
// API process while the ride's charge is in flight at Stripe, restarts it,
// and expects the caller, on every default of package caller and of the
// server (lease, completer), to end with the ride's answer, not an
// unknown outcome: the killed run's lease ends before the caller's budget
// does. Stripe charged the ride once.
func TestACallerOnEveryDefaultGetsTheAnswerFromAServerKilledMidCall(t *testing.T) {
	t.Parallel()
	s := setup(t, scenario{defaults: true})
	ctx := t.Context()
	s.setFaults(ctx, `{"fail_before_charge_rate": 0, "timeout_after_charge_rate": 0, "delay_ms": 1500}`)
	c, err := caller.New(caller.Config{})
	if err != nil {
		t.Fatal(err)
	}
	req, err := rideRequest(ctx, "http://"+s.apis[0].addr, ride.UserEmail, rideForm, "defaults-1")
	if err != nil {
		t.Fatal(err)
	}
	var before int
	if err := s.stripePool.QueryRow(ctx, `SELECT count(*) FROM fakestripe_charges`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res *caller.Response
		err error
	}
	done := make(chan answer, 1)
	start := time.Now()
	go func() {
		res, err := c.Do(req)
		done <- answer{res, err}
	}()
	// The charge takes 1.5 s at Stripe: kill the server during it.
	time.Sleep(700 * time.Millisecond)
	s.apis[0].kill()
	if _, err := s.apis[0].start(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	var unknown *caller.UnknownOutcomeError
	switch {
	case errors.As(a.err, &unknown):
		t.Fatalf("an unknown outcome after %v: %v; want the answer", time.Since(start), a.err)
	case a.err != nil:
		t.Fatal(a.err)
	}
	status, body, err := readAnswer(a.res.Response)
	if err != nil || status != http.StatusCreated {
		t.Fatalf("answer %d %s (%v) after %v; want 201", status, body, err, time.Since(start))
	}
	t.Logf("answered after %v in %d attempts", time.Since(start), a.res.Attempts)
	var after int
	if err := s.stripePool.QueryRow(ctx, `SELECT count(*) FROM fakestripe_charges`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after-before != 1 {
		t.Errorf("Stripe made %d charges for the ride; want 1", after-before)
	}
}
