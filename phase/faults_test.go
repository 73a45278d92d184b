package phase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// keyState reads what a key's row says about a run that did not finish.
func (e *env) keyState(t testing.TB, key string) (rp string, stored bool, leased bool) {
	t.Helper()
	err := e.db.QueryRow(context.Background(), `
		SELECT recovery_point, response_status IS NOT NULL, lock_expires_at > now() IS TRUE
		FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&rp, &stored, &leased)
	if err != nil {
		t.Fatal(err)
	}
	return rp, stored, leased
}

// problemType returns the type of a problem+json answer.
func problemType(t testing.TB, rec *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("answer %d has Content-Type %q, want application/problem+json: %s", rec.Code, ct, rec.Body.String())
	}
	var p struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(p.Type, "urn:atomicphase:problem:")
}

// TestPanicInUserCodeFreesTheKeyAndLeavesNothingRunning is not parallel, so
// that goleak sees only its own goroutines.
func TestPanicInUserCodeFreesTheKeyAndLeavesNothingRunning(t *testing.T) {
	for _, where := range []string{"local", "call", "record", "when", "decode", "tenant"} {
		t.Run(where, func(t *testing.T) {
			// Registered first, so it runs after every other cleanup has
			// closed the test's pools.
			t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
			e := setup(t)
			var armed atomic.Bool
			armed.Store(true)
			boom := func(at string) {
				if at == where && armed.Load() {
					panic("boom in " + at)
				}
			}
			type run = phase.Input[order, orderState]
			w, err := phase.NewWorkflow("orders",
				phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
					err := tx.QueryRow(ctx, `INSERT INTO orders (ikey, item, amount) VALUES ($1, $2, $3) RETURNING id`,
						in.Key, in.Req.Item, in.Req.Amount).Scan(&in.State.OrderID)
					boom("local")
					return phase.Next(), err
				}),
				phase.Foreign("charged",
					func(ctx context.Context, in *run) (string, error) {
						id, err := e.pay.Charge(ctx, in.DownstreamKey(), in.State.OrderID, in.Req.Amount)
						boom("call")
						return id, err
					},
					func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
						boom("record")
						in.State.ChargeID = id
						return phase.JSON(http.StatusCreated, in.State), nil
					}).Repeatable().When(func(in *run) bool { boom("when"); return true }),
			)
			if err != nil {
				t.Fatal(err)
			}
			c, err := phase.NewClient(e.db, &phase.Config{Logger: quiet, LeaseTTL: time.Hour}, w)
			if err != nil {
				t.Fatal(err)
			}
			h, err := phase.Handler(c, w, phase.HTTPConfig[order]{
				Tenant: func(r *http.Request) (string, error) { boom("tenant"); return "acme", nil },
				Decode: func(r *http.Request) (order, error) { boom("decode"); return phase.DecodeJSON[order](r) },
			})
			if err != nil {
				t.Fatal(err)
			}
			rec := post(h, "k1", `{"item":"lamp","amount":300}`)
			if rec.Code != http.StatusInternalServerError || problemType(t, rec) != "internal-error" {
				t.Fatalf("panic in %s: %d %s, want 500 internal-error", where, rec.Code, rec.Body.String())
			}
			if where == "decode" || where == "tenant" {
				var n int
				if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
					t.Fatalf("%d keys stored after a panic before the run, %v; want none", n, err)
				}
			} else if _, stored, leased := e.keyState(t, "k1"); stored || leased {
				// The lease is an hour long: only the run itself can have
				// freed it.
				t.Fatalf("after a panic in %s: stored=%v leased=%v; want nothing stored and the lease freed", where, stored, leased)
			}
			armed.Store(false)
			if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusCreated {
				t.Fatalf("retry after a panic in %s: %d %s", where, rec.Code, rec.Body.String())
			}
			if _, orderID := e.orderCount(t, "k1"); e.pay.chargesFor(orderID) != 1 {
				t.Fatalf("%d charges, want 1", e.pay.chargesFor(orderID))
			}
		})
	}
}

func TestPanicInReconcileLeavesTheKeyForTheNextPass(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	var panics atomic.Bool
	panics.Store(true)
	type run = phase.Input[order, struct{}]
	record := func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
		return phase.JSON(200, id), nil
	}
	p := phase.Reconciled(phase.Foreign("sent",
		func(ctx context.Context, in *run) (string, error) {
			return "", phase.MaybeHappened(errors.New("connection dropped"))
		}, record),
		func(ctx context.Context, in *run) (string, phase.Verdict, error) {
			if panics.Swap(false) {
				panic("reconcile bug")
			}
			return "msg-1", phase.Happened, nil
		}, record)
	w, err := phase.NewWorkflow("notify", p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet, Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Run(ctx, c, "acme", "k1", order{}); !errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("first run: %v", err)
	}
	// The first pass's reconcile panics; the key stays on hold and the
	// next pass completes it.
	res, err := c.Complete(ctx)
	if err != nil || res.Failed != 1 || res.Completed != 1 {
		t.Fatalf("passes: %+v %v, want one failure from the panic, then the key completed", res, err)
	}
}

func TestHungForeignCallIsCutAtItsLimitAndRepeatedWithTheSameKey(t *testing.T) {
	t.Parallel()
	var hang atomic.Bool
	hang.Store(true)
	e := setup(t, func(c *phase.Config) { c.CallTimeout = 200 * time.Millisecond; c.LeaseTTL = time.Hour })
	e.pay.fail = func(string) error {
		if hang.Load() {
			return errHang
		}
		return nil
	}
	h := e.handler(t)
	start := time.Now()
	rec := post(h, "k1", `{"item":"lamp","amount":300}`)
	if rec.Code != http.StatusServiceUnavailable || problemType(t, rec) != "outcome-unknown" || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("hung call: %d %s, want 503 outcome-unknown with Retry-After", rec.Code, rec.Body.String())
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("a hung call held the request for %v", took)
	}
	if rp, stored, leased := e.keyState(t, "k1"); rp != "order_created" || stored || leased {
		t.Fatalf("after the cut: rp=%s stored=%v leased=%v; want resumable at order_created", rp, stored, leased)
	}
	hang.Store(false)
	if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusCreated {
		t.Fatalf("retry: %d %s", rec.Code, rec.Body.String())
	}
	e.pay.mu.Lock()
	defer e.pay.mu.Unlock()
	if len(e.pay.calls) != 1 {
		t.Fatalf("calls by downstream key %v, want every call under one key", e.pay.calls)
	}
}

// errHang makes payments.Charge block until its context ends.
var errHang = errors.New("hang")

func TestHungUnrepeatableCallIsHeldForReconciliation(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	w, err := phase.NewWorkflow("notify", phase.Foreign("sent",
		func(ctx context.Context, in *phase.Input[order, struct{}]) (string, error) {
			<-ctx.Done() // a provider that never answers
			return "", ctx.Err()
		},
		func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], id string) (phase.Result, error) {
			return phase.JSON(200, id), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet, CallTimeout: 100 * time.Millisecond}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Run(ctx, c, "acme", "k1", order{}); !errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("hung call: %v, want an unknown outcome", err)
	}
	out, err := w.Run(ctx, c, "acme", "k1", order{})
	if err != nil || out.Kind != phase.OutcomeOnHold || out.Hold != keyrow.HoldUnknown {
		t.Fatalf("retry: %+v %v, want on hold for reconciliation", out, err)
	}
}

func TestCompleterPassIsBoundedPerKey(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	var calls atomic.Int32
	w := stallWorkflow(t, func() { calls.Add(1) })
	// Long enough that taking the lease fits in it on a loaded machine.
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet, RunTimeout: 2 * time.Second,
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: time.Hour}}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Run(ctx, c, "acme", "k1", order{}); !errors.Is(err, phase.ErrRunTimeout) {
		t.Fatalf("first run: %v, want ErrRunTimeout", err)
	}
	start := time.Now()
	res, err := c.Complete(ctx)
	if err != nil || res.Claimed != 1 || res.Failed != 1 {
		t.Fatalf("pass: %+v %v, want the stalled key claimed and failed", res, err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("one stalled key held the pass for %v", took)
	}
	if calls.Load() != 2 {
		t.Fatalf("%d runs, want 2", calls.Load())
	}
	// A run past its time limit failed the key, unlike one cut short by a
	// stop (TestStopLetsTheCompletersKeysFinish).
	row, err := c.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if row.Failures != 1 {
		t.Fatalf("the key counts %d failures after the completer's run timed out; want 1", row.Failures)
	}
}

// TestPausedHolderDoesNotSendItsCallAfterATakeover: process A commits its
// first phase and stalls past its lease before the foreign call; B takes the
// key over and finishes it; when A wakes it must not call the provider, even
// one that ignores idempotency keys.
func TestPausedHolderDoesNotSendItsCallAfterATakeover(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	var calls atomic.Int32
	w := payoutWorkflow(t, func(ctx context.Context) (int32, error) {
		return calls.Add(1), nil // a provider that ignores idempotency keys
	})
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet, LeaseTTL: time.Second}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	paused, resume := make(chan struct{}), make(chan struct{})
	pause := phase.InjectorFunc(func(ctx context.Context, at phase.Point) error {
		if at == (phase.Point{Phase: "paid", Stage: phase.BeforeCall}) {
			close(paused)
			<-resume
		}
		return nil
	})
	var aErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, aErr = w.Run(phase.WithInjector(ctx, pause), c, "acme", "k1", order{})
	}()
	<-paused
	// A is frozen past its lease; B takes the key over once it expires.
	var out *phase.Outcome
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, err = w.Run(ctx, c, "acme", "k1", order{})
		if err != nil {
			t.Fatal(err)
		}
		if out.Kind != phase.OutcomeInFlight || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out.Kind != phase.OutcomeResumed {
		t.Fatalf("B: %v, want it to resume the expired key", out.Kind)
	}
	close(resume)
	<-done
	if !errors.Is(aErr, keyrow.ErrLeaseLost) {
		t.Fatalf("A after waking: %v, want ErrLeaseLost", aErr)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the provider saw %d calls, want 1: a holder that lost its lease must not call", n)
	}
}

// TestTakenOverHolderThatMeetsTheNewHoldersRowsIsToldItLostTheKey: request
// A stalls before its first phase; its lease runs out and a retry, B, runs
// the key to its end. When A wakes, its phase meets the order B inserted
// (a unique violation). That is not the key's failure: A must answer 409
// "in progress" as any run that lost its lease does, not 500, and must not
// record B's key as failed.
func TestTakenOverHolderThatMeetsTheNewHoldersRowsIsToldItLostTheKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	paused, resume := make(chan struct{}), make(chan struct{})
	h := e.handler(t)
	stall := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pause := phase.InjectorFunc(func(ctx context.Context, at phase.Point) error {
			if at == (phase.Point{Phase: "order_created", Stage: phase.BeforeTx}) {
				close(paused)
				<-resume
			}
			return nil
		})
		h.ServeHTTP(w, r.WithContext(phase.WithInjector(r.Context(), pause)))
	})
	var a *httptest.ResponseRecorder
	done := make(chan struct{})
	go func() {
		defer close(done)
		a = post(stall, "k1", `{"item":"lamp","amount":300}`)
	}()
	<-paused
	// A's lease runs out while it is stalled; B takes the key over.
	if _, err := e.c.Unlock(ctx, "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	b := post(h, "k1", `{"item":"lamp","amount":300}`)
	if b.Code != http.StatusCreated {
		t.Fatalf("B: %d %s, want 201", b.Code, b.Body.String())
	}
	close(resume)
	<-done
	if a.Code != http.StatusConflict || problemType(t, a) != "request-in-progress" {
		t.Fatalf("A after waking: %d %s, want 409 request-in-progress", a.Code, a.Body.String())
	}
	if n := e.events.Count(keyrow.EventFailed); n != 0 {
		t.Fatalf("%d runs reported failed, want none: A lost its lease", n)
	}
	if n := e.events.Count(keyrow.EventLeaseLost); n != 1 {
		t.Fatalf("%d lease-lost events, want A's", n)
	}
	row, err := e.c.Inspect(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if row.FinishedAt == nil || row.LastError != "" {
		t.Fatalf("key after both: finished %v, last error %q; want B's finish untouched", row.FinishedAt, row.LastError)
	}
	if orders, _ := e.orderCount(t, "k1"); orders != 1 || e.pay.total() != 1 {
		t.Fatalf("%d orders, %d charges; want one of each", orders, e.pay.total())
	}
}

// TestClientRetryingThroughAnOutageIsNeverBuried: the provider is down and
// the client keeps retrying, more times than the completer's MaxAttempts;
// the key must stay the client's, and converge once the provider is back.
func TestClientRetryingThroughAnOutageIsNeverBuried(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *phase.Config) {
		c.Completer = recovery.CompleterConfig{MaxAttempts: 3, StuckAfter: time.Minute, Backoff: -1}
	})
	e.pay.fail = func(string) error { return errBeforeCharge }
	h := e.handler(t)
	for i := range 12 {
		if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusInternalServerError {
			t.Fatalf("retry %d during the outage: %d %s", i, rec.Code, rec.Body.String())
		}
		if res, err := e.c.Complete(context.Background()); err != nil || res.Dead != 0 {
			t.Fatalf("completer pass after retry %d: %+v %v; want nothing buried", i, res, err)
		}
	}
	e.pay.fail = nil
	if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusCreated {
		t.Fatalf("retry after the outage: %d %s, want 201", rec.Code, rec.Body.String())
	}
}

func TestRequestsThatCanNeverBeStoredAre400(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.handler(t, func(c *phase.HTTPConfig[order]) {
		c.Tenant = func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }
	})
	send := func(tenant, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		r.Header.Set("Authorization", tenant)
		r.Header.Set("Idempotency-Key", "k1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	for name, rec := range map[string]*httptest.ResponseRecorder{
		"NUL in a string": send("acme", `{"item":"la\u0000mp","amount":300}`),
		"empty tenant":    send("", `{"item":"lamp","amount":300}`),
		"long tenant":     send(strings.Repeat("a", 256), `{"item":"lamp","amount":300}`),
	} {
		if rec.Code != http.StatusBadRequest || problemType(t, rec) != "invalid-request" || rec.Header().Get("Retry-After") != "" {
			t.Errorf("%s: %d %s, want 400 invalid-request without Retry-After", name, rec.Code, rec.Body.String())
		}
	}
	// An escaped backslash before "u0000" is text, not a NUL.
	if rec := send("acme", `{"item":"la\\u0000mp","amount":300}`); rec.Code != http.StatusCreated {
		t.Errorf("escaped backslash: %d %s, want 201", rec.Code, rec.Body.String())
	}
	var n int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d keys, %v; want only the valid request stored", n, err)
	}
}

// switchedPool returns a pool on a fresh database whose connections can be
// cut at once, as when the database server goes away: cut closes every open
// connection and refuses new ones.
func switchedPool(t testing.TB) (*pgxpool.Pool, func()) {
	t.Helper()
	var (
		mu    sync.Mutex
		down  bool
		conns []net.Conn
	)
	pool := pgtest.PoolWith(t, func(cfg *pgxpool.Config) {
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			}
			c, err := dial(ctx, network, addr)
			if err == nil {
				conns = append(conns, c)
			}
			return c, err
		}
	})
	return pool, func() {
		mu.Lock()
		defer mu.Unlock()
		down = true
		for _, c := range conns {
			_ = c.Close()
		}
	}
}

func TestStoreLostMidRunIs503SafeToRetry(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"during the call", "between phases"} {
		t.Run(when, func(t *testing.T) {
			t.Parallel()
			pool, cut := switchedPool(t)
			e := setupPool(t, pool, func(c *phase.Config) {
				c.Hooks = []phase.Hook{phase.InjectorFunc(func(ctx context.Context, at phase.Point) error {
					if when == "between phases" && at == (phase.Point{Phase: "charged", Stage: phase.BeforeTx}) {
						cut()
					}
					return nil
				})}
			})
			if when == "during the call" {
				e.pay.fail = func(string) error { cut(); return nil }
			}
			rec := post(e.handler(t), "k1", `{"item":"lamp","amount":300}`)
			if rec.Code != http.StatusServiceUnavailable || problemType(t, rec) != "store-unavailable" || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("store lost %s: %d %s, want 503 store-unavailable with Retry-After", when, rec.Code, rec.Body.String())
			}
		})
	}
}

func TestHTTPEdges(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.handler(t, func(c *phase.HTTPConfig[order]) { c.MaxBodyBytes = 64 })
	do := func(method, contentType string, keys []string, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "/orders", strings.NewReader(body))
		r.Header.Set("Authorization", "acme")
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		for _, k := range keys {
			r.Header.Add("Idempotency-Key", k)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	valid := `{"item":"lamp","amount":300}`
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		rec := do(m, "", []string{"k1"}, valid)
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != http.MethodPost || problemType(t, rec) != "method-not-allowed" {
			t.Errorf("%s: %d Allow=%q, want 405 with Allow: POST", m, rec.Code, rec.Header().Get("Allow"))
		}
	}
	if rec := do(http.MethodPost, "application/json", []string{"k1"}, valid+strings.Repeat(" ", 100)); rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("padding past the limit: %d %s, want 413", rec.Code, rec.Body.String())
	}
	if rec := do(http.MethodPost, "text/plain", []string{"k1"}, valid); rec.Code != http.StatusUnsupportedMediaType || problemType(t, rec) != "invalid-request" {
		t.Errorf("text/plain: %d %s, want 415", rec.Code, rec.Body.String())
	}
	for _, keys := range [][]string{{"a", "b"}, {"a, b"}, {`"a", "b"`}} {
		if rec := do(http.MethodPost, "", keys, valid); rec.Code != http.StatusBadRequest || problemType(t, rec) != "invalid-idempotency-key" {
			t.Errorf("keys %q: %d %s, want 400", keys, rec.Code, rec.Body.String())
		}
	}
	if rec := do(http.MethodPost, "application/json; charset=utf-8", []string{`"a,b"`}, valid); rec.Code != http.StatusCreated {
		t.Errorf("quoted key with a comma: %d %s, want 201", rec.Code, rec.Body.String())
	}
	var n int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d keys, %v; want only the one valid request stored", n, err)
	}
}

// wantStoreUnavailable fails t unless rec is the answer to an outage: 503
// store-unavailable with Retry-After, so that the client retries.
func wantStoreUnavailable(t testing.TB, what string, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusServiceUnavailable || problemType(t, rec) != "store-unavailable" || rec.Header().Get("Retry-After") == "" {
		t.Errorf("%s: %d %s (Retry-After %q), want 503 store-unavailable with Retry-After",
			what, rec.Code, rec.Body.String(), rec.Header().Get("Retry-After"))
	}
}

// A Tenant or Decode function that cannot reach a store of its own (the
// users table, say) answers as a key store outage does: 503 with the
// store-unavailable type and Retry-After, so a client retries with the
// same key instead of reading it as its own mistake.
func TestTenantAndDecodeOutagesAnswerStoreUnavailable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outage := fmt.Errorf("look up the account: %w: connection refused", phase.ErrUnavailable)
	for name, h := range map[string]http.Handler{
		"tenant": e.handler(t, func(c *phase.HTTPConfig[order]) {
			c.Tenant = func(*http.Request) (string, error) { return "", outage }
		}),
		"decode": e.handler(t, func(c *phase.HTTPConfig[order]) {
			c.Decode = func(*http.Request) (order, error) { return order{}, outage }
		}),
	} {
		wantStoreUnavailable(t, name+" outage", post(h, "k1", `{"item":"lamp","amount":300}`))
	}
	var n int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d keys, %v; want nothing stored", n, err)
	}
}

// The status endpoint finds the tenant as the POST handler does, so the
// same failure of the Tenant function gets the same answer from both: a
// refused tenant is 401, and a users database that has gone away is 503
// with Retry-After, which a poller waits out instead of giving up.
func TestStatusAndPostAnswerATenantLookupAlike(t *testing.T) {
	t.Parallel()
	e := setup(t)
	users, cut := switchedPool(t)
	if _, err := users.Exec(context.Background(), `CREATE TABLE users (token text PRIMARY KEY, account text NOT NULL);
		INSERT INTO users VALUES ('t-acme', 'acme')`); err != nil {
		t.Fatal(err)
	}
	tenant := func(r *http.Request) (string, error) {
		var account string
		err := users.QueryRow(r.Context(), `SELECT account FROM users WHERE token = $1`, r.Header.Get("Authorization")).Scan(&account)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", errors.New("unknown token")
		}
		if err != nil {
			return "", fmt.Errorf("look up the account: %w: %w", phase.ErrUnavailable, err)
		}
		return account, nil
	}
	post := e.handler(t, func(c *phase.HTTPConfig[order]) { c.Tenant = tenant })
	status, err := phase.StatusHandler(e.c, e.w, phase.StatusConfig{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	send := func(h http.Handler, method, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "/orders", strings.NewReader(`{"item":"lamp","amount":300}`))
		r.Header.Set("Authorization", token)
		r.Header.Set("Idempotency-Key", "k1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	endpoints := map[string]func(token string) *httptest.ResponseRecorder{
		"POST":   func(token string) *httptest.ResponseRecorder { return send(post, http.MethodPost, token) },
		"status": func(token string) *httptest.ResponseRecorder { return send(status, http.MethodGet, token) },
	}
	if rec := endpoints["status"]("t-acme"); rec.Code != http.StatusNotFound {
		t.Fatalf("status of an unknown key with a valid token: %d %s, want 404", rec.Code, rec.Body.String())
	}
	for name, send := range endpoints {
		if rec := send("t-nobody"); rec.Code != http.StatusUnauthorized || rec.Header().Get("Retry-After") != "" {
			t.Errorf("%s with a refused token: %d %s (Retry-After %q), want 401 without Retry-After",
				name, rec.Code, rec.Body.String(), rec.Header().Get("Retry-After"))
		}
	}
	cut()
	for name, send := range endpoints {
		wantStoreUnavailable(t, name+" while the users database is down", send("t-acme"))
	}
	var n int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d keys, %v; want nothing stored", n, err)
	}
}

func TestCompleterLeasesWithTheClientsTTL(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	e := setup(t, func(c *phase.Config) {
		c.LeaseTTL = 7 * time.Second
		c.Completer = recovery.CompleterConfig{StuckAfter: -1}
	})
	e.pay.fail = func(string) error { return errBeforeCharge }
	if rec := post(e.handler(t), "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusInternalServerError {
		t.Fatalf("first run: %d", rec.Code)
	}
	e.pay.fail = func(string) error {
		held <- struct{}{}
		<-hold
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = e.c.Complete(context.Background())
	}()
	<-held
	var ttl time.Duration
	err := e.db.QueryRow(context.Background(), `SELECT lock_expires_at - now() FROM idempotency_keys WHERE idempotency_key = 'k1'`).Scan(&ttl)
	close(hold)
	<-done
	if err != nil || ttl <= 5*time.Second || ttl > 7*time.Second {
		t.Fatalf("lease left under the completer: %v %v, want the client's 7s TTL", ttl, err)
	}
}

// TestACallCutShortBeforeItBeginsIsNotMade: the run's context ends (the
// client gave up, or shutdown cancelled the run) after the mark before a
// call that is not safe to repeat, and before the call. The call is not
// made, the key is not held as an unknown outcome, and the retry makes the
// call once.
func TestACallCutShortBeforeItBeginsIsNotMade(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	var calls atomic.Int32
	w := payoutWorkflow(t, func(ctx context.Context) (int32, error) {
		if ctx.Err() != nil {
			return 0, phase.MaybeHappened(ctx.Err()) // as a transport error would say
		}
		return calls.Add(1), nil
	})
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cut := phase.InjectorFunc(func(_ context.Context, at phase.Point) error {
		if at == (phase.Point{Phase: "paid", Stage: phase.InCall}) {
			cancel()
		}
		return nil
	})
	if _, err := w.Run(phase.WithInjector(ctx, cut), c, "acme", "k1", order{}); err == nil || errors.Is(err, phase.ErrOutcomeUnknown) {
		t.Fatalf("run cut short before its call: %v, want an error that is not an unknown outcome", err)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the provider saw %d calls, want none", n)
	}
	row, err := c.Inspect(context.Background(), "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if row.CallPending != "" || row.Hold != "" {
		t.Fatalf("the key keeps pending call %q and hold %q; want neither: the call was not made", row.CallPending, row.Hold)
	}
	out, err := w.Run(context.Background(), c, "acme", "k1", order{})
	if err != nil || out.Kind != phase.OutcomeResumed {
		t.Fatalf("retry: %v, %v; want it resumed", out, err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the provider saw %d calls, want 1", n)
	}
}

// TestStopLetsTheCompletersKeysFinish: Client.Stop during a drain starts no
// other pass, and gives the keys the completer is running until its
// context ends: they finish, none is cut short and left for later, and
// Stop reports no error. A Stop whose context ends first cancels them and
// says so.
func TestStopLetsTheCompletersKeysFinish(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	ctx := context.Background()
	var calls atomic.Int32
	called := make(chan struct{}, 100)
	w, err := phase.NewWorkflow("payout",
		phase.Foreign("paid",
			func(ctx context.Context, in *phase.Input[order, struct{}]) (int32, error) {
				called <- struct{}{}
				select {
				case <-time.After(300 * time.Millisecond):
				case <-ctx.Done():
					return 0, phase.MaybeHappened(ctx.Err())
				}
				return calls.Add(1), nil
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], n int32) (phase.Result, error) {
				return phase.JSON(200, n), nil
			}).Repeatable())
	if err != nil {
		t.Fatal(err)
	}
	cfg := &phase.Config{Logger: quiet, LeaseTTL: time.Second, Completer: recovery.CompleterConfig{StuckAfter: -1,
		Interval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}}
	for i := range 12 {
		crashed := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "paid", Stage: phase.BeforeCall}))
		c, err := phase.NewClient(db, cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Run(crashed, c, "acme", fmt.Sprint("k", i), order{}); !errors.Is(err, phase.ErrCrash) {
			t.Fatalf("crash of key %d: %v", i, err)
		}
	}
	time.Sleep(1100 * time.Millisecond) // the crashed runs' leases run out
	unfinishedClaimed := func() (n int) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE finished_at IS NULL AND attempts > 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	c, err := phase.NewClient(db, cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-called
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatalf("Stop: %v, want the completer's keys finished in time", err)
	}
	if n := unfinishedClaimed(); n != 0 {
		t.Errorf("%d keys the completer claimed were left unfinished by Stop; want none", n)
	}
	if n := calls.Load(); n == 0 {
		t.Fatal("the completer finished no key before Stop")
	}

	// A Stop whose context ends first cancels the keys, and says so.
	for len(called) > 0 {
		<-called
	}
	c, err = phase.NewClient(db, cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-called
	short, cancelShort := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancelShort()
	if err := c.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past its context: %v, want DeadlineExceeded", err)
	}
	// A key cut short by the stop was not the key's failure: no attempt
	// counts towards giving up on it, nor backs it off.
	// Nor is it blamed on the store.
	var (
		cut, counted int
		lastErrors   []string
	)
	if err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE failures > 0), array_agg(coalesce(last_error, ''))
		FROM idempotency_keys WHERE finished_at IS NULL AND attempts > 1`).Scan(&cut, &counted, &lastErrors); err != nil {
		t.Fatal(err)
	}
	if cut == 0 {
		t.Fatal("Stop cut no key short")
	}
	if counted > 0 {
		t.Errorf("%d of the %d keys Stop cut short count a failure; want none", counted, cut)
	}
	for _, e := range lastErrors {
		if strings.Contains(e, phase.ErrUnavailable.Error()) {
			t.Errorf("a key Stop cut short records %q; want it not to blame the store", e)
		}
	}
	// Every key finishes with one more client, each call made once.
	c, err = phase.NewClient(db, cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		if _, err := c.Complete(ctx); err != nil {
			t.Fatal(err)
		}
		var left int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE finished_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := calls.Load(); n != 12 {
		t.Errorf("%d calls answered for 12 keys; want one each", n)
	}
}

// TestAKeyTheCompleterLeftIsDueAtOnceForAnotherProcess: with StuckAfter
// at its default of a minute, a key whose completer's run Stop cut short,
// and one whose completer's run died with its process, are taken by
// another process's completer at once (the second when its lease runs
// out), not a minute later: a completer's claim is no client that may
// retry. The cut run was in the middle of its Repeatable call, which the
// next run sends again under the same downstream key.
func TestAKeyTheCompleterLeftIsDueAtOnceForAnotherProcess(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	ctx := context.Background()
	var (
		block   atomic.Bool
		sent    sync.Map // downstream key → sends
		started = make(chan struct{}, 10)
	)
	block.Store(true)
	w, err := phase.NewWorkflow("payout",
		phase.Foreign("paid",
			func(ctx context.Context, in *phase.Input[order, struct{}]) (string, error) {
				n, _ := sent.LoadOrStore(in.DownstreamKey(), new(atomic.Int32))
				n.(*atomic.Int32).Add(1)
				if block.Load() {
					started <- struct{}{}
					<-ctx.Done()
					return "", phase.MaybeHappened(ctx.Err())
				}
				return "po_1", nil
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], id string) (phase.Result, error) {
				return phase.JSON(200, id), nil
			}).Repeatable())
	if err != nil {
		t.Fatal(err)
	}
	cfg := &phase.Config{Logger: quiet, LeaseTTL: time.Second, Completer: recovery.CompleterConfig{Interval: time.Hour}}
	c, err := phase.NewClient(db, cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	// Two keys a client left an hour ago, before their call.
	for _, key := range []string{"cut", "died"} {
		crashed := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "paid", Stage: phase.BeforeCall}))
		if _, err := w.Run(crashed, c, "acme", key, order{}); !errors.Is(err, phase.ErrCrash) {
			t.Fatalf("crash of %s: %v", key, err)
		}
	}
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET last_run_at = now() - interval '1 hour', lock_expires_at = NULL`); err != nil {
		t.Fatal(err)
	}
	pgtest.TimePassed(t, db)
	// One process's completer takes both, and is stopped in the middle
	// of the calls; the run of "died" is left as a killed process leaves
	// it: its lease held, to run out.
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-started
	<-started
	stopping, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET lock_token = $1 WHERE idempotency_key = 'died'`, uuid.New()); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(stopping); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past its context: %v, want DeadlineExceeded", err)
	}
	block.Store(false)
	// Another process's completer: the cut key at once, the other once
	// its lease has run out, well within the minute of StuckAfter.
	other, err := phase.NewClient(db, cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	r, err := other.Complete(ctx)
	if err != nil || r.Completed != 1 {
		t.Fatalf("the other completer's first passes = %+v, %v; want the cut key completed", r, err)
	}
	time.Sleep(1100 * time.Millisecond)
	pgtest.TimePassed(t, db)
	if r, err = other.Complete(ctx); err != nil || r.Completed != 1 {
		t.Fatalf("the other completer's passes after the lease ran out = %+v, %v; want the other key completed", r, err)
	}
	var failures int
	if err := db.QueryRow(ctx, `SELECT sum(failures) FROM idempotency_keys WHERE finished_at IS NOT NULL`).Scan(&failures); err != nil || failures != 0 {
		t.Errorf("the keys count %d failures (%v); want none", failures, err)
	}
	// One downstream key per key, each sent by the cut run and the next.
	keys := 0
	sent.Range(func(k, n any) bool {
		keys++
		if got := n.(*atomic.Int32).Load(); got != 2 {
			t.Errorf("downstream key %v sent %d times; want twice: the cut send and the one after", k, got)
		}
		return true
	})
	if keys != 2 {
		t.Errorf("%d downstream keys; want one for each of the 2 keys", keys)
	}
}

// TestStopWithNothingToCancelReturnsNil: Stop reports its context's error
// only when it cancelled something; a client with no run in flight and
// its completer between passes stops cleanly whatever the context. The
// reaper is off: its first pass, run at Start, has no hook to wait on, and
// a Stop that cut it would rightly report the context's error; it shares
// the completer's loop, which this test covers.
func TestStopWithNothingToCancelReturnsNil(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	w := payoutWorkflow(t, func(ctx context.Context) (int32, error) { return 1, nil })
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 20 {
		passed := make(chan struct{}, 1)
		c, err := phase.NewClient(db, &phase.Config{Logger: quiet, Completer: recovery.CompleterConfig{Interval: time.Hour},
			Reaper: recovery.ReaperConfig{Interval: -1}, Hooks: []phase.Hook{passDone{passed: passed}}}, w)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		<-passed
		time.Sleep(20 * time.Millisecond) // the pass returns to wait for the next
		if err := c.Stop(ended); err != nil {
			t.Fatalf("Stop %d of an idle client with an ended context: %v, want nil", i, err)
		}
		if err := c.Stop(ended); err != nil {
			t.Fatalf("second Stop %d: %v, want nil", i, err)
		}
		if err := c.Start(context.Background()); !errors.Is(err, phase.ErrStopped) {
			t.Fatalf("Start after Stop: %v, want ErrStopped", err)
		}
	}
}

// TestStopCutsACountShortWithoutAnError: the completer's count of its
// keys, under way when Stop comes with an ended context, is cancelled,
// and Stop reports nothing: a count loses nothing when cut.
func TestStopCutsACountShortWithoutAnError(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	ctx := context.Background()
	w := payoutWorkflow(t, func(ctx context.Context) (int32, error) { return 1, nil })
	lock, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE atomicphase_backlog_samples IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	passed := make(chan struct{}, 1)
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet, Completer: recovery.CompleterConfig{Interval: time.Hour},
		Reaper: recovery.ReaperConfig{Interval: -1}, Hooks: []phase.Hook{passDone{passed: passed}}}, w)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-passed
	for waiting := 0; waiting == 0; time.Sleep(10 * time.Millisecond) {
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%atomicphase_backlog_samples%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Stop(ended); err != nil {
		t.Fatalf("Stop with an ended context during a count: %v, want nil", err)
	}
}

// TestARunCutShortByStopIsNotBlamedOnTheStore: a run that Stop cancels in
// a phase's statement is told the process is stopping and to retry
// (ErrStopped and ErrUnavailable; the HTTP handler answers 503
// shutting-down with Retry-After), and its error, which the key records,
// says the process stopped rather than that the store was down.
func TestARunCutShortByStopIsNotBlamedOnTheStore(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"Run", "Handler"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			db := pgtest.Pool(t)
			inPhase := make(chan struct{})
			w := stallWorkflow(t, func() { close(inPhase) })
			c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
			if err != nil {
				t.Fatal(err)
			}
			h, err := phase.Handler(c, w, phase.HTTPConfig[order]{
				Tenant: func(*http.Request) (string, error) { return "acme", nil }})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			ran := make(chan error, 1)
			answered := make(chan *httptest.ResponseRecorder, 1)
			go func() {
				if via == "Handler" {
					answered <- post(h, "k1", `{"item":"lamp","amount":300}`)
					return
				}
				_, err := w.Run(ctx, c, "acme", "k1", order{})
				ran <- err
			}()
			<-inPhase
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if err := c.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Stop: %v, want DeadlineExceeded", err)
			}
			if via == "Handler" {
				rec := <-answered
				if rec.Code != http.StatusServiceUnavailable || problemType(t, rec) != phase.ProblemShuttingDown || rec.Header().Get("Retry-After") == "" {
					t.Fatalf("the cut request was answered %d %s (Retry-After %q); want 503 %s with Retry-After",
						rec.Code, rec.Body.String(), rec.Header().Get("Retry-After"), phase.ProblemShuttingDown)
				}
			} else {
				err = <-ran
				if !errors.Is(err, phase.ErrStopped) || !errors.Is(err, phase.ErrUnavailable) || strings.Contains(err.Error(), phase.ErrUnavailable.Error()) {
					t.Fatalf("the cut run ended with %q; want ErrStopped and ErrUnavailable, saying the process stopped", err)
				}
			}
			row, err := c.Inspect(ctx, "acme", "k1")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(row.LastError, "stopping") || row.LeaseLeft != 0 {
				t.Fatalf("the key records %q, its lease %v left; want the stop named and the lease freed", row.LastError, row.LeaseLeft)
			}
		})
	}
}

// stallWorkflow returns a workflow of one local phase, stalled, that calls
// enter and then stalls in a statement until its context ends.
func stallWorkflow(t *testing.T, enter func()) *phase.Workflow[order, struct{}] {
	t.Helper()
	w, err := phase.NewWorkflow("stall", phase.Local("stalled", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
		enter()
		// A phase stuck on a lock held elsewhere, or a slow query.
		_, err := tx.Exec(ctx, `SELECT pg_sleep(60)`)
		return phase.JSON(200, "late"), err
	}))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// passDone is a pass wrapper that signals each pass's end on passed.
type passDone struct {
	phase.HookDefaults
	passed chan struct{}
}

func (p passDone) WrapPass(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error) {
	defer func() {
		select {
		case p.passed <- struct{}{}:
		default:
		}
	}()
	return next(ctx)
}

// payoutWorkflow returns a workflow of a local phase, created, and a
// foreign phase, paid, that is not safe to repeat and calls call.
func payoutWorkflow(t *testing.T, call func(ctx context.Context) (int32, error)) *phase.Workflow[order, struct{}] {
	t.Helper()
	w, err := phase.NewWorkflow("payout",
		phase.Local("created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			return phase.Next(), nil
		}),
		phase.Foreign("paid",
			func(ctx context.Context, in *phase.Input[order, struct{}]) (int32, error) { return call(ctx) },
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], n int32) (phase.Result, error) {
				return phase.JSON(200, n), nil
			}))
	if err != nil {
		t.Fatal(err)
	}
	return w
}
