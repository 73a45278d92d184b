package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultStorm is how many identical requests the storm scenarios send at
// once.
const DefaultStorm = 20

// DefaultRequestTimeout bounds every request the check sends.
const DefaultRequestTimeout = 10 * time.Second

// DefaultSettleTimeout bounds how long a scenario retries a key that is in
// flight (409, 429 or 503) before it fails, unless the endpoint's
// Retry-After asks for longer.
const DefaultSettleTimeout = 30 * time.Second

// Config names the endpoint to check and the request that it accepts.
// Zero values mean the documented default.
type Config struct {
	// URL is the endpoint's absolute http or https URL. With Handler it
	// may instead be a path on the handler's server. The check creates
	// real resources there: point it at a test tenant.
	URL string
	// Handler, when set, is served on a loopback server of the check's own
	// for the check's duration, and URL (default "/") is requested on it.
	Handler http.Handler
	// Method is the requests' method. Defaults to POST.
	Method string
	// Header is sent with every request: the caller's credentials, the
	// Content-Type. The check sets Idempotency-Key itself. Host, when set,
	// is sent as the request's host.
	Header http.Header
	// Body is a request the endpoint accepts and executes (a 2xx). Every
	// scenario that needs a successful request sends it under a new key.
	Body []byte
	// OtherBody is a second, different request the endpoint accepts, sent
	// under a key already used with Body. Defaults to Body with the last
	// digit of its first number changed (see OtherBody); when none can be
	// made, Check returns an error, since only the scenarios that send it
	// see an endpoint that does not compare a retry with its key's first
	// request.
	OtherBody []byte
	// OtherCaller, when set, is a second caller's headers (credentials),
	// which replace Header's of the same names. Without it the scoping
	// scenario is skipped.
	OtherCaller http.Header
	// FailBody, when set, is a request the endpoint answers with a 5xx.
	// Without it the server-error scenario is skipped.
	FailBody []byte
	// Profile is the policy the endpoint follows. Defaults to Generic(),
	// which any safe endpoint passes.
	Profile Profile
	// Strict fails the check on a Differs verdict too: an answer spelled
	// otherwise than Profile says. Defaults to false: only what is unsafe
	// fails.
	Strict bool
	// Storm is how many identical requests the storm scenarios send at
	// once. Defaults to DefaultStorm.
	Storm int
	// Executions, when set, returns how many times the endpoint has
	// executed a request so far (the charges made, the rows inserted). The
	// scenarios then count executions exactly instead of inferring them from
	// the answers. Nothing else may execute requests on the endpoint during
	// the check. Check reads it once before the first scenario and returns
	// its error. Without it the restart scenario cannot pass: from the
	// answers alone an execution resumed after a restart and a second one
	// look the same.
	Executions func(ctx context.Context) (int64, error)
	// Restart, when set, restarts the server behind the endpoint and
	// returns once it is started again; the restart scenario calls it in the
	// middle of a storm, once an execution is in flight (counted by
	// Executions, its answer not yet sent), and tries again with a new key
	// when none was. The restart must be seen: a connection opened to the
	// server before it closed after it, or requests of the storm cut;
	// else the scenario is skipped as not exercised. Without it that
	// scenario is skipped.
	Restart func(ctx context.Context) error
	// RequestTimeout bounds each request. Defaults to DefaultRequestTimeout.
	RequestTimeout time.Duration
	// SettleTimeout bounds how long a scenario retries a key that is in
	// flight. The endpoint's Retry-After extends it: a scenario waits at
	// least as long as the longest Retry-After the key answered, from the
	// answer that gave it, plus a few seconds. Defaults to
	// DefaultSettleTimeout.
	SettleTimeout time.Duration
}

// withDefaults validates c and returns it with its defaults resolved.
func (c Config) withDefaults() (Config, error) {
	c.Method = cmp.Or(strings.ToUpper(c.Method), http.MethodPost)
	if c.Profile.isZero() {
		c.Profile = Generic()
	}
	c.Storm = cmp.Or(c.Storm, DefaultStorm)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.SettleTimeout = cmp.Or(c.SettleTimeout, DefaultSettleTimeout)
	if err := c.Profile.validate(); err != nil {
		return c, err
	}
	switch {
	case c.Storm < 2 || c.Storm > 1000:
		return c, fmt.Errorf("conformance: Storm is %d; it must be 2 to 1000", c.Storm)
	case c.RequestTimeout < 0 || c.SettleTimeout < 0:
		return c, errors.New("conformance: RequestTimeout and SettleTimeout must not be negative")
	case c.Handler != nil:
		c.URL = cmp.Or(c.URL, "/")
		if !strings.HasPrefix(c.URL, "/") {
			return c, fmt.Errorf("conformance: with Handler, URL must be a path, not %q", c.URL)
		}
		return c, nil
	}
	if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("conformance: URL %q is not an absolute http or https URL", c.URL)
	}
	return c, nil
}
