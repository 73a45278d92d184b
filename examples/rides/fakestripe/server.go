package fakestripe

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestKeyPrefix starts every API key the server accepts.
const TestKeyPrefix = "sk_test_"

// maxBodyBytes caps a request body; Stripe's own limit is far above anything
// a charge needs.
const maxBodyBytes = 1 << 20

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
	db     *pgxpool.Pool
	logger *slog.Logger
	mux    *http.ServeMux
	faults faultPlan
	stats  counters
}

// New returns a Server that keeps its data in db, which must already carry
// Schema (see Migrate). It starts with no faults planned.
func New(db *pgxpool.Pool, cfg Config) *Server {
	s := &Server{db: db, logger: cfg.Logger}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.api(s.createCharge))
	mux.HandleFunc("GET /v1/charges", s.api(s.listCharges))
	mux.HandleFunc("GET /v1/charges/{id}", s.api(s.retrieveCharge))
	mux.HandleFunc("GET /_faults", s.getFaults)
	mux.HandleFunc("POST /_faults", s.postFaults)
	mux.HandleFunc("GET /_stats", s.getStats)
	mux.HandleFunc("/", unrecognized)
	s.mux = mux
	return s
}

// ServeHTTP answers the Stripe API routes under /v1 and the control routes
// /_faults and /_stats.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// call is an authenticated API request.
type call struct {
	apiKey    string
	requestID string
}

// api authenticates a /v1 request and gives it a request ID, as Stripe does
// before any endpoint runs.
func (s *Server) api(h func(http.ResponseWriter, *http.Request, call)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.stats.requests.Add(1)
		c := call{requestID: newID("req_")}
		w.Header().Set("Request-Id", c.requestID)
		key, ok := apiKey(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="Stripe"`)
			writeResponse(w, unauthorized(key))
			return
		}
		c.apiKey = key
		r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
		h(w, r, c)
	}
}

// apiKey returns the key a request carries, as a Bearer token or as the user
// name of Basic auth (curl -u sk_test_...:), and whether it is a test key.
func apiKey(r *http.Request) (string, bool) {
	key, _, basic := r.BasicAuth()
	if !basic {
		key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		key = strings.TrimSpace(key)
	}
	return key, strings.HasPrefix(key, TestKeyPrefix) && len(key) > len(TestKeyPrefix)
}

// unauthorized is Stripe's answer to a missing or unusable API key.
func unauthorized(key string) response {
	if key == "" {
		return errorResponse(http.StatusUnauthorized, stripeError{
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
	return errorResponse(http.StatusUnauthorized, stripeError{
		Type:    "invalid_request_error",
		Message: "Invalid API Key provided: " + shown + ". This server accepts only keys starting with " + TestKeyPrefix + ".",
	})
}

// unrecognized answers a path or method the server does not serve, in
// Stripe's words.
func unrecognized(w http.ResponseWriter, r *http.Request) {
	writeResponse(w, errorResponse(http.StatusNotFound, stripeError{
		Type:    "invalid_request_error",
		Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path),
	}))
}

// response is a status and JSON body: what an executed request answers, and
// what its idempotency key stores for replay.
type response struct {
	status int
	body   []byte
}

// stripeError is the "error" object of Stripe's error responses.
type stripeError struct {
	Type        string `json:"type"`
	Code        string `json:"code,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
	Message     string `json:"message"`
	Param       string `json:"param,omitempty"`
}

func errorResponse(status int, e stripeError) response {
	return jsonResponse(status, struct {
		Error stripeError `json:"error"`
	}{e})
}

// serverError is the answer to a failure of the server itself; Stripe
// gives no detail either.
var serverError = errorResponse(http.StatusInternalServerError, stripeError{
	Type:    "api_error",
	Message: "An unknown error occurred",
})

// jsonResponse renders v as Stripe does, indented with two spaces. The types
// passed here always marshal.
func jsonResponse(status int, v any) response {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("fakestripe: marshal %T: %v", v, err))
	}
	return response{status: status, body: append(body, '\n')}
}

func writeResponse(w http.ResponseWriter, res response) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(res.status)
	_, _ = w.Write(res.body)
}

// invalidParam is a 400 naming the parameter at fault.
func invalidParam(param, code, message string) *response {
	res := errorResponse(http.StatusBadRequest, stripeError{
		Type:    "invalid_request_error",
		Code:    code,
		Message: message,
		Param:   param,
	})
	return &res
}

// unknownParam rejects the first parameter of form that allowed refuses, as
// Stripe rejects parameters it does not know rather than ignore them. It
// returns nil when every parameter is allowed.
func unknownParam(form url.Values, allowed func(string) bool) *response {
	for _, name := range slices.Sorted(maps.Keys(form)) {
		if !allowed(name) {
			return invalidParam(name, "parameter_unknown", "Received unknown parameter: "+name)
		}
	}
	return nil
}

// newID returns a fresh object ID with Stripe's type prefix.
func newID(prefix string) string {
	return prefix + rand.Text()
}

// counters back Stats.
type counters struct {
	requests, charges, declined, replays, conflicts, faults atomic.Int64
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
	return Stats{
		Requests:       s.stats.requests.Load(),
		Charges:        s.stats.charges.Load(),
		Declined:       s.stats.declined.Load(),
		Replays:        s.stats.replays.Load(),
		Conflicts:      s.stats.conflicts.Load(),
		FaultsInjected: s.stats.faults.Load(),
	}
}

func (s *Server) getStats(w http.ResponseWriter, _ *http.Request) {
	writeResponse(w, jsonResponse(http.StatusOK, s.Stats()))
}
