package conformance_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/conformance"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

type order struct {
	Amount int  `json:"amount"`
	Fail   bool `json:"fail,omitempty"`
}

type orderState struct {
	ID int64 `json:"id"`
}

// orders is a workflow of two phases whose first inserts an order and takes
// a while, as a call to a payment provider would, so that a request is in
// flight long enough to be caught; its second takes a while too, as a
// receipt would, so that a restart can land after the order was counted
// and before it was answered. A request with fail set makes the first
// return an error, which Handler answers with a 500 and does not store.
func orders(t *testing.T) *phase.Workflow[order, orderState] {
	t.Helper()
	w, err := phase.NewWorkflow("orders",
		phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			if in.Req.Fail {
				return phase.Result{}, errors.New("the order cannot be created")
			}
			time.Sleep(150 * time.Millisecond)
			err := tx.QueryRow(ctx, `INSERT INTO conformance_orders (amount) VALUES ($1) RETURNING id`, in.Req.Amount).Scan(&in.State.ID)
			return phase.Next(), err
		}),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			time.Sleep(100 * time.Millisecond)
			return phase.JSON(http.StatusCreated, map[string]any{"id": in.State.ID, "amount": in.Req.Amount}), nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// setup returns a phase.Handler for orders over a database of its own,
// configured by cfg, and the check's Config for it with every optional
// input: a second caller, a failing request, the count of orders and a
// restart that cuts every connection and replaces the handler's client by
// a new one.
func setup(t *testing.T, mismatch int) conformance.Config {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE conformance_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount int)`); err != nil {
		t.Fatal(err)
	}
	var current atomic.Pointer[http.Handler]
	start := func() error {
		w := orders(t)
		c, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, w)
		if err != nil {
			return err
		}
		h, err := phase.Handler(c, w, phase.HTTPConfig[order]{
			Tenant:         func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
			MismatchStatus: mismatch,
		})
		if err != nil {
			return err
		}
		current.Store(&h)
		return nil
	}
	if err := start(); err != nil {
		t.Fatal(err)
	}
	srv, cut := loopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*current.Load()).ServeHTTP(w, r) }))
	return conformance.Config{
		URL:         srv.URL + "/orders",
		Header:      http.Header{"Authorization": {"acme"}, "Content-Type": {"application/json"}},
		Body:        []byte(`{"amount": 500}`),
		FailBody:    []byte(`{"amount": 500, "fail": true}`),
		OtherCaller: http.Header{"Authorization": {"globex"}},
		Executions:  countRows(pool, `SELECT count(*) FROM conformance_orders`),
		// As a crash does, the restart cuts every connection, and a new
		// client serves the endpoint.
		Restart: func(context.Context) error {
			cut()
			return start()
		},
	}
}

// loopback serves h on a loopback server closed when t ends, and returns
// it with cut, which closes its connections as a crash does. A crash also
// resets the connections still in the listen queue, where closing the
// server's connections reaches only those it took; the check dials a
// connection just before it restarts a server, so on a busy machine cut
// first waits (a second at most) for the server to have taken one lately.
func loopback(t *testing.T, h http.Handler) (srv *httptest.Server, cut func()) {
	t.Helper()
	srv = httptest.NewUnstartedServer(h)
	// taken is when the server last took a connection.
	var taken atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			taken.Store(time.Now().UnixNano())
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, func() {
		began := time.Now()
		for taken.Load() < began.Add(-50*time.Millisecond).UnixNano() && time.Since(began) < time.Second {
			time.Sleep(time.Millisecond)
		}
		srv.CloseClientConnections()
	}
}

func countRows(pool *pgxpool.Pool, query string) func(context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, query).Scan(&n)
		return n, err
	}
}

// phase.Handler with its defaults passes every scenario of its own profile,
// strictly, counted exactly by the orders it inserted.
func TestPhaseHandlerPassesTheAtomicPhaseProfileStrictly(t *testing.T) {
	t.Parallel()
	cfg := setup(t, 0)
	cfg.Profile, cfg.Strict = conformance.AtomicPhase(), true
	rep, err := conformance.Check(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	expectVerdicts(t, rep, nil, nil)
	if rep.Failed() {
		t.Error("the report failed")
	}
	// Every scenario ran: the handler is slow enough to catch in flight,
	// and every optional input was given.
	for _, res := range rep.Results {
		if res.Verdict == conformance.Skip {
			t.Errorf("%s skipped: %s", res.Scenario, res.Why)
		}
	}
}

// With MismatchStatus 400, phase.Handler passes the Stripe profile, run as
// subtests through Test.
func TestPhaseHandlerPassesTheStripeProfileAsSubtests(t *testing.T) {
	t.Parallel()
	cfg := setup(t, http.StatusBadRequest)
	cfg.Profile = conformance.Stripe()
	conformance.Test(t, cfg)
}

// The same handler judged by a profile it does not follow differs from it
// in exactly the scenarios where the profiles differ, the IETF profile's
// replay marker, and fails none: it is safe. With Strict the check fails.
func TestPhaseHandlerDiffersFromTheIETFProfileOnlyOnTheReplayMarker(t *testing.T) {
	t.Parallel()
	cfg := setup(t, 0)
	cfg.Profile = conformance.IETF()
	cfg.Restart, cfg.FailBody, cfg.OtherCaller = nil, nil, nil
	rep, err := conformance.Check(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	expectVerdicts(t, rep, nil, []string{"replay", "storm", "dropped-connection"})
	for _, res := range rep.Results {
		if res.Verdict == conformance.Differs && res.Why != "a replay is marked Idempotent-Replayed; the profile's marker is Idempotency-Replayed" {
			t.Errorf("%s differs for another reason than the marker: %s", res.Scenario, res.Why)
		}
	}
	if rep.Failed() {
		t.Error("a report that only differs from its profile failed without Strict")
	}
	rep.Strict = true
	if !rep.Failed() {
		t.Error("a report that differs from its profile did not fail with Strict")
	}
}

// expectVerdicts fails t unless exactly the scenarios named in failing
// failed and those in differing differ from the profile; the others passed
// or skipped. A scenario in mayFail may also fail, as a race may show in
// it. It logs the report.
func expectVerdicts(t *testing.T, rep *conformance.Report, failing, differing []string, mayFail ...string) {
	t.Helper()
	want := map[string]conformance.Verdict{}
	for _, name := range failing {
		want[name] = conformance.Fail
	}
	for _, name := range differing {
		want[name] = conformance.Differs
	}
	for _, res := range rep.Results {
		t.Logf("%-20s %-7s sent: %s\n    got: %s\n    why: %s", res.Scenario, res.Verdict, res.Sent, res.Got, res.Why)
		switch w, named := want[res.Scenario]; {
		case slices.Contains(mayFail, res.Scenario) && res.Verdict != conformance.Differs:
		case named && res.Verdict != w:
			t.Errorf("%s: %s, want %s: %s", res.Scenario, res.Verdict, w, res.Why)
		case !named && (res.Verdict == conformance.Fail || res.Verdict == conformance.Differs):
			t.Errorf("%s: %s, want pass: %s", res.Scenario, res.Verdict, res.Why)
		}
	}
	if len(rep.Results) != len(conformance.Scenarios()) {
		t.Errorf("%d results for %d scenarios", len(rep.Results), len(conformance.Scenarios()))
	}
}
