package ride

import (
	"net/http"
	"testing"
)

func TestDefiniteStripeErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  StripeError
		want bool
	}{
		{"card declined", StripeError{Type: ErrorTypeCard, HTTPStatusCode: http.StatusPaymentRequired}, true},
		{"invalid request", StripeError{Type: "invalid_request_error", HTTPStatusCode: http.StatusBadRequest}, true},
		// The key was used before with other parameters, by a call that
		// may have charged.
		{"key reused with other parameters", StripeError{Type: ErrorTypeIdempotency, HTTPStatusCode: http.StatusBadRequest}, false},
		{"key in use", StripeError{Type: ErrorTypeIdempotency, HTTPStatusCode: http.StatusConflict}, false},
		{"rate limited", StripeError{Type: "invalid_request_error", HTTPStatusCode: http.StatusTooManyRequests}, false},
		{"api error", StripeError{Type: "api_error", HTTPStatusCode: http.StatusInternalServerError}, false},
	} {
		if got := definite(&c.err); got != c.want {
			t.Errorf("%s: definite = %v, want %v", c.name, got, c.want)
		}
	}
}
