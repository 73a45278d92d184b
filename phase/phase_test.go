package phase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestCrashesAndPairedFaultsAtEveryPointConvergeToOneChargePerKey(t *testing.T) {
	t.Parallel()
	for _, route := range pgtest.Routes() {
		for _, express := range []bool{false, true} {
			name := "standard"
			if express {
				name = "express"
			}
			t.Run(route.Name+"/"+name, func(t *testing.T) {
				t.Parallel()
				crashMatrix(t, route.PoolWith(t, nil), express)
			})
		}
	}
}

// crashMatrix crashes the orders workflow at every fault point, and pairs
// each point with a concurrent duplicate, a takeover and a completer pass,
// and checks that each key converges to one order, one charge and the right
// phases.
func crashMatrix(t *testing.T, db *pgxpool.Pool, express bool) {
	e := setupPool(t, db, func(c *phase.Config) {
		c.Completer = recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}
	})
	cfg := phasetest.Config[order, orderState]{
		Client:        e.c,
		DB:            e.db,
		Workflow:      e.w,
		WithCompleter: true,
		Request:       func(string) order { return order{Item: "lamp", Amount: 2000, Express: express} },
		Check: func(t testing.TB, s phasetest.Scenario) {
			orders, orderID := e.orderCount(t, s.Key)
			if orders != 1 {
				t.Fatalf("%s: %d orders, want 1", s.Key, orders)
			}
			if n := e.pay.chargesFor(orderID); n != 1 {
				t.Fatalf("%s: %d charges, want 1", s.Key, n)
			}
			var packed, receipt bool
			if err := e.db.QueryRow(context.Background(), `SELECT packed, receipt FROM orders WHERE id = $1`, orderID).Scan(&packed, &receipt); err != nil {
				t.Fatal(err)
			}
			if packed == express || !receipt {
				t.Fatalf("%s: packed=%v receipt=%v for express=%v", s.Key, packed, receipt, express)
			}
		},
	}
	t.Run("crashes", func(t *testing.T) { phasetest.CrashMatrix(t, cfg) })
	t.Run("pairs", func(t *testing.T) { phasetest.PairMatrix(t, cfg) })
}

func TestFaultPointsCoverEveryStage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	points, _ := phasetest.Points(t, phasetest.Config[order, orderState]{
		Client: e.c, Workflow: e.w, Request: func(string) order { return order{Item: "lamp", Amount: 1} },
	}, "discover")
	seen := map[phase.Stage]bool{}
	for _, p := range points {
		seen[p.Stage] = true
	}
	for _, s := range []phase.Stage{phase.BeforeTx, phase.BeforeCall, phase.InCall, phase.AfterCall, phase.BeforeCommit, phase.AfterCommit, phase.BeforeResponse} {
		if !seen[s] {
			t.Errorf("no fault point at stage %s in %v", s, points)
		}
	}
	if points[len(points)-1] != (phase.Point{Phase: "receipt_sent", Stage: phase.BeforeResponse}) {
		t.Errorf("last point = %v, want receipt_sent/before_response", points[len(points)-1])
	}
}

func Test100ConcurrentIdenticalRequestsExecuteOnce(t *testing.T) {
	t.Parallel()
	for _, route := range pgtest.Routes() {
		t.Run(route.Name, func(t *testing.T) {
			t.Parallel()
			concurrentIdenticalRequests(t, route.PoolWith(t, func(cfg *pgxpool.Config) {
				cfg.MaxConns = 40
			}))
		})
	}
}

// concurrentIdenticalRequests sends 100 identical requests at once and
// checks that one ran, the others got 409 or its replay, and one charge was
// made.
func concurrentIdenticalRequests(t *testing.T, db *pgxpool.Pool) {
	e := setupPool(t, db)
	e.pay.delay = 50 * time.Millisecond
	h := e.handler(t)

	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
		codes = map[int]int{}
		first []byte
		fresh int
	)
	for range 100 {
		wg.Go(func() {
			<-start
			rec := post(h, "same-key", `{"item":"lamp","amount":2000}`)
			mu.Lock()
			defer mu.Unlock()
			codes[rec.Code]++
			if rec.Code == http.StatusCreated {
				if rec.Header().Get(phase.ReplayedHeader) == "" {
					fresh++
				}
				if first == nil {
					first = rec.Body.Bytes()
				} else if string(first) != rec.Body.String() {
					t.Errorf("two different 201 bodies: %q and %q", first, rec.Body.String())
				}
			} else if rec.Code == http.StatusConflict && rec.Header().Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After")
			}
		})
	}
	close(start)
	wg.Wait()
	if codes[http.StatusCreated]+codes[http.StatusConflict] != 100 || fresh != 1 {
		t.Fatalf("status codes %v with %d fresh 201s; want only 201 and 409, one fresh", codes, fresh)
	}
	orders, orderID := e.orderCount(t, "same-key")
	if orders != 1 || e.pay.chargesFor(orderID) != 1 || e.pay.total() != 1 {
		t.Fatalf("%d orders, %d charges; want one of each", orders, e.pay.total())
	}
	// Once finished, every duplicate replays.
	if rec := post(h, "same-key", `{"item":"lamp","amount":2000}`); rec.Code != http.StatusCreated || rec.Body.String() != string(first) {
		t.Fatalf("late retry: %d %q", rec.Code, rec.Body.String())
	}
}

func TestWaitForInFlightReplaysInsteadOfConflict(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *phase.Config) { c.WaitForInFlight = 5 * time.Second })
	e.pay.delay = 200 * time.Millisecond
	h := e.handler(t)
	var wg sync.WaitGroup
	recs := make([]int, 5)
	for i := range recs {
		wg.Go(func() { recs[i] = post(h, "wait-key", `{"item":"lamp","amount":5}`).Code })
	}
	wg.Wait()
	for i, code := range recs {
		if code != http.StatusCreated {
			t.Fatalf("request %d: %d, want 201 (waited and replayed)", i, code)
		}
	}
	if e.pay.total() != 1 {
		t.Fatalf("%d charges, want 1", e.pay.total())
	}
}

func TestReplayIsByteIdenticalAndMarked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.handler(t)
	first := post(h, "k1", `{"item":"lamp","amount":2000}`)
	if first.Code != http.StatusCreated || first.Header().Get(phase.ReplayedHeader) != "" {
		t.Fatalf("first: %d replayed=%q", first.Code, first.Header().Get(phase.ReplayedHeader))
	}
	// Same meaning, other spelling and key order.
	again := post(h, `"k1"`, "{ \"amount\": 2000,\n \"item\":\t\"lamp\" }")
	if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() ||
		again.Header().Get(phase.ReplayedHeader) != "true" || again.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("replay: %d %q %v; want identical to %q with Idempotent-Replayed", again.Code, again.Body.String(), again.Header(), first.Body.String())
	}
}

func TestKeyReusedWithAnotherPayloadIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct {
		name   string
		status int
	}{{"ietf", 0}, {"stripe", http.StatusBadRequest}} {
		h := e.handler(t, func(c *phase.HTTPConfig[order]) { c.MismatchStatus = tc.status })
		key := "reuse-" + tc.name
		if rec := post(h, key, `{"item":"lamp","amount":1}`); rec.Code != http.StatusCreated {
			t.Fatalf("%s first: %d", tc.name, rec.Code)
		}
		rec := post(h, key, `{"item":"lamp","amount":2}`)
		want := tc.status
		if want == 0 {
			want = http.StatusUnprocessableEntity
		}
		if rec.Code != want || rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Fatalf("%s mismatch: %d %s, want %d problem", tc.name, rec.Code, rec.Header().Get("Content-Type"), want)
		}
	}
	if e.pay.total() != 2 {
		t.Fatalf("%d charges, want 2 (one per first use)", e.pay.total())
	}
}

func TestBadRequestsAreAnsweredAndNotStored(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.handler(t, func(c *phase.HTTPConfig[order]) { c.MaxBodyBytes = 64 })
	for _, tc := range []struct {
		name, key, body string
		status          int
		detail          string
	}{
		{"missing key", "", `{"item":"lamp","amount":1}`, 400, "missing"},
		{"bad key", "bad key\x01", `{"item":"lamp","amount":1}`, 400, "invalid"},
		{"unterminated quote", `"abc`, `{"item":"lamp","amount":1}`, 400, "quote"},
		{"not json", "k-json", `{item:`, 400, "JSON"},
		{"unknown field", "k-field", `{"item":"lamp","amount":1,"coupon":"x"}`, 400, "coupon"},
		{"too large", "k-large", `{"item":"` + strings.Repeat("a", 100) + `"}`, 413, "larger"},
	} {
		rec := post(h, tc.key, tc.body)
		var p struct{ Detail string }
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		if rec.Code != tc.status || !strings.Contains(p.Detail, tc.detail) {
			t.Errorf("%s: %d %q, want %d mentioning %q", tc.name, rec.Code, p.Detail, tc.status, tc.detail)
		}
	}
	var n int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d keys stored for rejected requests (%v), want 0", n, err)
	}
	noAuth := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"lamp","amount":1}`))
	noAuth.Header.Set("Idempotency-Key", "k-auth")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, noAuth)
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "Authorization") {
		t.Fatalf("no tenant: %d %s, want 401 saying what to send", rec.Code, rec.Body.String())
	}
}

func TestServerErrorIsNotStoredAndTheRetryResumes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.pay.fail = func(string) error { return errBeforeCharge }
	h := e.handler(t)
	rec := post(h, "k1", `{"item":"lamp","amount":300}`)
	if rec.Code != http.StatusInternalServerError || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("provider down: %d %s, want 500 problem", rec.Code, rec.Header().Get("Content-Type"))
	}
	var rp string
	var status *int
	var locked *time.Time
	if err := e.db.QueryRow(context.Background(),
		`SELECT recovery_point, response_status, lock_expires_at FROM idempotency_keys WHERE idempotency_key = 'k1'`).Scan(&rp, &status, &locked); err != nil {
		t.Fatal(err)
	}
	if rp != "order_created" || status != nil || locked != nil {
		t.Fatalf("after 500: recovery point %q, stored status %v, lease %v; want order_created, nothing stored, lease free", rp, status, locked)
	}
	e.pay.fail = nil
	if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusCreated {
		t.Fatalf("retry: %d %s", rec.Code, rec.Body.String())
	}
	orders, orderID := e.orderCount(t, "k1")
	if orders != 1 || e.pay.chargesFor(orderID) != 1 {
		t.Fatalf("%d orders, %d charges after resume; want 1 and 1", orders, e.pay.chargesFor(orderID))
	}
	if e.events.Count(keyrow.EventResumed) != 1 || e.events.Count(keyrow.EventFailed) != 1 {
		t.Fatalf("events resumed=%d failed=%d, want 1 and 1", e.events.Count(keyrow.EventResumed), e.events.Count(keyrow.EventFailed))
	}
}

func TestUnknownOutcomeOfRepeatableCallIsRepeatedWithTheSameKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.pay.fail = func(string) error { return errAfterCharge }
	h := e.handler(t)
	if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("timeout after charge: %d, want 503 with Retry-After", rec.Code)
	}
	e.pay.fail = nil
	if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusCreated {
		t.Fatalf("retry: %d %s", rec.Code, rec.Body.String())
	}
	_, orderID := e.orderCount(t, "k1")
	if e.pay.chargesFor(orderID) != 1 {
		t.Fatalf("%d charges, want 1", e.pay.chargesFor(orderID))
	}
	e.pay.mu.Lock()
	defer e.pay.mu.Unlock()
	for key, n := range e.pay.calls {
		if n != 2 {
			t.Fatalf("downstream key %s called %d times, want 2 (the call and its repeat)", key, n)
		}
	}
}

func TestUnknownOutcomeOfUnrepeatableCallParksTheKey(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	calls := 0
	w, err := phase.NewWorkflow("notify",
		phase.Foreign("sent",
			func(ctx context.Context, in *phase.Input[order, struct{}]) (string, error) {
				calls++
				return "", phase.MaybeHappened(errors.New("SMTP connection dropped after DATA"))
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], _ string) (phase.Result, error) {
				return phase.JSON(200, "sent"), nil
			}))
	if err != nil {
		t.Fatal(err)
	}
	rn, err := phase.NewClient(db, nil, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Run(ctx, rn, "acme", "k1", order{Item: "x"}); !errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("first run: %v, want ErrOutcomeUnknown", err)
	}
	out, err := w.Run(ctx, rn, "acme", "k1", order{Item: "x"})
	if err != nil || out.Kind != phase.OutcomeOnHold || out.Hold != keyrow.HoldUnknown {
		t.Fatalf("retry: %+v %v, want parked awaiting reconciliation", out, err)
	}
	if calls != 1 {
		t.Fatalf("%d calls, want 1: an unrepeatable call must not be repeated blindly", calls)
	}
}

func TestLostLeaseStopsTheRunWithoutCommitting(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "it steals the lease with an UPDATE calling gen_random_uuid(), which Citus refuses; the Citus route's pair matrix covers takeovers")
	db := pgtest.Pool(t)
	if _, err := db.Exec(context.Background(), `CREATE TABLE notes (n text)`); err != nil {
		t.Fatal(err)
	}
	w, err := phase.NewWorkflow("steal",
		phase.Foreign("called",
			func(ctx context.Context, in *phase.Input[order, struct{}]) (string, error) {
				// Another run takes the key over while this call is out.
				_, err := db.Exec(ctx, `UPDATE idempotency_keys SET lock_token = gen_random_uuid() WHERE id = $1`, in.ID)
				return "done", err
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], _ string) (phase.Result, error) {
				_, err := tx.Exec(ctx, `INSERT INTO notes VALUES ('recorded')`)
				return phase.JSON(200, "ok"), err
			}))
	if err != nil {
		t.Fatal(err)
	}
	events := &phasetest.Events{}
	rn, err := phase.NewClient(db, &phase.Config{Hooks: []phase.Hook{events}}, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Run(context.Background(), rn, "acme", "k1", order{}); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("run = %v, want ErrLeaseLost", err)
	}
	var notes int
	var rp string
	if err := db.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM notes), recovery_point FROM idempotency_keys`).Scan(&notes, &rp); err != nil {
		t.Fatal(err)
	}
	if notes != 0 || rp != keyrow.Started || events.Count(keyrow.EventLeaseLost) != 1 {
		t.Fatalf("notes=%d recovery point %q lease-lost events %d; want nothing committed", notes, rp, events.Count(keyrow.EventLeaseLost))
	}
}

func TestSerializationFailureIsRetriedBounded(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	attempts := 0
	failures := 2
	w, err := phase.NewWorkflow("flaky",
		phase.Local("done", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{ Tries int }]) (phase.Result, error) {
			attempts++
			in.State.Tries++
			if attempts <= failures {
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
				return phase.Result{}, err
			}
			return phase.JSON(200, in.State.Tries), nil
		}).Isolation(pgx.Serializable))
	if err != nil {
		t.Fatal(err)
	}
	events := &phasetest.Events{}
	rn, err := phase.NewClient(db, &phase.Config{Hooks: []phase.Hook{events}, MaxPhaseRetries: 3}, w)
	if err != nil {
		t.Fatal(err)
	}
	out, err := w.Run(context.Background(), rn, "acme", "k1", order{})
	if err != nil {
		t.Fatal(err)
	}
	// State changes of failed attempts are discarded: the answer is 1.
	if string(out.Response.Body) != "1\n" || attempts != 3 || events.Count(keyrow.EventRetried) != 2 {
		t.Fatalf("body %q after %d attempts, %d retries; want 1 after 3 attempts and 2 retries", out.Response.Body, attempts, events.Count(keyrow.EventRetried))
	}

	attempts, failures = 0, 100
	if _, err := w.Run(context.Background(), rn, "acme", "k2", order{}); err == nil || attempts != 4 {
		t.Fatalf("always failing: err %v after %d attempts, want an error after 4", err, attempts)
	}
}

func TestStoreUnreachableFailsClosedBeforeAnySideEffect(t *testing.T) {
	t.Parallel()
	db, err := pgxpool.New(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	e := setupPool(t, db)
	h := e.handler(t)
	db.Close()
	rec := post(h, "k1", `{"item":"lamp","amount":1}`)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("closed pool: %d, want 503 problem", rec.Code)
	}
	if e.pay.total() != 0 {
		t.Fatalf("%d charges with the store down, want 0", e.pay.total())
	}
}

func TestWorkflowDeclarationErrors(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, pgx.Tx, *phase.Input[order, struct{}]) (phase.Result, error) {
		return phase.Next(), nil
	}
	for _, tc := range []struct {
		name   string
		phases []phase.Phase[order, struct{}]
	}{
		{"no phases", nil},
		{"reserved started", []phase.Phase[order, struct{}]{phase.Local("started", noop)}},
		{"reserved finished", []phase.Phase[order, struct{}]{phase.Local("finished", noop)}},
		{"duplicate", []phase.Phase[order, struct{}]{phase.Local("a", noop), phase.Local("a", noop)}},
		{"empty name", []phase.Phase[order, struct{}]{phase.Local("", noop)}},
		{"repeatable local", []phase.Phase[order, struct{}]{phase.Local("a", noop).Repeatable()}},
		{"reconciled local", []phase.Phase[order, struct{}]{phase.Reconciled(phase.Local("a", noop),
			func(context.Context, *phase.Input[order, struct{}]) (int, phase.Verdict, error) {
				return 0, phase.Happened, nil
			},
			func(context.Context, pgx.Tx, *phase.Input[order, struct{}], int) (phase.Result, error) {
				return phase.Next(), nil
			})}},
	} {
		if _, err := phase.NewWorkflow("w", tc.phases...); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
}

func TestWorkflowWithoutResponseFailsInsteadOfCommitting(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	w, err := phase.NewWorkflow("mute", phase.Local("only", func(context.Context, pgx.Tx, *phase.Input[order, struct{}]) (phase.Result, error) {
		return phase.Next(), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	rn, err := phase.NewClient(db, nil, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Run(context.Background(), rn, "acme", "k1", order{}); !errors.Is(err, phase.ErrNoResponse) {
		t.Fatalf("run = %v, want ErrNoResponse", err)
	}
	var rp string
	if err := db.QueryRow(context.Background(), `SELECT recovery_point FROM idempotency_keys`).Scan(&rp); err != nil || rp != keyrow.Started {
		t.Fatalf("recovery point %q (%v), want started: the phase must not commit", rp, err)
	}
}

// A phase's When is asked once per run at each point it could apply: the
// commit before it decides which phase comes next, and the run goes on
// there without asking again.
func TestWhenIsAskedOnceWhereThePhaseCouldApply(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32
	w, err := phase.NewWorkflow("asked",
		phase.Local("first", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			return phase.Next(), nil
		}),
		phase.Local("maybe", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			return phase.Next(), nil
		}).When(func(in *phase.Input[order, orderState]) bool {
			asked.Add(1)
			return !in.Req.Express
		}),
		phase.Local("last", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, "done"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pgtest.Pool(t), &phase.Config{Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, express := range []bool{false, true} {
		asked.Store(0)
		key := fmt.Sprintf("express-%t", express)
		out, err := w.Run(context.Background(), c, "acme", key, order{Item: "lamp", Express: express})
		if err != nil || out.Kind != phase.OutcomeNew {
			t.Fatalf("%s: %+v %v", key, out, err)
		}
		if n := asked.Load(); n != 1 {
			t.Errorf("%s: When asked %d times, want once", key, n)
		}
	}
}
