package phase_test

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
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// payments is a fake payment provider that honours idempotency keys and
// counts calls and charges per key, so tests can prove "one effect per key".
type payments struct {
	mu      sync.Mutex
	calls   map[string]int
	charges map[string]charge // by downstream key
	// fail, when set, decides the fate of a call: errBeforeCharge fails it
	// before any effect; errAfterCharge makes the charge and then loses the
	// answer, as a timeout would.
	fail  func(key string) error
	delay time.Duration
}

type charge struct {
	ID      string
	OrderID int64
	Amount  int
}

var (
	errBeforeCharge = errors.New("provider refused the connection")
	errAfterCharge  = errors.New("provider timed out after accepting the charge")
)

func newPayments() *payments {
	return &payments{calls: map[string]int{}, charges: map[string]charge{}}
}

func (p *payments) Charge(ctx context.Context, key string, orderID int64, amount int) (string, error) {
	if p.delay > 0 {
		select {
		case <-time.After(p.delay):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[key]++
	var failure error
	if p.fail != nil {
		failure = p.fail(key)
	}
	if errors.Is(failure, errHang) {
		// A provider that never answers: the call ends only with ctx.
		p.mu.Unlock()
		<-ctx.Done()
		p.mu.Lock()
		return "", ctx.Err()
	}
	if errors.Is(failure, errBeforeCharge) {
		return "", failure
	}
	c, seen := p.charges[key]
	if !seen {
		c = charge{ID: fmt.Sprintf("ch_%d", len(p.charges)+1), OrderID: orderID, Amount: amount}
		p.charges[key] = c
	}
	if failure != nil {
		return "", phase.MaybeHappened(failure)
	}
	return c.ID, nil
}

// chargesFor counts the charges made for an order.
func (p *payments) chargesFor(orderID int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.charges {
		if c.OrderID == orderID {
			n++
		}
	}
	return n
}

func (p *payments) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

type order struct {
	Item   string `json:"item"`
	Amount int    `json:"amount"`
	// Express orders skip the packing phase.
	Express bool `json:"express,omitempty"`
}

type orderState struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id"`
}

const ordersSchema = `
CREATE TABLE orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ikey        text NOT NULL UNIQUE,
    item        text NOT NULL,
    amount      int NOT NULL,
    charge_id   text,
    packed      boolean NOT NULL DEFAULT false,
    receipt     boolean NOT NULL DEFAULT false
)`

// ordersWorkflow is a small three-phase workflow (four with packing): an order
// row, one foreign charge, and a receipt with the response.
func ordersWorkflow(t testing.TB, pay *payments) *phase.Workflow[order, orderState] {
	t.Helper()
	w, err := phase.NewWorkflow("orders",
		phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			if in.Req.Amount <= 0 {
				return phase.JSON(http.StatusUnprocessableEntity, map[string]string{"error": "amount must be positive"}), nil
			}
			err := tx.QueryRow(ctx, `INSERT INTO orders (ikey, item, amount) VALUES ($1, $2, $3) RETURNING id`,
				in.Key, in.Req.Item, in.Req.Amount).Scan(&in.State.OrderID)
			return phase.Next(), err
		}),
		phase.Foreign("charged",
			func(ctx context.Context, in *phase.Input[order, orderState]) (string, error) {
				return pay.Charge(ctx, in.DownstreamKey(), in.State.OrderID, in.Req.Amount)
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState], chargeID string) (phase.Result, error) {
				in.State.ChargeID = chargeID
				_, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $2 WHERE id = $1`, in.State.OrderID, chargeID)
				return phase.Next(), err
			}).Repeatable(),
		phase.Local("packed", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			_, err := tx.Exec(ctx, `UPDATE orders SET packed = true WHERE id = $1`, in.State.OrderID)
			return phase.Next(), err
		}).When(func(in *phase.Input[order, orderState]) bool { return !in.Req.Express }),
		phase.Local("receipt_sent", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, orderState]) (phase.Result, error) {
			if _, err := tx.Exec(ctx, `UPDATE orders SET receipt = true WHERE id = $1`, in.State.OrderID); err != nil {
				return phase.Result{}, err
			}
			return phase.JSON(http.StatusCreated, map[string]any{"message": "order placed", "item": in.Req.Item, "amount": in.Req.Amount}), nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

type env struct {
	db     *pgxpool.Pool
	pay    *payments
	w      *phase.Workflow[order, orderState]
	c      *phase.Client
	events *phasetest.Events
}

// setup returns a migrated database with the orders table, a fake provider,
// the orders workflow and a client; mutate adjusts the client's config.
func setup(t testing.TB, mutate ...func(*phase.Config)) *env {
	t.Helper()
	return setupPool(t, pgtest.Pool(t), mutate...)
}

func setupPool(t testing.TB, db *pgxpool.Pool, mutate ...func(*phase.Config)) *env {
	t.Helper()
	if _, err := db.Exec(context.Background(), ordersSchema); err != nil {
		t.Fatal(err)
	}
	e := &env{db: db, pay: newPayments(), events: &phasetest.Events{}}
	e.w = ordersWorkflow(t, e.pay)
	cfg := phase.Config{Hooks: []phase.Hook{e.events}, Logger: quiet}
	for _, m := range mutate {
		m(&cfg)
	}
	c, err := phase.NewClient(db, &cfg, e.w)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	return e
}

func (e *env) handler(t testing.TB, mutate ...func(*phase.HTTPConfig[order])) http.Handler {
	t.Helper()
	cfg := phase.HTTPConfig[order]{
		Tenant: func(r *http.Request) (string, error) {
			if u := r.Header.Get("Authorization"); u != "" {
				return u, nil
			}
			return "", errors.New("send your account id in Authorization")
		},
	}
	for _, m := range mutate {
		m(&cfg)
	}
	h, err := phase.Handler(e.c, e.w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func post(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	r.Header.Set("Authorization", "acme")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func (e *env) orderCount(t testing.TB, key string) (orders int, orderID int64) {
	t.Helper()
	err := e.db.QueryRow(context.Background(), `SELECT count(*), coalesce(max(id), 0) FROM orders WHERE ikey = $1`, key).Scan(&orders, &orderID)
	if err != nil {
		t.Fatal(err)
	}
	return orders, orderID
}
