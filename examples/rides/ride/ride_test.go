package ride_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type env struct {
	pool   *pgxpool.Pool
	stripe *fakestripe.Server
	sc     *ride.Stripe
	app    *ride.App
	api    http.Handler
}

// setup returns the rides service on a fresh database, charging through
// the fake Stripe over real HTTP. The background parts are not started;
// tests drive the completer themselves and start the worker when needed.
func setup(t testing.TB, maxConns int32) *env {
	t.Helper()
	return setupWith(t, maxConns, nil)
}

// setupWith is setup with configure applied, when not nil, to the pool's
// config, the Stripe client's transport and the service's config before
// they are used, and to the fake Stripe's handler.
func setupWith(t testing.TB, maxConns int32, configure *configurer) *env {
	t.Helper()
	if configure == nil {
		configure = &configurer{}
	}
	ctx := context.Background()
	configurePool := func(cfg *pgxpool.Config) {
		cfg.MaxConns = maxConns
		if configure.pool != nil {
			configure.pool(cfg)
		}
	}
	var pool *pgxpool.Pool
	migrate := ride.Migrate
	if configure.citus {
		pool, migrate = pgtest.CitusSchemaPool(t, configurePool), ride.Distribute
	} else {
		cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		configurePool(cfg)
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
	}
	cfg := pool.Config()
	if err := migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := fakestripe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := ride.Seed(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// Stripe is another service: its own pool, so that a test saturating
	// the API's connections does not starve it into timeouts.
	stripeCfg := cfg.Copy()
	stripeCfg.MaxConns = 10
	stripePool, err := pgxpool.NewWithConfig(ctx, stripeCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stripePool.Close)
	fs := fakestripe.New(stripePool, fakestripe.Config{Logger: quiet})
	var stripeHandler http.Handler = fs
	if configure.stripe != nil {
		stripeHandler = configure.stripe(fs)
	}
	srv := httptest.NewServer(stripeHandler)
	t.Cleanup(srv.Close)
	// The client the service uses in production, keep-alives included:
	// the fake Stripe's drops reach it all the same.
	var hc *http.Client
	if configure.transport != nil {
		hc = &http.Client{Timeout: 10 * time.Second, Transport: configure.transport(http.DefaultTransport)}
	}
	sc := ride.NewStripeClient(srv.URL, "sk_test_rides", hc)
	appCfg := ride.Config{
		Pool: pool, Stripe: sc, Logger: quiet,
		Client: phase.Config{Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}},
	}
	if configure.app != nil {
		configure.app(&appCfg)
	}
	app, err := ride.New(appCfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, stripe: fs, sc: sc, app: app, api: app.Handler()}
}

// configurer adjusts what setupWith builds; nil functions change nothing.
type configurer struct {
	pool      func(*pgxpool.Config)
	transport func(http.RoundTripper) http.RoundTripper
	app       func(*ride.Config)
	stripe    func(http.Handler) http.Handler
	// citus puts the service on a Citus cluster, distributed with
	// ride.Distribute, in a schema of the test's own.
	citus bool
}

var ridePayload = url.Values{"origin_lat": {"37.7749"}, "origin_lon": {"-122.4194"}, "target_lat": {"37.3382"}, "target_lon": {"-121.8863"}}.Encode()

func (e *env) post(key, user, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/rides", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if user != "" {
		r.Header.Set("Authorization", user)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	e.api.ServeHTTP(rec, r)
	return rec
}

// chargesForKey returns the ride created under key and the charges Stripe
// holds for it.
func (e *env) chargesForKey(t testing.TB, key string) (rideID int64, charges int) {
	t.Helper()
	err := e.pool.QueryRow(context.Background(), `
		SELECT r.id FROM rides r JOIN idempotency_keys k ON k.tenant = r.tenant AND k.id = r.idempotency_key_id
		WHERE k.idempotency_key = $1`, key).Scan(&rideID)
	if err != nil {
		t.Fatalf("ride for %s: %v", key, err)
	}
	all, err := e.stripe.Charges(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if c.Metadata[ride.ChargeKeyMetadata] == key {
			charges++
		}
	}
	return rideID, charges
}

func (e *env) verify(t testing.TB) ride.Report {
	t.Helper()
	r, err := ride.Verify(context.Background(), e.pool, e.sc, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if f := r.Failures(); len(f) > 0 {
		t.Fatalf("invariants broken: %v (%+v)", f, r)
	}
	return r
}

func TestCrashesAndPairedFaultsAtEveryPointChargeEachRideOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 10)
	cfg := phasetest.Config[ride.Request, ride.State]{
		Client:   e.app.Client,
		DB:       e.pool,
		Workflow: e.app.Workflow,
		Tenant:   ride.UserEmail,
		Request: func(string) ride.Request {
			return ride.Request{OriginLat: 1, OriginLon: 2, TargetLat: 3, TargetLon: 4}
		},
		WithCompleter: true,
		Compare:       phasetest.IgnoreFields("ride_id"),
		Check: func(t testing.TB, s phasetest.Scenario) {
			var rideID int64
			if err := e.pool.QueryRow(context.Background(), `SELECT id FROM rides WHERE idempotency_key_id = $1`, s.ID).Scan(&rideID); err != nil {
				t.Fatalf("ride of %s: %v", s.Key, err)
			}
			var created ride.Created
			if err := json.Unmarshal(s.Response.Body, &created); err != nil || created.RideID != rideID {
				t.Fatalf("%s: response %s names ride %d, want %d", s.Key, s.Response.Body, created.RideID, rideID)
			}
			if _, charges := e.chargesForKey(t, s.Key); charges != 1 {
				t.Fatalf("%s: %d charges for ride %d, want 1", s.Key, charges, rideID)
			}
		},
	}
	t.Run("crashes", func(t *testing.T) { phasetest.CrashMatrix(t, cfg) })
	t.Run("pairs", func(t *testing.T) { phasetest.PairMatrix(t, cfg) })
	e.verify(t)
}

func Test50KeysTimes100ConcurrentRequestsChargeOncePerKey(t *testing.T) {
	t.Parallel()
	e := setup(t, 30)
	const keys, copies = 50, 100
	var wg sync.WaitGroup
	statuses := make([][]int, keys)
	for k := range keys {
		statuses[k] = make([]int, copies)
		for c := range copies {
			wg.Go(func() {
				statuses[k][c] = e.post(fmt.Sprintf("ride-%02d", k), ride.UserEmail, ridePayload).Code
			})
		}
	}
	wg.Wait()
	for k := range keys {
		created := 0
		for _, s := range statuses[k] {
			switch s {
			case http.StatusCreated:
				created++
			case http.StatusConflict:
			default:
				t.Fatalf("key %d: status %d, want 201 or 409", k, s)
			}
		}
		if created == 0 {
			t.Fatalf("key %d: no request got 201", k)
		}
		if _, charges := e.chargesForKey(t, fmt.Sprintf("ride-%02d", k)); charges != 1 {
			t.Fatalf("key %d: %d charges, want 1", k, charges)
		}
	}
	if r := e.verify(t); r.Charges != keys || r.Rides != keys {
		t.Fatalf("%d charges, %d rides; want %d of each", r.Charges, r.Rides, keys)
	}
}

func TestDeclinedCardIsStored402AndReplayedByteIdentical(t *testing.T) {
	t.Parallel()
	e := setup(t, 5)
	first := e.post("declined-1", ride.DeclinedEmail, ridePayload)
	if first.Code != http.StatusPaymentRequired || !strings.Contains(first.Body.String(), "card_declined") {
		t.Fatalf("declined card: %d %s", first.Code, first.Body.String())
	}
	again := e.post("declined-1", ride.DeclinedEmail, ridePayload)
	if again.Code != http.StatusPaymentRequired || again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %q replayed=%q; want identical 402", again.Code, again.Body.String(), again.Header().Get("Idempotent-Replayed"))
	}
	if r := e.verify(t); r.Charges != 0 || r.Declined != 1 {
		t.Fatalf("report %+v; want no charge and one declined key", r)
	}
}

func TestRequestErrorsComeFromTheLibraryAndAreNotStored(t *testing.T) {
	t.Parallel()
	e := setup(t, 5)
	if rec := e.post("", ride.UserEmail, ridePayload); rec.Code != http.StatusBadRequest {
		t.Fatalf("missing key: %d", rec.Code)
	}
	if rec := e.post("k1", "", ridePayload); rec.Code != http.StatusUnauthorized {
		t.Fatalf("missing user: %d", rec.Code)
	}
	if rec := e.post("k1", "stranger@example.com", ridePayload); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "stranger@example.com") {
		t.Fatalf("unknown user: %d %s", rec.Code, rec.Body.String())
	}
	bad := url.Values{"origin_lat": {"91"}, "origin_lon": {"0"}, "target_lat": {"0"}, "target_lon": {"0"}}.Encode()
	if rec := e.post("k1", ride.UserEmail, bad); rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), `"field":"origin_lat"`) {
		t.Fatalf("invalid coordinate: %d %s", rec.Code, rec.Body.String())
	}
	r := httptest.NewRequest(http.MethodPost, "/rides", strings.NewReader(`{"origin_lat":1,"origin_lon":2,"target_lat":3}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", ride.UserEmail)
	r.Header.Set("Idempotency-Key", "k1")
	rec := httptest.NewRecorder()
	e.api.ServeHTTP(rec, r)
	if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "target_lon") {
		t.Fatalf("missing JSON field: %d %s", rec.Code, rec.Body.String())
	}
	if rec := e.post("k1", ride.UserEmail, ridePayload); rec.Code != http.StatusCreated {
		t.Fatalf("valid ride after rejected ones: %d %s", rec.Code, rec.Body.String())
	}
	other := url.Values{"origin_lat": {"1"}, "origin_lon": {"1"}, "target_lat": {"1"}, "target_lon": {"1"}}.Encode()
	if rec := e.post("k1", ride.UserEmail, other); rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "idempotency-key-reused") {
		t.Fatalf("mismatch: %d %s", rec.Code, rec.Body.String())
	}
}

func TestOtherPathsAndMethodsAreAnsweredAsProblems(t *testing.T) {
	t.Parallel()
	e := setup(t, 5)
	for _, tc := range []struct {
		method, path string
		status       int
		problem      string
		allow        string
	}{
		{http.MethodGet, "/rides", http.StatusMethodNotAllowed, "method-not-allowed", http.MethodPost},
		{http.MethodPut, "/rides", http.StatusMethodNotAllowed, "method-not-allowed", http.MethodPost},
		{http.MethodGet, "/", http.StatusNotFound, "not-found", ""},
		{http.MethodPost, "/rides/1", http.StatusNotFound, "not-found", ""},
		{http.MethodPost, "/ride", http.StatusNotFound, "not-found", ""},
	} {
		r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(ridePayload))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Authorization", ride.UserEmail)
		r.Header.Set("Idempotency-Key", "not-a-ride")
		rec := httptest.NewRecorder()
		e.api.ServeHTTP(rec, r)
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
		}
		if rec.Code != tc.status || rec.Header().Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal(rec.Body.Bytes(), &p) != nil || p.Status != tc.status || !strings.HasSuffix(p.Type, ":"+tc.problem) ||
			rec.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d %s %q (Allow %q), want a %d %s problem (Allow %q)", tc.method, tc.path,
				rec.Code, rec.Header().Get("Content-Type"), rec.Body.String(), rec.Header().Get("Allow"), tc.status, tc.problem, tc.allow)
		}
	}
	var keys int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&keys); err != nil || keys != 0 {
		t.Fatalf("%d keys stored (%v), want none", keys, err)
	}
}

func TestStripeTimeoutAfterChargingIsResumedWithOneCharge(t *testing.T) {
	t.Parallel()
	e := setup(t, 5)
	e.stripe.TimeoutAfterCharge(1)
	first := e.post("timeout-1", ride.UserEmail, ridePayload)
	if first.Code != http.StatusServiceUnavailable {
		t.Fatalf("timeout after charge: %d %s, want 503 (not stored)", first.Code, first.Body.String())
	}
	var rp string
	if err := e.pool.QueryRow(context.Background(), `SELECT recovery_point FROM idempotency_keys WHERE idempotency_key = 'timeout-1'`).Scan(&rp); err != nil || rp != "ride_created" {
		t.Fatalf("recovery point %q (%v), want ride_created: resumable, nothing stored", rp, err)
	}
	again := e.post("timeout-1", ride.UserEmail, ridePayload)
	if again.Code != http.StatusCreated {
		t.Fatalf("retry: %d %s", again.Code, again.Body.String())
	}
	if _, charges := e.chargesForKey(t, "timeout-1"); charges != 1 {
		t.Fatalf("%d charges, want 1", charges)
	}
	e.verify(t)
}

// On a kept-alive connection, net/http resends a request with an
// Idempotency-Key by itself when the connection closes before any byte of
// the answer. A timeout after the charge must still reach the workflow,
// which then leaves the key resumable, rather than be papered over by a
// resend that the workflow never sees.
func TestStripeTimeoutOnAReusedConnectionReachesTheWorkflow(t *testing.T) {
	t.Parallel()
	e := setup(t, 5)
	if warm := e.post("warm-up", ride.UserEmail, ridePayload); warm.Code != http.StatusCreated {
		t.Fatalf("first ride: %d %s", warm.Code, warm.Body.String())
	}
	e.stripe.TimeoutAfterCharge(1)
	first := e.post("timeout-1", ride.UserEmail, ridePayload)
	if first.Code != http.StatusServiceUnavailable {
		t.Fatalf("timeout after charge on a reused connection: %d %s, want 503 (outcome unknown, not stored)", first.Code, first.Body.String())
	}
	if s := e.stripe.Stats(); s.Requests != 2 || s.Replays != 0 {
		t.Fatalf("Stripe stats %+v: want 2 requests and no replay, nothing resent behind the workflow", s)
	}
	if again := e.post("timeout-1", ride.UserEmail, ridePayload); again.Code != http.StatusCreated {
		t.Fatalf("retry: %d %s", again.Code, again.Body.String())
	}
	if _, charges := e.chargesForKey(t, "timeout-1"); charges != 1 {
		t.Fatalf("%d charges, want 1", charges)
	}
	e.verify(t)
}

func TestReceiptsAreSentOncePerRide(t *testing.T) {
	t.Parallel()
	e := setup(t, 10)
	ctx := context.Background()
	if err := e.app.Jobs.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.app.Jobs.Stop(context.Background()) })
	const rides = 5
	for i := range rides {
		key := fmt.Sprintf("receipt-%d", i)
		for range 3 { // the rider retries; only one receipt job exists
			if rec := e.post(key, ride.UserEmail, ridePayload); rec.Code != http.StatusCreated {
				t.Fatalf("%s: %d", key, rec.Code)
			}
		}
	}
	// River runs a job at least once: enqueue a duplicate of one receipt.
	var rideID int64
	if err := e.pool.QueryRow(ctx, `SELECT min(id) FROM rides`).Scan(&rideID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.app.Jobs.Insert(ctx, ride.ReceiptArgs{RideID: rideID, Email: ride.UserEmail, Amount: ride.Amount}, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var receipts, pendingJobs int
		err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM receipts),
			(SELECT count(*) FROM river_job WHERE state NOT IN ('completed', 'discarded', 'cancelled'))`).Scan(&receipts, &pendingJobs)
		if err != nil {
			t.Fatal(err)
		}
		if pendingJobs == 0 {
			if receipts != rides {
				t.Fatalf("%d receipts for %d rides", receipts, rides)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs still pending after 20s: %d receipts", receipts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.verify(t)
}

// TestAddingAFraudCheckConvergesForRidesInFlight deploys the workflow's next
// definition, with a fraud check before the charge, over rides crashed at
// every point of the first: the upgraded process, which keeps the first
// definition registered, finishes each with one ride and one charge, and
// no ride it started under the first definition is checked.
func TestAddingAFraudCheckConvergesForRidesInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t, 10)
	upgraded, err := ride.New(ride.Config{
		Pool: e.pool, Stripe: e.sc, Logger: quiet, FraudCheck: true,
		Client: phase.Config{Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	request := func(string) ride.Request { return ride.Request{OriginLat: 1, OriginLon: 2, TargetLat: 3, TargetLon: 4} }
	from := phasetest.Config[ride.Request, ride.State]{Client: e.app.Client, DB: e.pool, Workflow: e.app.Workflow,
		Tenant: ride.UserEmail, Request: request}
	to := phasetest.Config[ride.Request, ride.State]{Client: upgraded.Client, DB: e.pool, Workflow: upgraded.Workflow,
		Tenant: ride.UserEmail, Request: request, WithCompleter: true, Compare: phasetest.IgnoreFields("ride_id"),
		Check: func(t testing.TB, s phasetest.Scenario) {
			row, err := upgraded.Client.Inspect(context.Background(), s.Tenant, s.Key)
			if err != nil {
				t.Fatal(err)
			}
			var rideID int64
			var checks int
			err = e.pool.QueryRow(context.Background(), `
				SELECT r.id, (SELECT count(*) FROM audit_records a WHERE a.action = $2 AND a.resource_id = r.id)
				FROM rides r WHERE r.idempotency_key_id = $1`, s.ID, ride.FraudCheckPhase).Scan(&rideID, &checks)
			if err != nil {
				t.Fatalf("ride of %s: %v", s.Key, err)
			}
			wantChecks := 0
			if row.Definition == upgraded.Workflow.Definition() {
				wantChecks = 1
			}
			if _, charges := e.chargesForKey(t, s.Key); charges != 1 || checks != wantChecks {
				t.Fatalf("%s (definition %s): %d charges and %d fraud checks, want 1 and %d", s.Key, row.Definition, charges, checks, wantChecks)
			}
		}}
	phasetest.UpgradeMatrix(t, from, to)
	e.verify(t)
}

// The Stripe client sends the idempotency key it is given, so a repeated
// charge returns the first charge; it reads a decline as a card error, and
// lists every charge across pages.
func TestStripeClientRepeatsAChargeByItsKeyAndListsEveryCharge(t *testing.T) {
	t.Parallel()
	e := setup(t, 5)
	ctx := context.Background()
	params := func(customer string) ride.ChargeParams {
		return ride.ChargeParams{Amount: ride.Amount, Currency: "usd", Customer: customer,
			Metadata: map[string]string{ride.ChargeKeyMetadata: "ride-1"}}
	}
	first, err := e.sc.CreateCharge(ctx, params(ride.UserCustomer), "downstream-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.sc.CreateCharge(ctx, params(ride.UserCustomer), "downstream-1")
	if err != nil || again.ID != first.ID || again.Customer != ride.UserCustomer || again.Metadata[ride.ChargeKeyMetadata] != "ride-1" {
		t.Fatalf("repeated charge: %+v, %v; want %+v again", again, err, first)
	}
	_, err = e.sc.CreateCharge(ctx, params(ride.DeclinedCustomer), "downstream-2")
	var serr *ride.StripeError
	if !errors.As(err, &serr) || serr.Type != ride.ErrorTypeCard || serr.HTTPStatusCode != http.StatusPaymentRequired {
		t.Fatalf("declined charge: %v, want a 402 card_error", err)
	}
	for i := range 104 {
		if _, err := e.sc.CreateCharge(ctx, params(ride.UserCustomer), fmt.Sprintf("more-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	charges, err := e.sc.Charges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, ch := range charges {
		seen[ch.ID] = true
	}
	if len(charges) != 105 || len(seen) != 105 || !seen[first.ID] {
		t.Errorf("listed %d charges (%d distinct), want the 105 made, %s among them", len(charges), len(seen), first.ID)
	}
}
