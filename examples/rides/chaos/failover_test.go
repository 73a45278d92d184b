//go:build linux

package chaos_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v85"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// stripeServer is the cluster the fake Stripe keeps its charges and
// idempotency keys on in the failover tests: apart from the rides
// database's primary and standby, because Stripe is another company's
// system, and its memory of idempotency keys outlives a failover of ours.
// Each test has a database of its own on it. TestMain stops it.
var stripeServer struct {
	once    sync.Once
	cluster *pgcluster.Cluster
	err     error
	n       atomic.Int64
}

// stripeDatabase returns the DSN of a new database, migrated for the fake
// Stripe, on stripeServer.
func stripeDatabase(t *testing.T) string {
	t.Helper()
	stripeServer.once.Do(func() {
		stripeServer.cluster, stripeServer.err = pgcluster.Start(context.Background())
	})
	if stripeServer.err != nil {
		t.Fatal(stripeServer.err)
	}
	c := stripeServer.cluster
	name := fmt.Sprintf("stripe_%d", stripeServer.n.Add(1))
	admin := newPool(t, c.DSN("postgres"))
	if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	dsn := c.DSN(name)
	if err := fakestripe.Migrate(t.Context(), newPool(t, dsn)); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// stopStripeServer stops stripeServer if a test started it.
func stopStripeServer() error {
	if stripeServer.cluster == nil {
		return nil
	}
	return stripeServer.cluster.Stop()
}

// replicated is a rides database on a primary with one streaming standby.
type replicated struct {
	primary, standby *pgcluster.Cluster
	// dsn reaches whichever of the two accepts writes.
	dsn string
}

// startReplicated starts a primary, migrates and seeds a rides database on
// it, and starts a standby that replicates it, synchronously when sync is
// true. Both are stopped when t ends.
func startReplicated(t *testing.T, sync bool) *replicated {
	t.Helper()
	ctx := t.Context()
	primary, err := pgcluster.StartPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := primary.Stop(); err != nil {
			t.Error(err)
		}
	})
	admin := newPool(t, primary.DSN("postgres"))
	if _, err := admin.Exec(ctx, "CREATE DATABASE rides"); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	pool := newPool(t, primary.DSN("rides"))
	if err := ride.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := ride.Seed(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	standby, err := pgcluster.StartStandby(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := standby.Stop(); err != nil {
			t.Error(err)
		}
	})
	if sync {
		if err := primary.SetSynchronous(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	return &replicated{primary: primary, standby: standby, dsn: pgcluster.MultiHostDSN("rides", primary, standby)}
}

// failOver kills the primary as a crash of its machine would and promotes
// the standby; the two then swap roles.
func (r *replicated) failOver(ctx context.Context) error {
	if err := r.primary.Kill(); err != nil {
		return err
	}
	if err := r.standby.Promote(ctx); err != nil {
		return err
	}
	r.primary, r.standby = r.standby, r.primary
	return nil
}

// TestFailoverRetryAfterLostCommitsChargesOnce fails over to an
// asynchronous standby that missed the last commits of two keys, and
// retries both as their clients would:
//
//   - behind: its ride was created before the standby was cut off, its
//     charge and 201 after. On the standby its recovery point is back at
//     ride_created; the retry charges again with the same Stripe key,
//     Stripe replays the charge, and the client gets the same 201 as
//     before.
//   - lost: its whole run came after. Its key row is gone, so the retry
//     starts over: a new ride row, and the same Stripe key, which the
//     charge parameters must match for Stripe to replay the charge rather
//     than refuse the request. The client gets a 201 for a new ride, and
//     the rider is charged once.
func TestFailoverRetryAfterLostCommitsChargesOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	r := startReplicated(t, false)
	stripePool := newPool(t, stripeDatabase(t))
	srv := httptest.NewServer(fakestripe.New(stripePool, fakestripe.Config{Logger: quiet}))
	t.Cleanup(srv.Close)
	sc := ride.NewStripeClient(srv.URL, stripeKey, nil)
	pool := newPool(t, r.dsn)

	beforeCharge := phase.Point{Phase: "charge_created", Stage: phase.BeforeCall}
	var crash atomic.Bool
	app, err := ride.New(ride.Config{
		Pool: pool, Stripe: sc, Logger: quiet, WithoutWorker: true,
		Client: phase.Config{
			LockTTL:   time.Second,
			Completer: recovery.CompleterConfig{Interval: -1},
			Reaper:    recovery.ReaperConfig{Interval: -1},
			Injector: phase.InjectorFunc(func(_ context.Context, at phase.Point) error {
				if at == beforeCharge && crash.Load() {
					return phase.ErrCrash
				}
				return nil
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	post := func(key string) (int, string) {
		t.Helper()
		return postUntilFinal(t, app.Handler(), key)
	}

	crash.Store(true)
	if status, body := postOnce(app.Handler(), "behind"); status == http.StatusCreated {
		t.Fatalf("behind: crashed run answered %d %s", status, body)
	}
	crash.Store(false)
	if err := r.standby.CatchUp(ctx, r.primary); err != nil {
		t.Fatal(err)
	}
	if err := r.standby.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	// From here on the primary commits alone.
	behindStatus, behindBody := post("behind")
	lostStatus, lostBody := post("lost")
	if behindStatus != http.StatusCreated || lostStatus != http.StatusCreated {
		t.Fatalf("before the failover: behind %d %s, lost %d %s", behindStatus, behindBody, lostStatus, lostBody)
	}
	before := chargesByKey(t, sc)

	if err := r.failOver(ctx); err != nil {
		t.Fatal(err)
	}
	// The pool's connections died with the primary; the first queries on
	// them would fail.
	pool.Reset()
	if row, err := app.Client.Inspect(ctx, ride.UserEmail, "behind"); err != nil || row.RecoveryPoint != "ride_created" {
		t.Fatalf("behind on the promoted standby: %+v, %v; want recovery point ride_created", row, err)
	}
	if _, err := app.Client.Inspect(ctx, ride.UserEmail, "lost"); err != keyrow.ErrNotFound {
		t.Fatalf("lost on the promoted standby: %v, want keyrow.ErrNotFound", err)
	}

	if status, body := post("behind"); status != behindStatus || body != behindBody {
		t.Errorf("behind after the failover: %d %s, want the answer from before it: %d %s", status, body, behindStatus, behindBody)
	}
	status, body := post("lost")
	if status != http.StatusCreated {
		t.Errorf("lost after the failover: %d %s, want 201", status, body)
	}
	t.Logf("lost: answered %s before the failover, %s after it", lostBody, body)

	after := chargesByKey(t, sc)
	for _, key := range []string{"behind", "lost"} {
		if len(after[key]) != 1 || len(before[key]) != 1 || after[key][0] != before[key][0] {
			t.Errorf("%s: charges %v before the failover, %v after it; want the same single charge", key, before[key], after[key])
		}
		var recorded string
		err := pool.QueryRow(ctx, `
			SELECT coalesce(r.stripe_charge_id, '') FROM rides r JOIN idempotency_keys k ON k.id = r.idempotency_key_id
			WHERE k.idempotency_key = $1`, key).Scan(&recorded)
		if err != nil || len(after[key]) == 0 || recorded != after[key][0] {
			t.Errorf("%s: ride records charge %q (%v), Stripe holds %v", key, recorded, err, after[key])
		}
	}
	report, err := ride.Verify(ctx, pool, sc)
	if err != nil {
		t.Fatal(err)
	}
	if f := report.Failures(); len(f) > 0 || report.Charges != 2 || report.ChargedRides != 2 {
		t.Errorf("after the retries: %d charges, %d charged rides, failures %v; want 2, 2, none", report.Charges, report.ChargedRides, f)
	}
}

// chargesByKey returns the IDs of the charges at Stripe by the rides
// Idempotency-Key they were made for.
func chargesByKey(t *testing.T, sc *stripe.Client) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for ch, err := range sc.V1Charges.List(t.Context(), &stripe.ChargeListParams{}).All(t.Context()) {
		if err != nil {
			t.Fatal(err)
		}
		key := ch.Metadata[ride.ChargeKeyMetadata]
		out[key] = append(out[key], ch.ID)
	}
	return out
}

// rideForm is the ride every test request asks for.
const rideForm = "origin_lat=1&origin_lon=2&target_lat=3&target_lon=4"

// postOnce sends one ride request under key to h and returns its answer,
// or 0 when the handler aborted as a killed process would.
func postOnce(h http.Handler, key string) (status int, body string) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				panic(p)
			}
			status, body = 0, "aborted"
		}
	}()
	req := httptest.NewRequest(http.MethodPost, "/rides", strings.NewReader(rideForm))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", ride.UserEmail)
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, strings.TrimSpace(string(b))
}

// postUntilFinal sends the ride request under key until it is answered
// anything but 409, 500 or 503, as a client retries, for up to
// recoverTimeout.
func postUntilFinal(t *testing.T, h http.Handler, key string) (int, string) {
	t.Helper()
	deadline := time.Now().Add(recoverTimeout)
	for {
		status, body := postOnce(h, key)
		switch status {
		case 0, http.StatusConflict, http.StatusInternalServerError, http.StatusServiceUnavailable:
		default:
			return status, body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still answered %d %s after %v", key, status, body, recoverTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
