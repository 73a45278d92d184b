package fakestripe

import "github.com/stripe/stripe-go/v85"

// NewClient returns a stripe-go client that sends its requests to the server
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
func NewClient(baseURL, apiKey string, config stripe.BackendConfig) *stripe.Client {
	config.URL = stripe.String(baseURL)
	return stripe.NewClient(apiKey, stripe.WithBackends(stripe.NewBackendsWithConfig(&config)))
}
