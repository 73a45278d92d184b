package fakeapi

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MaxBodyBytes caps a request body; Stripe's own limit is far above anything
// a fake's requests need.
const MaxBodyBytes = 1 << 20

// Config configures a Server. Name and Action are required; every other
// field may be left zero.
type Config struct {
	// Name names the fake (fakestripe). It starts the Server's log messages
	// and names the table of its idempotency keys (see KeysSchema).
	Name string
	// Action is the noun for the requests that Execute and that draw faults
	// (charge). It names the fields of /_faults: fail_before_charge and so
	// on.
	Action string
	// RequireKey makes Execute refuse with 400 a request without an
	// Idempotency-Key. By default such a request executes every time it is
	// sent, as on Stripe.
	RequireKey bool
	// Authenticate checks every API request before its handler runs and
	// returns the caller it authenticates as; each caller's idempotency keys
	// are its own. When it returns false it has answered the request itself.
	// Nil admits every request as one anonymous caller.
	Authenticate func(http.ResponseWriter, *http.Request) (caller string, ok bool)
	// Counts names the fake's own counts (charges, declined), which Count
	// adds to and Stats.Counts holds; GET /_stats answers them after
	// requests, in this order.
	Counts []string
	// Tables is the SQL that creates the fake's own tables (see Schema).
	Tables string
}

// Options are what a program that runs a fake chooses, where Config holds
// the fake's constants. The zero value is ready to use.
type Options struct {
	// Logger receives a record for every injected fault, every fault plan
	// changed over HTTP and every failed database operation. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Server is the machinery of a fake API, an http.Handler that serves the
// routes given to Handle and the control routes. Its idempotency keys live
// in Postgres, so several Servers with one Name on one database behave as
// one API; its fault plan and Stats belong to it alone. It is safe for
// concurrent use.
type Server struct {
	db     *pgxpool.Pool
	cfg    Config
	logger *slog.Logger
	mux    *http.ServeMux
	keys   keyStatements
	faults plan
	counts counters
	// made holds the counts Config.Counts names; the map does not change
	// after New.
	made map[string]*atomic.Int64
}

// New returns a Server of the fake cfg that keeps its data in db, which
// must already carry cfg.Schema() (see Config.Migrate). It starts with no
// faults planned. It panics when cfg has no Name or no Action: both are
// constants of the calling fake, so a missing one is a bug there.
func New(db *pgxpool.Pool, cfg Config, opts Options) *Server {
	if cfg.Name == "" || cfg.Action == "" {
		panic("fakeapi: Config needs a Name and an Action")
	}
	s := &Server{db: db, cfg: cfg, logger: opts.Logger, keys: newKeyStatements(cfg.Name)}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	s.made = make(map[string]*atomic.Int64, len(cfg.Counts))
	for _, name := range cfg.Counts {
		s.made[name] = new(atomic.Int64)
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /_faults", s.getFaults)
	s.mux.HandleFunc("POST /_faults", s.postFaults)
	s.mux.HandleFunc("GET /_stats", s.getStats)
	s.mux.HandleFunc("/", unrecognized)
	return s
}

// ServeHTTP answers the routes given to Handle and the control routes
// /_faults and /_stats.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// Call is an API request the Server has admitted.
type Call struct {
	// Caller is whom Config.Authenticate admitted the request as, or empty.
	Caller string
	// RequestID is the ID the request is answered under, in its Request-Id
	// header.
	RequestID string
}

// Handle serves the API route pattern (such as "POST /v1/charges") with h.
// Before h runs, as Stripe does before any endpoint, the request is counted
// in Stats.Requests, given a Request-Id, authenticated, and has its body
// capped at MaxBodyBytes.
func (s *Server) Handle(pattern string, h func(http.ResponseWriter, *http.Request, Call)) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s.counts.requests.Add(1)
		c := Call{RequestID: NewID("req_")}
		w.Header().Set("Request-Id", c.RequestID)
		if s.cfg.Authenticate != nil {
			caller, ok := s.cfg.Authenticate(w, r)
			if !ok {
				return
			}
			c.Caller = caller
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		h(w, r, c)
	})
}

// Fail answers 500 for a failure of the server itself, and logs err. When
// the client has gone it answers nothing, as nobody would read it.
func (s *Server) Fail(w http.ResponseWriter, c Call, err error) {
	s.fail(w, s.logger.With(slog.String("request_id", c.RequestID)), err)
}

func (s *Server) fail(w http.ResponseWriter, log *slog.Logger, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	log.Error(s.cfg.Name+": request failed", slog.Any("error", err))
	Write(w, ServerError)
}

// NewID returns a fresh object ID with a type prefix, as Stripe makes them
// (ch_..., req_...).
func NewID(prefix string) string {
	return prefix + rand.Text()
}

// counters back Stats.
type counters struct {
	requests, replays, conflicts, faults atomic.Int64
}

// Stats counts what a Server has done since New. They are the Server's own,
// not the database's: a second Server on the same database counts
// separately.
type Stats struct {
	// Requests is every request to a route given to Handle, rejected ones
	// included.
	Requests int64 `json:"requests"`
	// Replays is the requests answered from a stored response.
	Replays int64 `json:"replays"`
	// Conflicts is the requests refused with 409 because another request
	// with their idempotency key was executing.
	Conflicts int64 `json:"conflicts"`
	// FaultsInjected is the requests failed or dropped on purpose.
	FaultsInjected int64 `json:"faults_injected"`
	// Counts are the fake's own counts (Config.Counts) by name. GET /_stats
	// answers them as members of its object, after requests.
	Counts map[string]int64 `json:"-"`
}

// Stats returns the Server's counts so far.
func (s *Server) Stats() Stats {
	counts := make(map[string]int64, len(s.made))
	for name, c := range s.made {
		counts[name] = c.Load()
	}
	return Stats{
		Requests:       s.counts.requests.Load(),
		Replays:        s.counts.replays.Load(),
		Conflicts:      s.counts.conflicts.Load(),
		FaultsInjected: s.counts.faults.Load(),
		Counts:         counts,
	}
}

// Count adds one to the fake's own count name, one of Config.Counts (see
// Stats.Counts). It panics for any other name, a bug in the calling fake.
func (s *Server) Count(name string) {
	s.made[name].Add(1)
}

// getStats serves GET /_stats: Stats, with the fake's own counts after
// requests.
func (s *Server) getStats(w http.ResponseWriter, _ *http.Request) {
	st := s.Stats()
	fields := jsonObject{{"requests", st.Requests}}
	for _, name := range s.cfg.Counts {
		fields = append(fields, jsonField{name, st.Counts[name]})
	}
	fields = append(fields, jsonField{"replays", st.Replays}, jsonField{"conflicts", st.Conflicts},
		jsonField{"faults_injected", st.FaultsInjected})
	Write(w, JSON(http.StatusOK, fields))
}

// Retrieve answers a request for the object of kind (charge) whose ID is
// the path's {id}, once the planned Delay has passed: with what find returns
// for the ID, as JSON, or with NotFound when find returns pgx.ErrNoRows.
func (s *Server) Retrieve(w http.ResponseWriter, r *http.Request, c Call, kind string, find func(ctx context.Context, id string) (any, error)) {
	ctx := r.Context()
	if err := s.Delay(ctx); err != nil {
		return // the client has gone
	}
	id := r.PathValue("id")
	object, err := find(ctx, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		Write(w, NotFound(kind, id))
	case err != nil:
		s.Fail(w, c, err)
	default:
		Write(w, JSON(http.StatusOK, object))
	}
}

// DB returns the database the Server keeps its idempotency keys in, which
// is its fake's database too.
func (s *Server) DB() *pgxpool.Pool { return s.db }
