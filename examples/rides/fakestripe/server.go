package fakestripe

import (
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"

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

// Config configures a Server. The zero value is ready to use.
type Config struct {
	// Logger receives a record for every injected fault and every failed
	// database operation. Nil means slog.Default().
	Logger *slog.Logger
}

// Server is the fake Stripe API, an http.Handler. Its charges and
// idempotency keys live in Postgres, so several Servers on one database
// behave as one Stripe; its fault plan and Stats belong to it alone. It is
// safe for concurrent use.
type Server struct {
	api               *fakeapi.Server
	db                *pgxpool.Pool
	charges, declined atomic.Int64
}

// New returns a Server that keeps its data in db, which must already carry
// Schema (see Migrate). It starts with no faults planned.
func New(db *pgxpool.Pool, cfg Config) *Server {
	s := &Server{db: db}
	s.api = fakeapi.New(db, fakeapi.Config{
		Name:         apiName,
		Action:       "charge",
		Authenticate: authenticate,
		Stats:        func() any { return s.Stats() },
		Logger:       cfg.Logger,
	})
	s.api.Handle("POST /v1/charges", s.createCharge)
	s.api.Handle("GET /v1/charges", s.listCharges)
	s.api.Handle("GET /v1/charges/{id}", s.retrieveCharge)
	return s
}

// apiName names the server's log messages and its table of idempotency keys.
const apiName = "fakestripe"

// ServeHTTP answers the Stripe API routes under /v1 and the control routes
// /_faults and /_stats.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.api.ServeHTTP(w, r)
}

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

// Stats counts what a Server has done since New. They are the Server's own,
// not the database's: a second Server on the same database counts separately.
type Stats struct {
	// Requests is every request to a /v1 route the server serves, rejected
	// ones included.
	Requests int64 `json:"requests"`
	// Charges is the charges created.
	Charges int64 `json:"charges"`
	// Declined is the charge requests declined.
	Declined int64 `json:"declined"`
	// Replays is the requests answered from a stored idempotent result.
	Replays int64 `json:"replays"`
	// Conflicts is the requests refused with 409 because another request
	// with their idempotency key was executing.
	Conflicts int64 `json:"conflicts"`
	// FaultsInjected is the charge requests failed or dropped on purpose.
	FaultsInjected int64 `json:"faults_injected"`
}

// Stats returns the Server's counts so far.
func (s *Server) Stats() Stats {
	api := s.api.Stats()
	return Stats{
		Requests:       api.Requests,
		Charges:        s.charges.Load(),
		Declined:       s.declined.Load(),
		Replays:        api.Replays,
		Conflicts:      api.Conflicts,
		FaultsInjected: api.FaultsInjected,
	}
}
