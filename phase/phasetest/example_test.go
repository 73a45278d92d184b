package phasetest_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/recovery"
)

// This file is what a service's own test looks like: an orders workflow
// (the service's code), and one test that proves it converges under every
// crash and every pair of faults, on a database of its own.

func TestMain(m *testing.M) { phasetest.Main(m) }

func TestOrdersConverge(t *testing.T) {
	pool := phasetest.Pool(t) // a new, migrated database; see phasetest.EnvDSN
	if _, err := pool.Exec(t.Context(), ordersSchema); err != nil {
		t.Fatal(err)
	}
	orders := newOrders(pool)
	client, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, orders) // take free keys at once
	if err != nil {
		t.Fatal(err)
	}
	cfg := phasetest.Config[Order, OrderState]{
		Client: client, DB: pool, Workflow: orders, WithCompleter: true,
		Request: func(string) Order { return Order{Item: "lamp", Amount: 2000} },
		Compare: phasetest.IgnoreFields("order_id"), // a new order id for every key
		Check: func(t testing.TB, s phasetest.Scenario) { // one order, one charge
			var orders, charges int
			err := pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM orders WHERE key_id = $1), (SELECT count(*) FROM charges WHERE key_id = $1)`, s.ID).Scan(&orders, &charges)
			if err != nil || orders != 1 || charges != 1 {
				t.Fatalf("%d orders and %d charges (%v), want one of each", orders, charges, err)
			}
		},
	}
	phasetest.CrashMatrix(t, cfg)
	phasetest.PairMatrix(t, cfg)
}

// TestAddingAFraudCheckIsSafeForOrdersInFlight is the test of a deploy that
// adds a phase before the charge: every order the old code left at any
// point is finished by the new code, which adopts the old definition, with
// one order and one charge, and a fraud check for every order not charged
// before the deploy.
func TestAddingAFraudCheckIsSafeForOrdersInFlight(t *testing.T) {
	pool := phasetest.Pool(t)
	if _, err := pool.Exec(t.Context(), ordersSchema); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	fast := recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}
	before := newOrders(pool)
	old, err := phase.NewClient(pool, &phase.Config{Logger: log, Completer: fast}, before)
	if err != nil {
		t.Fatal(err)
	}
	after := newOrders(pool, phase.Local("fraud_checked", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, OrderState]) (phase.Result, error) {
		_, err := tx.Exec(ctx, `UPDATE orders SET item = item WHERE id = $1`, in.State.OrderID) // the check reads the order
		return phase.Next(), err
	}))
	if err := after.Adopt("orders", before.Definition(), nil); err != nil {
		t.Fatal(err)
	}
	upgraded, err := phase.NewClient(pool, &phase.Config{Logger: log, Completer: fast}, after)
	if err != nil {
		t.Fatal(err)
	}
	request := func(string) Order { return Order{Item: "lamp", Amount: 2000} }
	check := func(t testing.TB, s phasetest.Scenario) {
		var orders, charges int
		err := pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM orders WHERE key_id = $1), (SELECT count(*) FROM charges WHERE key_id = $1)`, s.ID).Scan(&orders, &charges)
		if err != nil || orders != 1 || charges != 1 {
			t.Fatalf("%d orders and %d charges (%v), want one of each", orders, charges, err)
		}
	}
	phasetest.UpgradeMatrix(t,
		phasetest.Config[Order, OrderState]{Client: old, DB: pool, Workflow: before, Request: request},
		phasetest.Config[Order, OrderState]{Client: upgraded, DB: pool, Workflow: after, Request: request,
			WithCompleter: true, Compare: phasetest.IgnoreFields("order_id"), Check: check})
}

// Order is the request of the service's POST /orders.
type Order struct {
	Item   string `json:"item"`
	Amount int    `json:"amount"`
}

// OrderState is what the order's phases pass on to each other.
type OrderState struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id"`
}

// ordersSchema holds the service's orders, linked to their idempotency key,
// and, for the example, the payment provider's charges: one per
// idempotency key the provider is sent.
const ordersSchema = `
CREATE TABLE orders (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key_id    uuid UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL,
    item      text NOT NULL,
    amount    int NOT NULL,
    charge_id text
);
CREATE TABLE charges (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text NOT NULL UNIQUE,
    key_id          uuid NOT NULL,
    amount          int NOT NULL
)`

// newOrders declares the service's workflow: the order row; one charge,
// through a provider that honours idempotency keys; and the response. The
// declaration is fixed, so an error in it is a bug, found by any test.
func newOrders(pool *pgxpool.Pool, beforeCharge ...phase.Phase[Order, OrderState]) *phase.Workflow[Order, OrderState] {
	type run = phase.Input[Order, OrderState]
	phases := []phase.Phase[Order, OrderState]{
		phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			err := tx.QueryRow(ctx, `INSERT INTO orders (key_id, item, amount) VALUES ($1, $2, $3) RETURNING id`,
				in.ID, in.Req.Item, in.Req.Amount).Scan(&in.State.OrderID)
			return phase.Next(), err
		}),
	}
	phases = append(phases, beforeCharge...)
	w, err := phase.NewWorkflow("orders", append(phases,
		phase.Foreign("charged",
			func(ctx context.Context, in *run) (string, error) {
				return charge(ctx, pool, in.DownstreamKey(), in.ID, in.Req.Amount)
			},
			func(ctx context.Context, tx pgx.Tx, in *run, chargeID string) (phase.Result, error) {
				in.State.ChargeID = chargeID
				_, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $2 WHERE id = $1`, in.State.OrderID, chargeID)
				return phase.Next(), err
			}).Repeatable(),
		phase.Local("confirmed", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, map[string]any{
				"order_id": in.State.OrderID, "item": in.Req.Item, "amount": in.Req.Amount,
			}), nil
		}),
	)...)
	if err != nil {
		panic(err)
	}
	return w
}

// charge stands for the payment provider's API: a second request with the
// same idempotency key returns the first one's charge.
func charge(ctx context.Context, pool *pgxpool.Pool, idempotencyKey string, keyID uuid.UUID, amount int) (string, error) {
	var id string
	err := pool.QueryRow(ctx, `
		INSERT INTO charges (idempotency_key, key_id, amount) VALUES ($1, $2, $3)
		ON CONFLICT (idempotency_key) DO UPDATE SET amount = charges.amount
		RETURNING 'ch_' || id`, idempotencyKey, keyID, amount).Scan(&id)
	return id, err
}
