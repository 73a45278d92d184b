package caller_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// The caller's header names are the library's.
func TestHeaderNamesAreTheLibrarys(t *testing.T) {
	t.Parallel()
	if caller.KeyHeader != keyrow.HeaderName || caller.ReplayedHeader != phase.ReplayedHeader {
		t.Fatalf("caller sends %s and reads %s; the handler reads %s and sends %s",
			caller.KeyHeader, caller.ReplayedHeader, keyrow.HeaderName, phase.ReplayedHeader)
	}
}

type order struct {
	Amount int `json:"amount"`
}

type orderState struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id"`
}

// shop is an atomicphase endpoint on real Postgres: an order row, one
// charge at a provider that deduplicates on the downstream key, and a 201.
type shop struct {
	pool    *pgxpool.Pool
	url     string
	mu      sync.Mutex
	charges map[string]int // calls per downstream key
}

// newShop returns the shop; with accept, it answers 202 once the order row
// is committed and serves the status at /orders/status/{key}.
func newShop(t *testing.T, injector phase.Injector, accept ...bool) *shop {
	t.Helper()
	ctx := context.Background()
	s := &shop{pool: pgtest.Pool(t), charges: map[string]int{}}
	if _, err := s.pool.Exec(ctx, `CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount int NOT NULL, charge text)`); err != nil {
		t.Fatal(err)
	}
	w, err := phase.NewWorkflow("orders",
		phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			return phase.Next(), tx.QueryRow(ctx, `INSERT INTO orders (amount) VALUES ($1) RETURNING id`, in.Req.Amount).Scan(&in.State.OrderID)
		}),
		phase.Foreign("charged",
			func(ctx context.Context, in *phase.Input[order, orderState]) (string, error) {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.charges[in.DownstreamKey()]++
				return "ch_" + in.DownstreamKey(), nil
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState], id string) (phase.Result, error) {
				in.State.ChargeID = id
				_, err := tx.Exec(ctx, `UPDATE orders SET charge = $2 WHERE id = $1`, in.State.OrderID, id)
				return phase.JSON(http.StatusCreated, in.State), err
			}).Repeatable(),
	)
	if err != nil {
		t.Fatal(err)
	}
	var hooks []phase.Hook
	if injector != nil {
		hooks = append(hooks, injector)
	}
	client, err := phase.NewClient(s.pool, &phase.Config{LeaseTTL: time.Second, Hooks: hooks,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, w)
	if err != nil {
		t.Fatal(err)
	}
	tenant := func(r *http.Request) (string, error) { return "acme", nil }
	cfg := phase.HTTPConfig[order]{Tenant: tenant}
	if len(accept) > 0 && accept[0] {
		cfg.AcceptAfter = "order_created"
		cfg.StatusLocation = func(r *http.Request, key string) string { return "/orders/status/" + key }
	}
	h, err := phase.Handler(client, w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	status, err := phase.StatusHandler(client, w, phase.StatusConfig{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", h)
	mux.Handle("GET /orders/status/{key}", status)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// effects counts the orders and the charges made.
func (s *shop) effects(t *testing.T) (orders, charges int) {
	t.Helper()
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The provider deduplicates on the downstream key: a repeated call is
	// no second charge.
	return orders, len(s.charges)
}

// loseAnswers is a transport that loses the answers of the attempts lose
// picks after the server sent them, as a network that breaks at the worst
// moment does.
type loseAnswers struct {
	base http.RoundTripper
	n    atomic.Int64
	lose func(n int64) bool
}

var errLost = errors.New("connection reset after the request was sent")

func (l *loseAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(req)
	if err == nil && l.lose(l.n.Add(1)) {
		drain(resp)
		return nil, errLost
	}
	return resp, err
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
}

func testTransport(t *testing.T) *http.Transport {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func TestHandlerAnswerLostAfterTheWorkIsReplayed(t *testing.T) {
	t.Parallel()
	s := newShop(t, nil)
	c := newClient(t, caller.Config{Transport: &loseAnswers{base: testTransport(t), lose: func(n int64) bool { return n == 1 }}})
	res, body := do(t, c, post(t, s.url+"/orders", `{"amount":500}`))
	if res.StatusCode != http.StatusCreated || !res.Replayed || res.Attempts != 2 {
		t.Fatalf("answer %d %s, Replayed %v, Attempts %d; want a replayed 201 on attempt 2", res.StatusCode, body, res.Replayed, res.Attempts)
	}
	if orders, charges := s.effects(t); orders != 1 || charges != 1 {
		t.Fatalf("%d orders and %d charges, want one of each", orders, charges)
	}
}

// The server crashes after the charge, before recording it: the attempt gets
// no answer, the retries get 409 while the crashed run's lease lasts, and
// then one resumes the request; the charge is made once.
func TestHandlerCrashAfterTheChargeIsResumed(t *testing.T) {
	t.Parallel()
	s := newShop(t, phase.CrashAt(phase.Point{Phase: "charged", Stage: phase.AfterCall}))
	var statuses []int
	c := newClient(t, caller.Config{Observe: func(a caller.Attempt) { statuses = append(statuses, a.Status) },
		BaseDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MaxAttempts: 50})
	res, body := do(t, c, post(t, s.url+"/orders", `{"amount":500}`))
	if res.StatusCode != http.StatusCreated || res.Replayed {
		t.Fatalf("answer %d %s, Replayed %v; want the resumed run's 201", res.StatusCode, body, res.Replayed)
	}
	if statuses[0] != 0 || statuses[1] != http.StatusConflict {
		t.Fatalf("attempts' statuses %v: want no answer, then 409 while the lease lasts", statuses)
	}
	if orders, charges := s.effects(t); orders != 1 || charges != 1 {
		t.Fatalf("%d orders and %d charges, want one of each", orders, charges)
	}
}

// Copies of one request sent at once under one key, as a double click
// sends them, all end with the same answer, and the work is done once.
func TestHandlerConcurrentCopiesGetOneAnswer(t *testing.T) {
	t.Parallel()
	s := newShop(t, nil)
	var conflicts atomic.Int64
	c := newClient(t, caller.Config{Observe: func(a caller.Attempt) {
		if a.Status == http.StatusConflict {
			conflicts.Add(1)
		}
	}, BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxAttempts: 100})
	key, err := caller.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	const copies = 8
	answers := make([]string, copies)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() {
			req := post(t, s.url+"/orders", `{"amount":500}`)
			req.Header.Set(caller.KeyHeader, key)
			res, err := c.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			answers[i] = fmt.Sprint(res.StatusCode, " ", read(t, res))
		})
	}
	wg.Wait()
	for i, a := range answers {
		if a != answers[0] || a == "" {
			t.Fatalf("copy %d answered %q, copy 0 %q", i, a, answers[0])
		}
	}
	if orders, charges := s.effects(t); orders != 1 || charges != 1 {
		t.Fatalf("%d orders and %d charges, want one of each", orders, charges)
	}
	t.Logf("%d copies, %d 409s retried", copies, conflicts.Load())
}

// The handler's refusals are final: a key reused for another request
// (422) and a body that is not JSON (400) are answered once.
func TestHandlerRefusalsAreNotRetried(t *testing.T) {
	t.Parallel()
	s := newShop(t, nil)
	c := newClient(t, caller.Config{})
	res, _ := do(t, c, post(t, s.url+"/orders", `{"amount":500}`))
	for _, tc := range []struct {
		name, key, body string
		status          int
	}{
		{"key reused", res.Key, `{"amount":700}`, http.StatusUnprocessableEntity},
		{"not JSON", "", `{"amount":`, http.StatusBadRequest},
	} {
		req := post(t, s.url+"/orders", tc.body)
		if tc.key != "" {
			req.Header.Set(caller.KeyHeader, tc.key)
		}
		res, _ := do(t, c, req)
		if res.StatusCode != tc.status || res.Attempts != 1 {
			t.Errorf("%s: answer %d after %d attempts, want %d after 1", tc.name, res.StatusCode, res.Attempts, tc.status)
		}
	}
	if orders, charges := s.effects(t); orders != 1 || charges != 1 {
		t.Fatalf("%d orders and %d charges, want one of each", orders, charges)
	}
}

// A phase that fails answers 500 and stores nothing: the retry resumes the
// request after its last committed phase, and the charge is made once.
func TestHandler500IsRetriedAndResumes(t *testing.T) {
	t.Parallel()
	var failed atomic.Bool
	s := newShop(t, phase.InjectorFunc(func(ctx context.Context, at phase.Point) error {
		if at == (phase.Point{Phase: "charged", Stage: phase.AfterCall}) && failed.CompareAndSwap(false, true) {
			return errors.New("the charge's answer could not be parsed")
		}
		return nil
	}))
	var statuses []int
	c := newClient(t, caller.Config{Observe: func(a caller.Attempt) { statuses = append(statuses, a.Status) }})
	res, body := do(t, c, post(t, s.url+"/orders", `{"amount":500}`))
	if res.StatusCode != http.StatusCreated || res.Replayed || res.Attempts != 2 || statuses[0] != http.StatusInternalServerError {
		t.Fatalf("answer %d %s after attempts %v; want 500, then the resumed run's 201", res.StatusCode, body, statuses)
	}
	if orders, charges := s.effects(t); orders != 1 || charges != 1 {
		t.Fatalf("%d orders and %d charges, want one of each", orders, charges)
	}
}

// A handler that accepts the request (202) and charges in the background:
// the caller polls the status location and returns the final answer.
func TestHandlerAcceptedRequestIsFollowedToItsAnswer(t *testing.T) {
	t.Parallel()
	s := newShop(t, nil, true)
	var seen []caller.Attempt
	c := newClient(t, caller.Config{Observe: func(a caller.Attempt) { seen = append(seen, a) }})
	res, body := do(t, c, post(t, s.url+"/orders", `{"amount":500}`))
	if res.StatusCode != http.StatusCreated || !strings.Contains(body, "charge_id") {
		t.Fatalf("answer %d %s, want the final 201", res.StatusCode, body)
	}
	if seen[0].Status != http.StatusAccepted || res.Request.Method != http.MethodGet ||
		res.Request.URL.Path != "/orders/status/"+res.Key {
		t.Fatalf("attempts %+v ending with %s %s: want a 202, then polls of the status", seen, res.Request.Method, res.Request.URL)
	}
	if orders, charges := s.effects(t); orders != 1 || charges != 1 {
		t.Fatalf("%d orders and %d charges, want one of each", orders, charges)
	}
}
