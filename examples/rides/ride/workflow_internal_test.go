package ride

import (
	"net/http"
	"testing"

	"github.com/stripe/stripe-go/v85"
)

func TestDefiniteStripeErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  stripe.Error
		want bool
	}{
		{"card declined", stripe.Error{Type: stripe.ErrorTypeCard, HTTPStatusCode: http.StatusPaymentRequired}, true},
		{"invalid request", stripe.Error{Type: stripe.ErrorTypeInvalidRequest, HTTPStatusCode: http.StatusBadRequest}, true},
		// The key was used before with other parameters, by a call that
		// may have charged.
		{"key reused with other parameters", stripe.Error{Type: stripe.ErrorTypeIdempotency, HTTPStatusCode: http.StatusBadRequest}, false},
		{"key in use", stripe.Error{Type: stripe.ErrorTypeIdempotency, HTTPStatusCode: http.StatusConflict}, false},
		{"rate limited", stripe.Error{Type: stripe.ErrorTypeInvalidRequest, HTTPStatusCode: http.StatusTooManyRequests}, false},
		{"api error", stripe.Error{Type: stripe.ErrorTypeAPI, HTTPStatusCode: http.StatusInternalServerError}, false},
	} {
		if got := definite(&c.err); got != c.want {
			t.Errorf("%s: definite = %v, want %v", c.name, got, c.want)
		}
	}
}
