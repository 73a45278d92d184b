package phase_test

import (
	"bytes"
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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// These tests deploy a changed definition of a checkout workflow while keys
// are in flight: a second client on the same database stands for the
// process running the new code.

type checkoutReq struct {
	Amount int `json:"amount"`
}

type checkoutState struct {
	Charge  string `json:"charge"`
	Receipt string `json:"receipt"`
	Checked bool   `json:"checked"`
}

// provider is a fake downstream service. One that honours idempotency keys
// acts once per key; one that ignores them acts on every call.
type provider struct {
	honours bool
	mu      sync.Mutex
	effects int
	byKey   map[string]string
}

func newProvider(honours bool) *provider {
	return &provider{honours: honours, byKey: map[string]string{}}
}

func (p *provider) call(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.byKey[key]; ok && p.honours {
		return id
	}
	p.effects++
	id := fmt.Sprintf("fx_%d", p.effects)
	p.byKey[key] = id
	return id
}

// lookup tells whether a call under key happened, as a reconcile function
// asks a provider.
func (p *provider) lookup(key string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.byKey[key]
	return id, ok
}

func (p *provider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.effects
}

// shop is what every definition of the checkout workflow shares.
type shop struct {
	charges  *provider // honours keys: Repeatable
	receipts *provider // ignores keys: not Repeatable
	checks   atomic.Int32
}

func newShop() *shop { return &shop{charges: newProvider(true), receipts: newProvider(false)} }

// checkoutDef says how a definition differs from the first one.
type checkoutDef struct {
	name       string // workflow name; "checkout" when empty
	charge     string // the charge phase's name; "charged" when empty
	formerly   string // the charge phase's former name
	fraudCheck bool   // a fraud check before the charge
	reconciled bool   // the receipt phase has a reconcile function
	noReceipt  bool   // no receipt phase
}

func (s *shop) workflow(t *testing.T, d checkoutDef) *phase.Workflow[checkoutReq, checkoutState] {
	t.Helper()
	type run = phase.Input[checkoutReq, checkoutState]
	name := d.name
	if name == "" {
		name = "checkout"
	}
	chargeName := d.charge
	if chargeName == "" {
		chargeName = "charged"
	}
	phases := []phase.Phase[checkoutReq, checkoutState]{
		phase.Local("reserved", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.Next(), nil
		}),
	}
	if d.fraudCheck {
		phases = append(phases, phase.Local("fraud_checked", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			s.checks.Add(1)
			in.State.Checked = true
			return phase.Next(), nil
		}))
	}
	charge := phase.Foreign(chargeName,
		func(ctx context.Context, in *run) (string, error) { return s.charges.call(in.DownstreamKey()), nil },
		func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
			in.State.Charge = id
			return phase.Next(), nil
		}).Repeatable()
	if d.formerly != "" {
		charge = charge.Formerly(d.formerly)
	}
	record := func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
		in.State.Receipt = id
		return phase.Next(), nil
	}
	receipt := phase.Foreign("receipt_sent",
		func(ctx context.Context, in *run) (string, error) { return s.receipts.call(in.DownstreamKey()), nil }, record)
	if d.reconciled {
		receipt = phase.Reconciled(receipt, func(ctx context.Context, in *run) (string, phase.Verdict, error) {
			if id, ok := s.receipts.lookup(in.DownstreamKey()); ok {
				return id, phase.Happened, nil
			}
			return "", phase.NotHappened, nil
		}, record)
	}
	phases = append(phases, charge)
	if !d.noReceipt {
		phases = append(phases, receipt)
	}
	phases = append(phases,
		phase.Local("responded", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, map[string]any{"charge": in.State.Charge, "receipt": in.State.Receipt, "checked": in.State.Checked}), nil
		}))
	w, err := phase.NewWorkflow(name, phases...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// process is one deployment's client over the shared database.
func process(t *testing.T, db *pgxpool.Pool, workflows ...phase.Registered) *phase.Client {
	t.Helper()
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet,
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1, MaxAttempts: 2}}, workflows...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// crash runs key under w on c until the injected crash at p, and frees the
// dead process's lease.
func crash(t *testing.T, c *phase.Client, w *phase.Workflow[checkoutReq, checkoutState], key string, p phase.Point) {
	t.Helper()
	ctx := context.Background()
	if _, err := w.Run(phase.WithInjector(ctx, phase.CrashAt(p)), c, "acme", key, checkoutReq{Amount: 2000}); !errors.Is(err, phase.ErrCrash) {
		t.Fatalf("run crashing at %v: %v", p, err)
	}
	if _, err := c.Unlock(ctx, "acme", key); err != nil {
		t.Fatal(err)
	}
}

func retry(t *testing.T, c *phase.Client, w *phase.Workflow[checkoutReq, checkoutState], key string) *phase.Outcome {
	t.Helper()
	out, err := w.Run(context.Background(), c, "acme", key, checkoutReq{Amount: 2000})
	if err != nil {
		t.Fatalf("retry of %s: %v", key, err)
	}
	return out
}

// checkout posts acme's checkout request with key k1 to w's handler on c,
// with ctx.
func checkout(ctx context.Context, t *testing.T, c *phase.Client, w *phase.Workflow[checkoutReq, checkoutState]) *httptest.ResponseRecorder {
	t.Helper()
	h, err := phase.Handler(c, w, phase.HTTPConfig[checkoutReq]{Tenant: func(*http.Request) (string, error) { return "acme", nil }})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/checkout", strings.NewReader(`{"amount":2000}`))
	req.Header.Set("Idempotency-Key", "k1")
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req.WithContext(ctx))
	return rec
}

func inspect(t *testing.T, c *phase.Client, key string) *keyrow.Row {
	t.Helper()
	row, err := c.Inspect(context.Background(), "acme", key)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

func TestRenamingAForeignPhaseWithFormerlyKeepsItsDownstreamKey(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	s := newShop()
	v1 := s.workflow(t, checkoutDef{})
	crash(t, process(t, db, v1), v1, "k1", phase.Point{Phase: "charged", Stage: phase.AfterCall})
	if s.charges.count() != 1 {
		t.Fatalf("%d charges before the deploy, want 1", s.charges.count())
	}

	renamed := s.workflow(t, checkoutDef{charge: "card_charged", formerly: "charged"})
	if renamed.Definition() != v1.Definition() {
		t.Fatalf("a rename declared with Formerly changed the definition: %s -> %s", v1.Definition(), renamed.Definition())
	}
	c2 := process(t, db, renamed)
	if out := retry(t, c2, renamed, "k1"); out.Kind != phase.OutcomeResumed {
		t.Fatalf("retry after the rename: %v", out.Kind)
	}
	if n := s.charges.count(); n != 1 {
		t.Fatalf("%d charges after the renamed phase resumed the key, want 1: the downstream key changed", n)
	}
}

func TestAnUndeclaredRenameLeavesKeysToTheirDefinition(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	s := newShop()
	v1 := s.workflow(t, checkoutDef{})
	c1 := process(t, db, v1)
	crash(t, c1, v1, "k1", phase.Point{Phase: "charged", Stage: phase.AfterCall})

	renamed := s.workflow(t, checkoutDef{charge: "card_charged"})
	if renamed.Definition() == v1.Definition() {
		t.Fatal("renaming a phase without Formerly kept the definition")
	}
	c2 := process(t, db, renamed)
	out := retry(t, c2, renamed, "k1")
	if out.Kind != phase.OutcomeElsewhere || out.Definition != v1.Definition() || out.RetryAfter <= 0 {
		t.Fatalf("retry under the renamed definition: %+v, want OutcomeElsewhere naming %s with a Retry-After", out, v1.Definition())
	}
	if res, err := c2.Complete(context.Background()); err != nil || res.Claimed != 0 {
		t.Fatalf("the new process's completer: %+v %v, want it to leave the old key alone", res, err)
	}
	if n := s.charges.count(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	// The old definition, still registered somewhere, finishes the key.
	if res, err := c1.Complete(context.Background()); err != nil || res.Completed != 1 {
		t.Fatalf("the old process's completer: %+v %v", res, err)
	}
	if row := inspect(t, c1, "k1"); row.FinishedAt == nil || s.charges.count() != 1 {
		t.Fatalf("key %s, %d charges; want it finished with one charge", row.RecoveryPoint, s.charges.count())
	}
}

func TestARollingDeployNeverSkipsANewPhase(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	s := newShop()
	v1 := s.workflow(t, checkoutDef{})
	v2 := s.workflow(t, checkoutDef{fraudCheck: true})
	old, upgraded := process(t, db, v1), process(t, db, v2)
	ctx := context.Background()

	// A key v2 started: the old process neither resumes it on a retry nor
	// claims it in its completer.
	crash(t, upgraded, v2, "started-on-v2", phase.Point{Phase: "reserved", Stage: phase.AfterCommit})
	if out := retry(t, old, v1, "started-on-v2"); out.Kind != phase.OutcomeElsewhere {
		t.Fatalf("v1 retry of a v2 key: %v, want OutcomeElsewhere", out.Kind)
	}
	if res, err := old.Complete(ctx); err != nil || res.Claimed != 0 {
		t.Fatalf("v1 completer: %+v %v, want the v2 key left alone", res, err)
	}
	if s.charges.count() != 0 {
		t.Fatal("the v1 process charged a key started under v2, without its fraud check")
	}
	if res, err := upgraded.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("v2 completer: %+v %v", res, err)
	}
	if s.checks.Load() != 1 || s.charges.count() != 1 {
		t.Fatalf("%d fraud checks, %d charges; want one of each", s.checks.Load(), s.charges.count())
	}

	// A key v1 started, at a point before the new phase's position: the v2
	// process does not run it under v2 unless told how.
	crash(t, old, v1, "started-on-v1", phase.Point{Phase: "reserved", Stage: phase.AfterCommit})
	if out := retry(t, upgraded, v2, "started-on-v1"); out.Kind != phase.OutcomeElsewhere {
		t.Fatalf("v2 retry of a v1 key: %v, want OutcomeElsewhere", out.Kind)
	}
	// Declaring the adoption runs the rest of v2 from the key's point, the
	// fraud check included.
	adopting := s.workflow(t, checkoutDef{fraudCheck: true})
	if err := adopting.Adopt("checkout", v1.Definition(), nil); err != nil {
		t.Fatal(err)
	}
	c3 := process(t, db, adopting)
	out := retry(t, c3, adopting, "started-on-v1")
	if out.Kind != phase.OutcomeResumed || !strings.Contains(string(out.Response.Body), `"checked":true`) {
		t.Fatalf("retry under the adopting definition: %v %s", out.Kind, out.Response.Body)
	}
	if row := inspect(t, c3, "started-on-v1"); row.Definition != adopting.Definition() {
		t.Fatalf("adopted key records definition %q, want %q", row.Definition, adopting.Definition())
	}
	if s.checks.Load() != 2 || s.charges.count() != 2 {
		t.Fatalf("%d fraud checks, %d charges; want two of each over two keys", s.checks.Load(), s.charges.count())
	}
}

func TestKeepingTheOldDefinitionRegisteredDrainsItsKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	s := newShop()
	v1 := s.workflow(t, checkoutDef{})
	crash(t, process(t, db, v1), v1, "k1", phase.Point{Phase: "charged", Stage: phase.AfterCall})
	v2 := s.workflow(t, checkoutDef{fraudCheck: true})
	both := process(t, db, v2, v1)
	// A request to the new handler finds the key under v1 and runs v1's
	// remaining phases, from the stored request.
	out := retry(t, both, v2, "k1")
	if out.Kind != phase.OutcomeResumed || strings.Contains(string(out.Response.Body), `"checked":true`) {
		t.Fatalf("retry: %v %s, want the key finished under v1", out.Kind, out.Response.Body)
	}
	if s.charges.count() != 1 || s.checks.Load() != 0 {
		t.Fatalf("%d charges, %d checks; want one charge and no check", s.charges.count(), s.checks.Load())
	}
	// New keys run under v2.
	if out := retry(t, both, v2, "k2"); !strings.Contains(string(out.Response.Body), `"checked":true`) {
		t.Fatalf("new key: %s, want it run under v2", out.Response.Body)
	}
}

func TestAKeyAtAPointTheNewDefinitionLacksIsNotBuried(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	s := newShop()
	v2 := s.workflow(t, checkoutDef{fraudCheck: true})
	func() {
		// The crashed handler aborts as a killed process would.
		defer func() { _ = recover() }()
		checkout(phase.WithInjector(context.Background(), phase.CrashAt(phase.Point{Phase: "fraud_checked", Stage: phase.AfterCommit})),
			t, process(t, db, v2), v2)
	}()

	// v3 removes the fraud check and adopts v2 without saying where keys
	// at the removed phase go.
	v3 := s.workflow(t, checkoutDef{})
	if err := v3.Adopt("checkout", v2.Definition(), nil); err != nil {
		t.Fatal(err)
	}
	c3 := process(t, db, v3)
	if _, err := c3.Unlock(context.Background(), "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	rec := checkout(context.Background(), t, c3, v3)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" ||
		!strings.Contains(rec.Body.String(), "definition-unavailable") {
		t.Fatalf("retry: %d %q %s, want 503 definition-unavailable with Retry-After", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	for range 3 {
		res, err := c3.Complete(context.Background())
		if err != nil || res.Failed != 0 || res.Dead != 0 {
			t.Fatalf("completer: %+v %v, want the key handed back, not failed or buried", res, err)
		}
	}
	row := inspect(t, c3, "k1")
	if row.RecoveryPoint != "fraud_checked" || row.Hold != "" || row.Failures != 0 || row.Definition != v2.Definition() {
		t.Fatalf("key at %s, hold %q, %d failures, definition %s; want it untouched", row.RecoveryPoint, row.Hold, row.Failures, row.Definition)
	}

	// Naming where the removed phase's keys go finishes them.
	v3b := s.workflow(t, checkoutDef{})
	if err := v3b.Adopt("checkout", v2.Definition(), map[string]string{"fraud_checked": "reserved"}); err != nil {
		t.Fatal(err)
	}
	c3b := process(t, db, v3b)
	if res, err := c3b.Complete(context.Background()); err != nil || res.Completed != 1 {
		t.Fatalf("completer with the move: %+v %v", res, err)
	}
	if s.charges.count() != 1 || s.checks.Load() != 1 {
		t.Fatalf("%d charges, %d checks after the move; want one of each (the check before the deploy)", s.charges.count(), s.checks.Load())
	}
}

// A key dies inside the receipt's call, which is not safe to repeat; the
// next definition removes the receipt and adopts the old one.
func TestAKeyHeldInsideARemovedPhasesCallIsResolvedUnderTheAdoptingDefinition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	s := newShop()
	v1 := s.workflow(t, checkoutDef{})
	c1 := process(t, db, v1)
	func() {
		// The crashed handler aborts as a killed process would.
		defer func() { _ = recover() }()
		checkout(phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "receipt_sent", Stage: phase.AfterCall})), t, c1, v1)
	}()
	if _, err := c1.Unlock(ctx, "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	v2 := s.workflow(t, checkoutDef{noReceipt: true})
	if err := v2.Adopt("checkout", v1.Definition(), nil); err != nil {
		t.Fatal(err)
	}
	c2 := process(t, db, v2)
	post := func() *httptest.ResponseRecorder { return checkout(ctx, t, c2, v2) }

	// The client is told the request waits, never that a retry completes it.
	first := post()
	if first.Code != http.StatusServiceUnavailable || strings.Contains(first.Body.String(), "exactly once") ||
		!strings.Contains(first.Body.String(), "operator") {
		t.Fatalf("retry under the new definition: %d %s; want 503 saying the request waits, without promising completion", first.Code, first.Body)
	}
	if again := post(); again.Code != http.StatusConflict || !strings.Contains(again.Body.String(), "operator") {
		t.Fatalf("later retry: %d %s; want 409 saying the request waits for an operator", again.Code, again.Body)
	}
	row := inspect(t, c2, "k1")
	if row.Hold != keyrow.HoldUnknown || row.CallPending != "receipt_sent" || row.RecoveryPoint != "charged" {
		t.Fatalf("key: hold %q, call pending %q, at %s; want held as unknown inside the receipt's call", row.Hold, row.CallPending, row.RecoveryPoint)
	}

	// Nothing in the new definition can record the receipt's output.
	_, err := c2.Resolve(ctx, "acme", "k1", keyrow.Resolution{RecoveryPoint: "charged", Happened: true, Output: json.RawMessage(`"rc_1"`)}, row.Seen())
	if !errors.Is(err, phase.ErrInvalidResolution) || !strings.Contains(err.Error(), "Retry") || !strings.Contains(err.Error(), "definition") {
		t.Fatalf("resolve as happened = %v; want ErrInvalidResolution pointing to the old definition and Retry", err)
	}
	// That the call did not happen lets the key go on without it.
	row, err = c2.Resolve(ctx, "acme", "k1", keyrow.Resolution{RecoveryPoint: "charged"}, row.Seen())
	if err != nil {
		t.Fatal(err)
	}
	if row.RecoveryPoint != keyrow.Finished || row.Hold != "" || row.CallPending != "" {
		t.Fatalf("after resolving as not happened: at %s, hold %q, call pending %q; want finished", row.RecoveryPoint, row.Hold, row.CallPending)
	}
	if s.charges.count() != 1 || s.receipts.count() != 1 {
		t.Fatalf("%d charges, %d receipts; want the one of each sent before the deploy, none again", s.charges.count(), s.receipts.count())
	}
	if done := post(); done.Code != http.StatusCreated {
		t.Fatalf("retry after the resolution: %d %s; want the stored response", done.Code, done.Body)
	}
}

func TestARenamedWorkflowAdoptsItsKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	s := newShop()
	v1 := s.workflow(t, checkoutDef{})
	c1 := process(t, db, v1)
	first := retry(t, c1, v1, "finished")
	crash(t, c1, v1, "unfinished", phase.Point{Phase: "charged", Stage: phase.AfterCall})

	v2 := s.workflow(t, checkoutDef{name: "checkout_v2"})
	if err := v2.Adopt("checkout", v1.Definition(), nil); err != nil {
		t.Fatal(err)
	}
	c2 := process(t, db, v2)
	if out := retry(t, c2, v2, "finished"); out.Kind != phase.OutcomeReplayed || !bytes.Equal(out.Response.Body, first.Response.Body) {
		t.Fatalf("retry of a finished key under the new name: %v, want its replay", out.Kind)
	}
	if out := retry(t, c2, v2, "unfinished"); out.Kind != phase.OutcomeResumed {
		t.Fatalf("retry of an unfinished key under the new name: %v, want it resumed", out.Kind)
	}
	// And again, now that it carries the new definition.
	if out := retry(t, c2, v2, "unfinished"); out.Kind != phase.OutcomeReplayed {
		t.Fatalf("second retry: %v, want a replay", out.Kind)
	}
	if n := s.charges.count(); n != 2 {
		t.Fatalf("%d charges over two keys, want 2", n)
	}
	// A workflow that adopts nothing still refuses another workflow's key.
	other := s.workflow(t, checkoutDef{name: "refunds"})
	if out := retry(t, process(t, db, other), other, "finished"); out.Kind != phase.OutcomeMismatch {
		t.Fatalf("another workflow's key: %v, want a mismatch", out.Kind)
	}
}

// postJSON sends body under key to h and returns the recorded answer.
func postJSON(h http.Handler, key, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/checkout", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	return rec
}

func TestARequestTypeThatGainsAFieldKeepsEveryKey(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	s := newShop()
	tenant := phase.HTTPConfig[checkoutReq]{Tenant: func(*http.Request) (string, error) { return "acme", nil }}
	v1 := s.workflow(t, checkoutDef{})
	c1 := process(t, db, v1)
	h1, err := phase.Handler(c1, v1, tenant)
	if err != nil {
		t.Fatal(err)
	}
	const body = "{\"amount\": 2000}\n"
	first := postJSON(h1, "k1", body)
	if first.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", first.Code, first.Body)
	}

	// The deploy adds a field without omitempty to the request type.
	type checkoutReq2 struct {
		Amount int    `json:"amount"`
		Coupon string `json:"coupon"`
	}
	type run2 = phase.Input[checkoutReq2, checkoutState]
	v2, err := phase.NewWorkflow("checkout",
		phase.Local("reserved", func(ctx context.Context, tx pgx.Tx, in *run2) (phase.Result, error) { return phase.Next(), nil }),
		phase.Foreign("charged",
			func(ctx context.Context, in *run2) (string, error) { return s.charges.call(in.DownstreamKey()), nil },
			func(ctx context.Context, tx pgx.Tx, in *run2, id string) (phase.Result, error) {
				in.State.Charge = id
				return phase.Next(), nil
			}).Repeatable(),
		phase.Foreign("receipt_sent",
			func(ctx context.Context, in *run2) (string, error) { return s.receipts.call(in.DownstreamKey()), nil },
			func(ctx context.Context, tx pgx.Tx, in *run2, id string) (phase.Result, error) {
				in.State.Receipt = id
				return phase.Next(), nil
			}),
		phase.Local("responded", func(ctx context.Context, tx pgx.Tx, in *run2) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, map[string]any{"charge": in.State.Charge}), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c2 := process(t, db, v2)
	h2, err := phase.Handler(c2, v2, phase.HTTPConfig[checkoutReq2]{Tenant: tenant.Tenant})
	if err != nil {
		t.Fatal(err)
	}
	again := postJSON(h2, "k1", body)
	if again.Code != first.Code || again.Body.String() != first.Body.String() || again.Header().Get(phase.ReplayedHeader) != "true" {
		t.Fatalf("byte-identical retry after the deploy: %d %s, want the replay of %d %s", again.Code, again.Body, first.Code, first.Body)
	}
	// The same request spelled differently is the same request; another
	// payload is still refused.
	if rec := postJSON(h2, "k1", "{ \"amount\" : 2000 }"); rec.Code != first.Code {
		t.Fatalf("retry with other whitespace: %d %s", rec.Code, rec.Body)
	}
	if rec := postJSON(h2, "k1", `{"amount":2001}`); rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("retry with another amount: %d, want 422", rec.Code)
	}
	if n := s.charges.count(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

func TestKeysStoredBeforeDefinitionsKeepTheirReplayAndResume(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	ctx := context.Background()
	s := newShop()
	v1 := s.workflow(t, checkoutDef{})
	c := process(t, db, v1)
	h, err := phase.Handler(c, v1, phase.HTTPConfig[checkoutReq]{Tenant: func(*http.Request) (string, error) { return "acme", nil }})
	if err != nil {
		t.Fatal(err)
	}
	// Rows as the library wrote them before definitions were recorded: the
	// fingerprint of the workflow name and the re-encoded request, and an
	// empty definition (the migration's default).
	params, _ := json.Marshal(checkoutReq{Amount: 2000})
	fp, err := keyrow.Fingerprint("checkout", params)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
    recovery_point, finished_at, response_status, response_headers, response_body)
VALUES ('acme', 'old-finished', 'checkout', $1, $2, 'finished', now(), 201, '{"Content-Type":["application/json"]}', 'stored'),
       ('acme', 'old-unfinished', 'checkout', $1, $2, 'charged', NULL, NULL, NULL, NULL)`, fp[:], params)
	if err != nil {
		t.Fatal(err)
	}
	if rec := postJSON(h, "old-finished", `{"amount":2000}`); rec.Code != 201 || rec.Body.String() != "stored" {
		t.Fatalf("retry of a finished key stored before definitions: %d %s, want its replay", rec.Code, rec.Body)
	}
	if rec := postJSON(h, "old-unfinished", `{"amount":2000}`); rec.Code != 201 {
		t.Fatalf("retry of an unfinished key stored before definitions: %d %s, want it resumed", rec.Code, rec.Body)
	}
	if rec := postJSON(h, "old-unfinished", `{"amount":2000}`); rec.Code != 201 || rec.Header().Get(phase.ReplayedHeader) != "true" {
		t.Fatalf("second retry: %d %s, want a replay", rec.Code, rec.Body)
	}
	if rec := postJSON(h, "old-finished", `{"amount":1}`); rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("another payload under an old key: %d, want 422", rec.Code)
	}
	if s.charges.count() != 0 || s.receipts.count() != 1 {
		t.Fatalf("%d charges, %d receipts; want the old key to resume after its charge", s.charges.count(), s.receipts.count())
	}
}

func TestACallThatIsNotRepeatableIsNeverSentTwiceAfterACrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		reconciled bool
		at         phase.Stage
		// receipts is how many receipts go out in all; hold is the key's
		// hold after the retry.
		receipts int
		hold     keyrow.Hold
	}{
		{"reconciled, crash after the call", true, phase.AfterCall, 1, ""},
		{"reconciled, crash before the call", true, phase.InCall, 1, ""},
		{"no reconcile, crash after the call", false, phase.AfterCall, 1, keyrow.HoldUnknown},
		{"no reconcile, crash before the call", false, phase.InCall, 0, keyrow.HoldUnknown},
		// A crash before the mark: nothing can have been sent.
		{"no reconcile, crash before the mark", false, phase.BeforeCall, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.Pool(t)
			s := newShop()
			w := s.workflow(t, checkoutDef{reconciled: tc.reconciled})
			c := process(t, db, w)
			crash(t, c, w, "k1", phase.Point{Phase: "receipt_sent", Stage: tc.at})
			_, err := w.Run(context.Background(), c, "acme", "k1", checkoutReq{Amount: 2000})
			if tc.hold != "" && !errors.Is(err, phase.ErrOutcomeUnknown) {
				t.Fatalf("retry: %v, want ErrOutcomeUnknown", err)
			}
			if tc.hold == "" && err != nil {
				t.Fatalf("retry: %v", err)
			}
			if n := s.receipts.count(); n != tc.receipts {
				t.Fatalf("%d receipts sent, want %d", n, tc.receipts)
			}
			row := inspect(t, c, "k1")
			if row.Hold != tc.hold || (tc.hold == "") != (row.FinishedAt != nil) {
				t.Fatalf("key: hold %q, finished %v; want hold %q", row.Hold, row.FinishedAt != nil, tc.hold)
			}
			if tc.hold != "" {
				// The completer leaves it on hold too.
				if _, err := c.Complete(context.Background()); err != nil {
					t.Fatal(err)
				}
				if s.receipts.count() != tc.receipts {
					t.Fatal("the completer sent the receipt again")
				}
			}
		})
	}
}

func TestACallThatFailedForSureIsSentAgain(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	refused := true
	var sent atomic.Int32
	type run = phase.Input[checkoutReq, checkoutState]
	w, err := phase.NewWorkflow("notify",
		phase.Foreign("sent",
			func(ctx context.Context, in *run) (int32, error) {
				if refused {
					return 0, errors.New("mail server refused the message")
				}
				return sent.Add(1), nil
			},
			func(ctx context.Context, tx pgx.Tx, in *run, n int32) (phase.Result, error) {
				return phase.JSON(200, n), nil
			}))
	if err != nil {
		t.Fatal(err)
	}
	c := process(t, db, w)
	ctx := context.Background()
	if _, err := w.Run(ctx, c, "acme", "k1", checkoutReq{}); err == nil {
		t.Fatal("refused call: want an error")
	}
	refused = false
	out, err := w.Run(ctx, c, "acme", "k1", checkoutReq{})
	if err != nil || out.Kind != phase.OutcomeResumed || sent.Load() != 1 {
		t.Fatalf("retry: %v %v, %d sent; want the call made once", out, err, sent.Load())
	}
}

func TestACallThatIsNotRepeatableCostsOneMarkingStatement(t *testing.T) {
	t.Parallel()
	db, counter := pgtest.CountingPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	s := newShop()
	w := s.workflow(t, checkoutDef{})
	c := process(t, db, w)
	retry(t, c, w, "warm-up")
	counter.Reset()
	retry(t, c, w, "k1")
	marks := 0
	for _, q := range counter.SQL() {
		if strings.Contains(q, "call_pending = $4") {
			marks++
		}
	}
	// acquire (1); reserved: the fenced write alone (1); charged
	// (Repeatable): no renewal, its record alone (1); receipt_sent: the
	// mark (1) and its record alone (1); responded: the finish alone (1).
	if marks != 1 || counter.RoundTrips() != 6 {
		t.Fatalf("%d marks, %d round trips; want 1 and 6: %q", marks, counter.RoundTrips(), counter.SQL())
	}
}
