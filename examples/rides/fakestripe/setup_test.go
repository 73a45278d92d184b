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

// client returns a stripe-go client for the fixture's server that retries
// network failures up to retries times. It opens a connection per request,
// because net/http would otherwise resend a request whose reused connection
// dropped before the test could see the failure.
func (f fixture) client(apiKey string, retries int64) *stripe.Client {
	return fakestripe.NewClient(f.url, apiKey, stripe.BackendConfig{
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
