package fakestripe

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// TestKeyPrefix starts every API key the server accepts.
const TestKeyPrefix = "sk_test_"

// MaxKeyLength is the longest Idempotency-Key accepted, as on Stripe.
const MaxKeyLength = fakeapi.MaxKeyLength

// KeyRetention is how long a stored result answers for its key. A key whose
// result is older is new again, as on Stripe, which prunes keys after 24
// hours.
const KeyRetention = fakeapi.KeyRetention

// Config configures a Server: its Logger (see fakeapi.Options). The zero
// value is ready to use.
type Config = fakeapi.Options

// Server is the fake Stripe API, an http.Handler that serves the Stripe
// routes under /v1 and fakeapi's control routes /_faults and /_stats. Its
// charges and idempotency keys live in Postgres, so several Servers on one
// database behave as one Stripe; its fault plan and Stats belong to it
// alone. It is safe for concurrent use.
type Server struct{ *fakeapi.Server }

// New returns a Server that keeps its data in db, which must already carry
// Schema (see Migrate). It starts with no faults planned.
func New(db *pgxpool.Pool, cfg Config) *Server {
	s := &Server{fakeapi.New(db, api, cfg)}
	s.Handle("POST /v1/charges", s.createCharge)
	s.Handle("GET /v1/charges", s.listCharges)
	s.Handle("GET /v1/charges/{id}", s.retrieveCharge)
	return s
}

// api is the fake Stripe as fakeapi serves it. Its name starts the
// server's log messages and the names of its tables.
var api = fakeapi.Config{Name: "fakestripe", Action: "charge", Authenticate: authenticate,
	Counts: []string{countCharges, countDeclined}, Tables: chargesTable}

// The server's own counts, in Stats and GET /_stats.
const (
	countCharges  = "charges"
	countDeclined = "declined"
)

// ControlUsage documents the control routes /_stats and /_faults, for the
// -h of a command that runs a Server.
var ControlUsage = api.ControlUsage()

// authenticate admits a request that carries a test key, as a Bearer token
// or as the user name of Basic auth (curl -u sk_test_...:), and answers any
// other with Stripe's 401.
func authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	key, _, basic := r.BasicAuth()
	if !basic {
		key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		key = strings.TrimSpace(key)
	}
	if strings.HasPrefix(key, TestKeyPrefix) && len(key) > len(TestKeyPrefix) {
		return key, true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="Stripe"`)
	fakeapi.Write(w, unauthorized(key))
	return "", false
}

// unauthorized is Stripe's answer to a missing or unusable API key.
func unauthorized(key string) fakeapi.Response {
	if key == "" {
		return fakeapi.ErrorResponse(http.StatusUnauthorized, fakeapi.Error{
			Type: "invalid_request_error",
			Message: "You did not provide an API key. You need to provide your API key in the Authorization header, " +
				"using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
		})
	}
	// Stripe shows only the end of a rejected key, so logs never hold it.
	shown := key
	if len(key) > 4 {
		shown = strings.Repeat("*", len(key)-4) + key[len(key)-4:]
	}
	return fakeapi.ErrorResponse(http.StatusUnauthorized, fakeapi.Error{
		Type:    "invalid_request_error",
		Message: "Invalid API Key provided: " + shown + ". This server accepts only keys starting with " + TestKeyPrefix + ".",
	})
}

// unknownParam rejects the first parameter of form that allowed refuses, as
// Stripe rejects parameters it does not know rather than ignore them. It
// returns nil when every parameter is allowed.
func unknownParam(form url.Values, allowed func(string) bool) *fakeapi.Response {
	for _, name := range slices.Sorted(maps.Keys(form)) {
		if !allowed(name) {
			return fakeapi.InvalidParam(name, "parameter_unknown", "Received unknown parameter: "+name)
		}
	}
	return nil
}

// Stats counts what a Server has done since New (see fakeapi.Stats); its
// Counts are "charges", the charges created, and "declined", the charge
// requests declined.
type Stats = fakeapi.Stats
