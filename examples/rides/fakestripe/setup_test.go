package fakestripe_test

import (
	"errors"
	"log/slog"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v85"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi/fakeapitest"
	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const testKey = "sk_test_rides"

type fixture struct {
	server *fakestripe.Server
	pool   *pgxpool.Pool
	url    string
	// stripe makes no retries, so tests see every failure.
	stripe *stripe.Client
}

func setup(t *testing.T) fixture {
	t.Helper()
	server, pool, url := fakeapitest.Serve(t, fakestripe.Migrate, func(db *pgxpool.Pool) *fakestripe.Server {
		return fakestripe.New(db, fakestripe.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	})
	f := fixture{server: server, pool: pool, url: url}
	f.stripe = f.client(testKey, 0)
	return f
}

// newClient returns a stripe-go client that sends its requests to the server
// at baseURL (such as an httptest.Server's URL, with no /v1) with apiKey.
// Every other setting comes from config with stripe-go's meaning and
// defaults: a nil HTTPClient is stripe-go's own, a nil MaxNetworkRetries is
// two retries.
//
// Retries resend the very same request, Idempotency-Key included (the one
// set in the params, or the one stripe-go generates for a POST without one),
// so they never charge twice:
//
//   - stripe-go retries a request that failed on the network, up to
//     MaxNetworkRetries times. After a dropped connection (a timeout after
//     the charge) the retry is answered with the stored charge.
//   - stripe-go does not retry an answer with a Stripe error body, 500s and
//     409s included: those come back as *stripe.Error, and the caller retries
//     with the same key. After a failure before the charge, that retry
//     executes it.
//   - net/http itself resends a POST carrying an Idempotency-Key whose
//     reused keep-alive connection closed before any byte of the response,
//     without telling stripe-go. The server's drops come after the status
//     line, so they always reach stripe-go; a test that must see them as
//     errors sets MaxNetworkRetries to stripe.Int64(0).
func newClient(baseURL, apiKey string, config stripe.BackendConfig) *stripe.Client {
	config.URL = stripe.String(baseURL)
	return stripe.NewClient(apiKey, stripe.WithBackends(stripe.NewBackendsWithConfig(&config)))
}

// client returns a stripe-go client for the fixture's server that retries
// network failures up to retries times. It opens a connection per request,
// because net/http would otherwise resend a request whose reused connection
// dropped before the test could see the failure.
func (f fixture) client(apiKey string, retries int64) *stripe.Client {
	return newClient(f.url, apiKey, stripe.BackendConfig{
		HTTPClient:        &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		MaxNetworkRetries: stripe.Int64(retries),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
}

// rideCharge is the charge rocket-rides makes for a ride.
func rideCharge(key, customer string) *stripe.ChargeCreateParams {
	p := &stripe.ChargeCreateParams{
		Amount:      stripe.Int64(2000),
		Currency:    stripe.String("usd"),
		Customer:    stripe.String(customer),
		Description: stripe.String("Charge for ride 123"),
	}
	p.AddMetadata("ride_id", "123")
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

// charges returns every charge the server has made.
func (f fixture) charges(t *testing.T) []fakestripe.Charge {
	t.Helper()
	charges, err := f.server.Charges(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return charges
}

// stripeError returns err as the *stripe.Error stripe-go makes of an API
// error response, failing t if it is not one.
func stripeError(t *testing.T, err error) *stripe.Error {
	t.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) {
		t.Fatalf("got error %v (%T), want a *stripe.Error", err, err)
	}
	return se
}

// do sends a raw request to the fixture's server and returns the response
// with its body read.
func (f fixture) do(t *testing.T, method, path, body string, header http.Header) (*http.Response, string) {
	t.Helper()
	res, b := fakeapitest.Do(t, method, f.url+path, header, body)
	return res, string(b)
}
